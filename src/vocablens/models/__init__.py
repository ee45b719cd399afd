"""Layer 1: everything that knows about model families, files and the default model.

Modules: ``spec`` (where a spec points), ``config`` (a config without weights, meta models),
``catalogue`` (built-in configs), ``provenance``, ``gguf_cache``, ``loading`` (:func:`load`),
``borders`` (the family adapter), ``unembed`` (the one unembedding), ``blocks``, ``tokens``,
``dtypes`` (the one dtype table), ``flops`` (attention shape and FLOP counts), ``loader``
(``load_mode``: every loading mode), ``tie`` ("tied" by storage, as transformers decides it),
``hooks`` (``ModelPatch``: whatever vocablens installs on a model, put back exactly).
"""

from vocablens.models.borders import Borders
from vocablens.models.rows import untrained_rows
from vocablens.models.config import load_config
from vocablens.models.loading import LoadedModel, load
from vocablens.models.provenance import Provenance, gguf_provenance
from vocablens.models.spec import DEFAULT_MODEL, default_gguf_path, resolve_spec

__all__ = [
    "Borders", "untrained_rows", "DEFAULT_MODEL", "LoadedModel", "Provenance", "default_gguf_path",
    "gguf_provenance", "load", "load_config", "resolve_spec",
]
