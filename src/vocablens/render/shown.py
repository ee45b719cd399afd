"""The one renderer table: for every kind of :class:`vocablens.handle.Result`, its
:class:`~vocablens.render.renderer.Renderer` (``to_json``, ``table``, ``figure``, ``frame``), each
defined in the module named for the kind (``argmax`` in :mod:`vocablens.render.argmax`, ``explain`` in
:mod:`vocablens.render.vocab_space.explain` ...) beside that kind's own tables, figures and report
section. The CLI prints with these, the report draws with them and the explorer answers with them.

A result (duck-typed: ``kind``, ``value``, ``tokenizer``, ``provenance``, ``options``) is rendered as

* :func:`to_json`: the dict ``vocablens COMMAND --json`` prints for the same call;
* :func:`print_result`: what the command prints, on a rich console (the CLI's stdout console);
* :func:`table`: the same renderables gathered in a ``rich.console.Group``;
* :func:`to_html` / :func:`to_text`: those renderables as a notebook shows them
  (:mod:`vocablens.render.notebook`'s recording console);
* :func:`figure`: the plotly figure the report or the explorer draws;
* :func:`to_pandas`: one row per item of a tabular result (:func:`rows_of`).

This module never imports the handle (it sits above render); it reads the result's fields.
"""

from __future__ import annotations

import functools
from typing import Any

from vocablens.errors import BadInput
from vocablens.render import (
    align, anatomy, anomaly, argmax, backward, bottleneck, decompose, generate, jacobian_fit, lens, lens_compare,
    lens_eval, lens_merge, lens_train, neighbors, pca, report, score, steer, surgery, tie_check, trajectory, undertrained,
)
from vocablens.render.json import json_ready
from vocablens.render.renderer import Renderer, draw
from vocablens.render.vocab_space import explain, project, settle

#: kind -> its renderers, one entry per kind of result (:mod:`vocablens.handle.results`)
RENDERERS: dict[str, Renderer] = {m.RENDERER.kind: m.RENDERER for m in (
    anatomy, tie_check, neighbors, pca, lens, score, explain, project, settle, lens_compare, backward, jacobian_fit,
    decompose, argmax, undertrained, generate, steer, surgery, trajectory, bottleneck, align, anomaly, lens_train,
    lens_eval, report, lens_merge)}


def _entry(r) -> Renderer:
    try:
        return RENDERERS[r.kind]
    except KeyError:
        raise TypeError(f"vocablens has no renderer for results of kind {r.kind!r}") from None


def to_json(r) -> dict:
    """The ``--json`` dict of the matching command (NaN/inf -> None, tensors -> lists)."""
    return json_ready(_entry(r).to_json(r))


def print_result(r, out) -> None:
    """Print ``r`` on the rich console ``out`` as the matching command prints it."""
    _entry(r).table(r, out)


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
    fig = _entry(r).figure
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
    :attr:`~vocablens.render.renderer.Renderer.frame`).

    Raises:
        BadInput: a result that is not tabular.
    """
    rows = _entry(r).frame
    if rows is None:
        raise BadInput(f"{_article(r.kind)} {r.kind} result is not tabular; .to_json() holds its data")
    return rows(r)


def _article(word: str) -> str:
    """``an`` before a vowel, else ``a``: the article a message puts before ``word``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


__all__ = ["RENDERERS", "figure", "print_result", "rows_of", "table", "to_html", "to_json", "to_pandas", "to_text"]
