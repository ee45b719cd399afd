"""Building blocks of the self-contained HTML report: sections and inlined plotly figures.

Every report section is a :class:`Section`; ``figure_html`` turns a plotly figure into a ``<div>``
without the plotly library (the report inlines plotly.js once, so it opens with no network).
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    """One part of the report.

    Attributes:
        id: anchor id (letters, digits, dashes).
        title: heading text.
        html: body (trusted HTML made by vocablens; escape user text with :func:`esc`).
    """

    id: str
    title: str
    html: str


def esc(text) -> str:
    """HTML-escape any text (tokens, prompts, paths)."""
    return _html.escape(str(text), quote=True)


def figure_html(fig, div_id: str) -> str:
    """A plotly figure as a ``<div class="figure">`` with its script, plotly.js not included."""
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
    return f'<div class="figure" data-figure="{esc(div_id)}">{body}</div>'


_NUMERIC = re.compile(r"^\s*[+\-−]?[\d.]")


def text_columns(rows: list[list]) -> set[int]:
    """Indices of the columns whose cells mostly do not start with a number (tokens, words, ``h4
    +0.119``), which read left-aligned; a column of numbers, with or without units (``12``, ``-0.5``,
    ``+20.7%``, ``134,515,008 (134.5 M)``), stays right-aligned."""
    counts: dict[int, list[int]] = {}
    for r in rows:
        for j, c in enumerate(r):
            counts.setdefault(j, [0, 0])[0 if _NUMERIC.match(str(c)) else 1] += 1
    return {j for j, (num, text) in counts.items() if text > num}


def table_html(headers: list[str], rows: list[list], cls: str = "data") -> str:
    """A plain HTML table; cells are escaped. Columns of numbers are right-aligned (the stylesheet's
    default), columns of text get ``class="txt"`` (left-aligned)."""
    txt = text_columns(rows)

    def cell(tag, j, c):
        return f'<{tag} class="txt">{esc(c)}</{tag}>' if j in txt else f"<{tag}>{esc(c)}</{tag}>"

    head = "".join(cell("th", j, h) for j, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", j, c) for j, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
