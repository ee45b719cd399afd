"""Rendering of embedding geometry: neighbour tables and the rotatable 3-D PCA figure.

``pca_figure`` is the seeds' figure: ~60 word embeddings in 3-D, coloured by group, labelled with the
tokens, with two buttons switching between the top-3 principal directions and three random
orthonormal directions (which show how little of the structure a random view keeps).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vocablens.geometry.embedding import Neighbors, WordPCA
from vocablens.models.tokens import escape_text, quoted, token_str
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.tokens import LEGEND, display_token, visible

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


# ---------------------------------------------------------------------------------------- PCA
def pca_figure(wp: WordPCA):
    """A plotly 3-D scatter of the words, every word labelled, with a PCA / random-directions switch.

    Per group and view, two traces: the points (translucent, with the word on hover) and the labels
    (text only, beside their points, in the group's colour). WebGL draws translucent objects after
    opaque ones, so a point in front of a label tints it and never hides it.

    Returns:
        ``plotly.graph_objects.Figure`` with 4·G traces (G groups; per view, G point traces then G
        label traces; PCA visible, random hidden) and one ``updatemenus`` entry of two buttons,
        ``PCA`` and ``three random directions``.
    """
    import plotly.graph_objects as go

    p = wp.pca
    order = list(dict.fromkeys(wp.groups))
    G = len(order)
    fig = go.Figure()
    for view, coords in (("pca", p.coords), ("random", p.random_coords)):
        for kind in ("points", "labels"):
            for gi, g in enumerate(order):
                idx = [i for i, gg in enumerate(wp.groups) if gg == g]
                xyz = coords[idx].tolist()
                colour = _PALETTE[gi % len(_PALETTE)]
                common = dict(x=[c[0] for c in xyz], y=[c[1] for c in xyz], z=[c[2] for c in xyz], name=g,
                              legendgroup=g, visible=(view == "pca"))
                if kind == "points":
                    fig.add_trace(go.Scatter3d(
                        **common, mode="markers", hovertext=[wp.words[i] for i in idx],
                        showlegend=(view == "pca"), marker=dict(size=4, color=colour, opacity=0.45),
                        hovertemplate="%{hovertext} (" + g + ")<extra></extra>"))
                else:  # every word, beside its point (a label centred on its point hid behind it)
                    fig.add_trace(go.Scatter3d(
                        **common, mode="text", text=[wp.words[i] for i in idx], textposition="middle right",
                        textfont=dict(size=11, color=colour), showlegend=False, hoverinfo="skip"))
    ev, rev = p.explained_variance.tolist(), p.random_explained_variance.tolist()

    def axes(prefix, v):
        return {f"scene.{a}axis.title.text": f"{prefix} {i + 1} ({100 * v[i]:.1f}% var.)"
                for i, a in enumerate("xyz")}

    on, off = [True] * 2 * G, [False] * 2 * G
    legend = [True] * G + [False] * G
    buttons = [
        dict(label="PCA", method="update",
             args=[{"visible": on + off, "showlegend": legend + [False] * 2 * G},
                   {"title.text": _title(wp, "PCA"), **axes("PC", ev)}]),
        dict(label="three random directions", method="update",
             args=[{"visible": off + on, "showlegend": [False] * 2 * G + legend},
                   {"title.text": _title(wp, "random"), **axes("random", rev)}]),
    ]
    fig.update_layout(
        title=dict(text=_title(wp, "PCA"), font=dict(size=14), x=0.01, y=0.98, yanchor="top"),
        height=700, margin=dict(l=0, r=0, t=80, b=0),
        updatemenus=[dict(type="buttons", direction="right", x=0.0, y=1.0, xanchor="left", yanchor="bottom",
                          pad=dict(t=0, b=4), buttons=buttons, showactive=True, active=0)],
        # the scene keeps clear of the title and buttons; the camera sits far enough out that
        # the cube and its axis titles fit inside the figure at every rotation
        scene=dict(domain=dict(x=[0.0, 0.84], y=[0.0, 0.94]), aspectmode="cube",
                   camera=dict(eye=dict(x=1.5, y=1.5, z=0.9), center=dict(x=0, y=0, z=-0.05)),
                   xaxis_title=f"PC 1 ({100 * ev[0]:.1f}% var.)", yaxis_title=f"PC 2 ({100 * ev[1]:.1f}% var.)",
                   zaxis_title=f"PC 3 ({100 * ev[2]:.1f}% var.)"),
        legend=dict(itemsizing="constant", x=0.86, y=0.5, yanchor="middle"),
    )
    return fig


def _title(wp: WordPCA, view: str) -> str:
    n = len(wp.words)
    if view == "PCA":
        return (f"{n} word embeddings on their top-3 principal directions "
                f"({100 * float(wp.pca.explained_variance.sum()):.1f}% of their variance; PCA fitted on these rows)")
    return (f"the same {n} embeddings on three random orthonormal directions (seed {wp.pca.seed}; "
            f"{100 * float(wp.pca.random_explained_variance.sum()):.1f}% of their variance)")


def pca_section(wp: WordPCA, div_id: str = "pca-3d") -> Section:
    """The report's 3-D PCA section: the rotatable figure with its PCA / random switch."""
    p = wp.pca
    text = (f"Embedding rows (W_E) of {len(wp.words)} common words in {len(set(wp.groups))} groups. "
            f"PCA is fitted on these rows only (centred on their mean): the top three directions keep "
            f"{100 * float(p.explained_variance.sum()):.1f}% of their variance, three random orthonormal "
            f"directions {100 * float(p.random_explained_variance.sum()):.1f}%. Every word is labelled beside its point, "
            f"in its group's colour (points are translucent, so none hides a label); hover a point for its word, "
            f"drag to rotate, scroll to zoom into the dense centre; the buttons switch views.")
    if wp.skipped:
        text += f" Skipped (several tokens here): {', '.join(wp.skipped)}."
    return Section(id="pca", title="Word embeddings in 3-D", html=f"<p>{esc(text)}</p>" + figure_html(pca_figure(wp), div_id))


__all__ = ["neighbors_to_dict", "neighbors_tables", "print_neighbors", "neighbors_section", "pca_figure",
           "pca_section"]
