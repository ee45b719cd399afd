"""The renderers behind :class:`vocablens.handle.Result`: one entry per kind of result, the same
functions the CLI prints with, the report draws with and the explorer answers with.

A result (duck-typed: ``kind``, ``value``, ``tokenizer``, ``provenance``, ``options``) is rendered as

* :func:`to_json`: the dict ``vocablens COMMAND --json`` prints for the same call;
* :func:`print_result`: what the command prints, on a rich console (the CLI's stdout console);
* :func:`table`: the same renderables gathered in a ``rich.console.Group``;
* :func:`to_html` / :func:`to_text`: those renderables as a notebook shows them
  (:mod:`vocablens.render.notebook`'s recording console);
* :func:`figure`: the plotly figure the report or the explorer draws;
* :func:`to_pandas`: one row per item of a tabular result.

This module never imports the handle (it sits above render); it reads the result's fields.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from vocablens.errors import BadInput
from vocablens.render.frames import ROWS
from vocablens.render.json import json_ready
from vocablens.render.shown_clients import RENDERERS as CLIENT_RENDERERS
from vocablens.render.shown_lenses import RENDERERS as LENS_RENDERERS
from vocablens.render.printed import (
    print_anatomy, print_argmax, print_explain, print_generate, print_lens, print_neighbors, print_pca,
    print_project, print_score, print_settle, print_steer, print_surgery, print_tie_check, print_undertrained,
)
from vocablens.render.result_figures import FIGURES, draw


def _model(r) -> dict:
    return {"model": r.provenance.to_dict()} if r.provenance is not None else {}


# ------------------------------------------------------------------------------------------- JSON
def _json_anatomy(r):
    from vocablens.render.anatomy import anatomy_json

    return anatomy_json([r.value])


def _json_neighbors(r):
    from vocablens.render.geometry import neighbors_to_dict

    return {**neighbors_to_dict(r.value, r.tokenizer), **_model(r)}


def _json_lens(r):
    from vocablens.render.lens import lens_batch_json, lens_json

    if r.options.get("batch"):
        return lens_batch_json(r.value, r.tokenizer, r.provenance, r.options.get("lenses"))
    return lens_json(r.value[0], r.tokenizer, r.provenance, r.options.get("lenses"))


def _json_score(r):
    from vocablens.render.ops import score_to_dict

    return {**score_to_dict(r.value, r.tokenizer), **_model(r)}


def _json_explain(r):
    from vocablens.render.vocab_space import explanation_to_dict

    return {**explanation_to_dict(r.value, r.tokenizer), **_model(r)}


def _json_project(r):
    from vocablens.render import vocab_space as rv

    how = r.options.get("how", "vectors")
    if how == "search":
        d = rv.search_to_dict(r.value, r.tokenizer, r.options.get("tops"))
    elif how == "interpretable":
        d = rv.interpretable_to_dict(r.value, r.tokenizer)
    elif how == "circuit":
        d = rv.circuit_to_dict(r.value, r.tokenizer)
    else:
        d = rv.vectors_to_dict(r.value, r.tokenizer)
    return {**d, **_model(r)}


def _json_settle(r):
    from vocablens.render.vocab_space import settle_to_dict

    d = settle_to_dict(r.value)
    d.update({"corpus": r.options.get("corpus"), "plot": r.options.get("plot"), **_model(r)})
    return d


def _json_argmax(r):
    from vocablens.render.argmax import argmax_to_dict

    return {**argmax_to_dict(r.value, r.tokenizer), **_model(r)}


def _json_undertrained(r):
    from vocablens.render.undertrained import undertrained_to_dict

    return {**undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts")), **_model(r)}


def _json_generate(r):
    from vocablens.render.generate import generation_to_dict

    return generation_to_dict(r.value, r.tokenizer)


def _json_steer(r):
    from vocablens.render.steer import steer_to_dict

    o = r.options
    return steer_to_dict(o["sets"], o["rows"], r.value, r.tokenizer, top_n=o["top_n"], scale=o["scale"],
                         suppress_mode=o["suppress_mode"], saved=o.get("saved"), provenance=r.provenance)


def _json_surgery(r):
    from vocablens.render.surgery import expand_to_dict, trim_to_dict

    o = r.options
    if o["command"] == "expand":
        return {**expand_to_dict(r.value, o["verification"], o.get("out"), r.provenance), "indicator": o["indicator"]}
    drop = o.get("drop")
    return {**trim_to_dict(r.value, o["verification"], o.get("out"), o.get("corpus"), o["docs_checked"],
                           o["mismatches"], r.provenance), "undertrained": None if drop is None else drop.to_dict()}


def _json_plain(r):
    return json_ready(r.value.to_dict())


def _json_pca(r):
    wp = r.value
    return {"words": list(wp.words), "groups": list(wp.groups), "skipped": list(wp.skipped), "matrix": wp.matrix,
            "coords": json_ready(wp.pca.coords), "explained_variance": json_ready(wp.pca.explained_variance)}


#: kind -> (to_json, print)
_SHOWN: dict[str, tuple[Callable, Callable]] = {
    "anatomy": (_json_anatomy, print_anatomy),
    "tie_check": (_json_plain, print_tie_check),
    "neighbors": (_json_neighbors, print_neighbors),
    "pca": (_json_pca, print_pca),
    "lens": (_json_lens, print_lens),
    "score": (_json_score, print_score),
    "explain": (_json_explain, print_explain),
    "project": (_json_project, print_project),
    "settle": (_json_settle, print_settle),
    "argmax": (_json_argmax, print_argmax),
    "undertrained": (_json_undertrained, print_undertrained),
    "generate": (_json_generate, print_generate),
    "steer": (_json_steer, print_steer),
    "surgery": (_json_surgery, print_surgery),
}

#: kind -> (to_json, print, figure or None, rows or None): every renderer of a kind of result
#: (figures: :data:`vocablens.render.result_figures.FIGURES`; rows: :data:`vocablens.render.frames.ROWS`)
RENDERERS: dict[str, tuple[Callable, Callable, Callable | None, Callable | None]] = {
    k: (j, p, FIGURES.get(k), ROWS.get(k)) for k, (j, p) in {**_SHOWN, **CLIENT_RENDERERS}.items()}
RENDERERS.update(LENS_RENDERERS)  # lens compare, backward lens, Jacobian fit: all four in one place


def _entry(r) -> tuple:
    try:
        return RENDERERS[r.kind]
    except KeyError:
        raise TypeError(f"vocablens has no renderer for results of kind {r.kind!r}") from None


def to_json(r) -> dict:
    """The ``--json`` dict of the matching command (NaN/inf -> None, tensors -> lists)."""
    return json_ready(_entry(r)[0](r))


def print_result(r, out) -> None:
    """Print ``r`` on the rich console ``out`` as the matching command prints it."""
    _entry(r)[1](r, out)


class _Collect:
    """A console stand-in that keeps what is printed on it (strings as ``Text`` with their style)."""

    def __init__(self) -> None:
        self.items: list = []

    def print(self, *objects: Any, style: str | None = None, **_: Any) -> None:
        from rich.text import Text

        for o in objects:
            self.items.append(Text(o, style=style or "") if isinstance(o, str) else o)


def table(r):
    """The renderables the command prints, in a ``rich.console.Group`` that also prints as text with the
    built-in ``print`` (its ``str()``: the tables as plain text)."""
    c = _Collect()
    print_result(r, c)
    return _tables()(*c.items)


@functools.cache
def _tables() -> type:
    """The class of what ``.table()`` returns, defined on first use (rich is imported only when a result
    is shown)."""
    from rich.console import Group

    class Tables(Group):
        """What a command prints, as one ``rich.console.Group``: ``rich``'s ``Console.print`` draws it
        with its styles; ``str()`` (so the built-in ``print``, and ``repr`` at a prompt) gives the same
        tables as plain text, :data:`vocablens.render.notebook.WIDTH` columns wide."""

        def __str__(self) -> str:
            from vocablens.render.notebook import recording_console

            console = recording_console()
            console.print(self)
            return console.export_text().rstrip("\n")

        __repr__ = __str__

    return Tables


def _recorded(r):
    from vocablens.render.notebook import recording_console

    console = recording_console()
    print_result(r, console)
    return console


def to_html(r) -> str:
    """The notebook's HTML of ``r``: the printed renderables in a ``<pre>`` with inline styles."""
    from vocablens.render.notebook import PRE

    return _recorded(r).export_html(inline_styles=True, code_format=PRE)


def to_text(r) -> str:
    """The same as plain text (terminal IPython)."""
    return _recorded(r).export_text()


def figure(r, **options):
    """The plotly figure of ``r``, as the report or the explorer draws it
    (:data:`RENDERERS`; ``options``: the lens trajectories' ``colour``).

    Raises:
        BadInput: none is drawn for this kind of result, or an option its figure does not take.
    """
    fig = _entry(r)[2]
    if fig is None:
        raise BadInput(f"no figure is drawn for {_article(r.kind)} {r.kind} result; .table() shows it")
    return draw(fig, r, **options)


def to_pandas(r):
    """A ``pandas.DataFrame`` of :func:`rows_of`, one row per item of the result.

    Raises:
        BadInput: pandas missing (the ``pandas`` extra), or a result that is not tabular.
    """
    rows = rows_of(r)
    try:
        import pandas as pd
    except ImportError:
        raise BadInput("to_pandas needs pandas: pip install 'vocablens[pandas]'") from None
    return pd.DataFrame(rows)


def rows_of(r) -> list[dict]:
    """The rows :func:`to_pandas` builds its frame from (plain dicts; no pandas needed;
    :data:`vocablens.render.frames.ROWS`).

    Raises:
        BadInput: a result that is not tabular.
    """
    rows = _entry(r)[3]
    if rows is None:
        raise BadInput(f"{_article(r.kind)} {r.kind} result is not tabular; .to_json() holds its data")
    return rows(r)


def _article(word: str) -> str:
    """``an`` before a vowel, else ``a``: the article a message puts before ``word``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


__all__ = ["RENDERERS", "figure", "print_result", "rows_of", "table", "to_html", "to_json", "to_pandas", "to_text"]
