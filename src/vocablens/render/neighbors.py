"""Rendering of embedding neighbours: tables for the terminal, the report and ``--json``.

The word-embedding PCA figures are in :mod:`vocablens.render.pca`.

The ``neighbors`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vocablens.geometry.embedding import Neighbors
from vocablens.models.tokens import escape_text, quoted, token_str
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.tokens import LEGEND, display_token, visible
from vocablens.render.renderer import Renderer, model_of

_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#9d755d", "#b08d00",
            "#ff9da6", "#bab0ac"]


# ---------------------------------------------------------------------------------------- neighbours
def neighbors_to_dict(res: Neighbors, tokenizer) -> dict[str, Any]:
    """Plain data for ``--json``: readable tokens, ids and cosines per query and matrix."""
    out = {"k": res.k, "tied": res.tied, "candidates": res.candidates, "excluded": res.excluded, "queries": []}
    for q in res.results:
        d: dict[str, Any] = {
            "query": q.query, "ids": list(q.query_ids),
            "tokens": [token_str(tokenizer, i) for i in q.query_ids], "used": q.used, "note": q.note,
        }
        for lst in q.lists:
            d[lst.matrix] = [{"id": int(i), "token": token_str(tokenizer, int(i)), "cosine": round(float(c), 6)}
                             for i, c in zip(lst.ids.tolist(), lst.cosines.tolist())]
        out["queries"].append(d)
    return out


def neighbors_header(res: Neighbors) -> str:
    scope = (f"cosine over {res.candidates:,} real tokens"
             + (f" ({res.excluded:,} padding/never-trained rows excluded)" if res.excluded else ""))
    return scope + ("; tied head: one matrix" if res.tied else "; untied: embedding and LM head searched apart")


def _label(q, tokenizer) -> str:
    if q.used == "token":  # the token as every table shows it, and its id
        return f"neighbours of {quoted(token_str(tokenizer, q.query_ids[0]))} (id {int(q.query_ids[0])})"
    return f"neighbours of {quoted(escape_text(q.query))} ({q.used})"  # escaped once, as tokens are


def query_label(q, tokenizer) -> str:
    """The heading of one query's neighbour table: ``neighbours of ' king' (id 4475)``."""
    return _label(q, tokenizer)


def neighbors_tables(res: Neighbors, tokenizer) -> list[Table]:
    """One rich table per query (no title): rank, then id, token and cosine per matrix."""
    tables = []
    for q in res.results:
        t = Table()
        t.add_column("#", justify="right")
        for lst in q.lists:
            t.add_column("id", justify="right")
            t.add_column("embedding (input)" if lst.matrix == "input" else "LM head (output)")
            t.add_column("cos", justify="right")
        for r in range(res.k):
            cells = [str(r + 1)]
            for lst in q.lists:
                cells += [str(int(lst.ids[r])), quoted(token_str(tokenizer, int(lst.ids[r]))),
                          f"{float(lst.cosines[r]):.3f}"]
            t.add_row(*cells)
        tables.append(t)
    return tables


def print_neighbors(res: Neighbors, tokenizer, console) -> None:
    """Print the scope line, then per query a heading, its note and its table, on a rich ``console``."""
    console.print(neighbors_header(res), style="dim")
    for q, t in zip(res.results, neighbors_tables(res, tokenizer)):
        console.print(_label(q, tokenizer), style="bold", markup=False, highlight=False)
        if q.note:
            console.print(f"note: {q.note}", style="yellow", markup=False, highlight=False)
        console.print(t)


def neighbors_section(res: Neighbors, tokenizer) -> Section:
    """The report's neighbours section: one HTML table per query."""
    parts = [f"<p>{esc(neighbors_header(res))}. {esc(LEGEND)}</p><div class='cards'>"]
    for q in res.results:
        label = (f"{display_token(tokenizer, q.query_ids[0])} (id {int(q.query_ids[0])})" if q.used == "token"
                 else visible(q.query))
        parts.append(f"<div class='card'><h3>{esc(label)}</h3>")
        if q.note:
            parts.append(f"<p class='note'>{esc(q.note)}</p>")
        headers = ["#"]
        for lst in q.lists:
            headers += ["id", "embedding (input)" if lst.matrix == "input" else "LM head (output)", "cos"]
        rows = []
        for r in range(res.k):
            row: list = [r + 1]
            for lst in q.lists:
                row += [int(lst.ids[r]), display_token(tokenizer, int(lst.ids[r])), f"{float(lst.cosines[r]):.3f}"]
            rows.append(row)
        parts.append(table_html(headers, rows) + "</div>")
    parts.append("</div>")
    return Section(id="neighbors", title="Embedding neighbours", html="".join(parts))


# ---------- the renderers of a neighbors result (vocablens.handle.results.Neighbors)
def _json_of(r) -> dict:
    return {**neighbors_to_dict(r.value, r.tokenizer), **model_of(r)}


def _print_of(r, out) -> None:
    print_neighbors(r.value, r.tokenizer, out)


def _rows_of(r) -> list[dict]:
    """A row per (query, matrix, rank): the neighbour's id, token and cosine."""
    rows = []
    for q in r.value.results:
        for lst in q.lists:
            for rank, (i, c) in enumerate(zip(lst.ids.tolist(), lst.cosines.tolist()), start=1):
                rows.append({"query": q.query, "matrix": lst.matrix, "rank": rank, "id": int(i),
                             "token": token_str(r.tokenizer, int(i)), "cosine": float(c)})
    return rows


#: how a ``neighbors`` result shows itself
RENDERER = Renderer("neighbors", _json_of, _print_of, None, _rows_of)


__all__ = ["RENDERER", "neighbors_to_dict", "neighbors_tables", "print_neighbors", "neighbors_section"]
