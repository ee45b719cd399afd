"""Rendering of vocabulary-space results: JSON-ready dicts, rich tables, plotly figures, report sections.

Computes nothing: every number comes from a :mod:`vocablens.vocab_space` result.
One module per kind of result, each registering its renderers (:data:`vocablens.render.shown.RENDERERS`):
:mod:`.project` renders value/key vectors, reverse searches, interpretable vectors and head circuits;
:mod:`.explain` one prediction explained; :mod:`.settle` where predictions settle.
"""

from vocablens.render.vocab_space.project import (
    circuit_table, circuit_to_dict, interpretable_table, interpretable_to_dict, search_table, search_to_dict,
    search_vectors, value_vectors_report_section, value_vectors_section, vectors_table, vectors_to_dict,
)
from vocablens.render.vocab_space.explain import (
    attribution_figure, explanation_footer, explanation_section, explanation_tables, explanation_to_dict,
)
from vocablens.render.vocab_space.settle import (
    settle_figure, settle_section, settle_tables, settle_to_dict, write_settle_plot,
)

__all__ = [
    "attribution_figure", "circuit_table", "circuit_to_dict", "explanation_footer", "explanation_section", "explanation_tables",
    "explanation_to_dict", "interpretable_table", "interpretable_to_dict", "search_table", "search_to_dict",
    "search_vectors", "settle_figure", "settle_section", "settle_tables", "settle_to_dict",
    "value_vectors_report_section", "value_vectors_section", "vectors_table", "vectors_to_dict",
    "write_settle_plot",
]
