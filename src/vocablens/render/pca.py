"""The report's word-embedding figures: a rotatable 3-D PCA and a 2-D map of its top two directions.

``pca_figure`` is the seeds' figure: ~60 word embeddings in 3-D, coloured by group, with two buttons
switching between the top-3 principal directions and three random orthonormal directions (which show
how little of the structure a random view keeps). Its labels are SVG annotations, drawn in front of
the WebGL points, placed where they overlap no other label and cover no point in the view the figure
opens with (:mod:`vocablens.render.labels`); a word whose label finds no such spot is read by hovering
its point. ``pca_map_figure`` draws the top two directions flat with every word labelled, so that
the dense centre of the 3-D view can be read at a glance.

Both figures have a fixed size: labels are placed in pixels, so a figure drawn at another size would
move its points under its labels.

The ``pca`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from vocablens.geometry.embedding import WordPCA
from vocablens.render.html import Section, esc, figure_html
from vocablens.render.labels import place_labels, project_scene, text_size
from vocablens.render.json import json_ready
from vocablens.render.renderer import Renderer

_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#9d755d", "#b08d00",
            "#ff9da6", "#bab0ac"]
#: the figures' size in pixels (fits the report's column, 1,194 px at its widest)
WIDTH, HEIGHT_3D, HEIGHT_2D = 1150, 700, 640
FONT_PX, POINT_PX = 11, 5.0
#: the 3-D scene's place in the figure (fractions) and the camera it opens with
_DOMAIN = dict(x=[0.0, 0.84], y=[0.0, 0.94])
_MARGIN_3D = dict(l=0, r=0, t=80, b=0)
CAMERA = dict(eye=dict(x=1.5, y=1.5, z=0.9), center=dict(x=0, y=0, z=-0.05), up=dict(x=0, y=0, z=1))
_MARGIN_2D = dict(l=56, r=150, t=40, b=48)


def _padded(lo: float, hi: float, frac: float = 1 / 32) -> list[float]:
    span = (hi - lo) or 1.0
    return [lo - frac * span, hi + frac * span]


def _label_annotations(words, groups, order, xy, width, height, where: dict, max_leader: float) -> list[dict]:
    """plotly annotation dicts for the labels that fit: ``where(i)`` gives point i's x/y(/z) keys."""
    sizes = [text_size(w, FONT_PX) for w in words]
    spots = place_labels(xy, sizes, width, height, point_px=POINT_PX, max_leader=max_leader)
    out = []
    for i, s in enumerate(spots):
        if s is None:
            continue
        colour = _PALETTE[order.index(groups[i]) % len(_PALETTE)]
        a = dict(**where(i), text=esc(words[i]), font=dict(size=FONT_PX, color=colour), name=words[i],
                 bgcolor="rgba(255,255,255,0.75)", borderpad=0)
        if s.leader:  # the label's centre at (ax, ay) pixels from its point, a thin line between
            a.update(showarrow=True, ax=s.dx, ay=s.dy, arrowhead=0, arrowwidth=0.8, arrowcolor=colour,
                     standoff=POINT_PX - 1)
        else:
            a.update(showarrow=False, xshift=s.dx, yshift=-s.dy)
        out.append(a)
    return out


def _scene_labels(wp: WordPCA, order, coords, ranges) -> list[dict]:
    w = WIDTH * (_DOMAIN["x"][1] - _DOMAIN["x"][0])
    h = (HEIGHT_3D - _MARGIN_3D["t"] - _MARGIN_3D["b"]) * (_DOMAIN["y"][1] - _DOMAIN["y"][0])
    cam = {k: tuple(float(v[a]) for a in "xyz") for k, v in CAMERA.items()}
    xy = project_scene(coords, ranges, cam, w, h)
    return _label_annotations(wp.words, wp.groups, order, xy, w, h,
                              lambda i: dict(x=coords[i][0], y=coords[i][1], z=coords[i][2]), max_leader=70.0)


def pca_figure(wp: WordPCA):
    """A plotly 3-D scatter of the words, coloured by group, with a PCA / random-directions switch.

    Labels are scene annotations (SVG, in front of the points), placed in the opening view where they
    overlap no other label and cover no point, beside their point or joined to it by a thin line;
    the other words are read by hovering their points (every point has its word as hover text).

    Returns:
        ``plotly.graph_objects.Figure`` (1,150 x 700 px) with 2·G point traces (G groups; per view;
        PCA visible, random hidden), ``scene.annotations`` for the PCA view's labels, and one
        ``updatemenus`` entry of two buttons, ``PCA`` and ``three random directions``, each
        switching the traces, the axis titles and the labels.
    """
    import plotly.graph_objects as go

    p = wp.pca
    order = list(dict.fromkeys(wp.groups))
    G = len(order)
    fig = go.Figure()
    views = {}
    for view, coords in (("pca", p.coords.tolist()), ("random", p.random_coords.tolist())):
        ranges = [_padded(min(c[a] for c in coords), max(c[a] for c in coords)) for a in range(3)]
        views[view] = (ranges, _scene_labels(wp, order, coords, ranges))
        for gi, g in enumerate(order):
            idx = [i for i, gg in enumerate(wp.groups) if gg == g]
            fig.add_trace(go.Scatter3d(
                x=[coords[i][0] for i in idx], y=[coords[i][1] for i in idx], z=[coords[i][2] for i in idx],
                name=g, legendgroup=g, visible=(view == "pca"), mode="markers",
                hovertext=[wp.words[i] for i in idx], showlegend=(view == "pca"),
                marker=dict(size=4, color=_PALETTE[gi % len(_PALETTE)], opacity=0.8),
                hovertemplate="%{hovertext} (" + g + ")<extra></extra>"))
    ev, rev = p.explained_variance.tolist(), p.random_explained_variance.tolist()

    def scene(prefix, v, view):
        ranges, labels = views[view]
        out = {f"scene.{a}axis.title.text": f"{prefix} {i + 1} ({100 * v[i]:.1f}% var.)" for i, a in enumerate("xyz")}
        out.update({f"scene.{a}axis.range": ranges[i] for i, a in enumerate("xyz")})
        out["scene.annotations"] = labels
        out["scene.camera"] = CAMERA
        return out

    on, off = [True] * G, [False] * G
    buttons = [
        dict(label="PCA", method="update",
             args=[{"visible": on + off, "showlegend": on + off}, {"title.text": _title(wp, "PCA"), **scene("PC", ev, "pca")}]),
        dict(label="three random directions", method="update",
             args=[{"visible": off + on, "showlegend": off + on},
                   {"title.text": _title(wp, "random"), **scene("random", rev, "random")}]),
    ]
    ranges, labels = views["pca"]
    axis = dict(autorange=False)
    fig.update_layout(
        title=dict(text=_title(wp, "PCA"), font=dict(size=14), x=0.01, y=0.98, yanchor="top"),
        width=WIDTH, height=HEIGHT_3D, autosize=False, margin=_MARGIN_3D,
        updatemenus=[dict(type="buttons", direction="right", x=0.0, y=1.0, xanchor="left", yanchor="bottom",
                          pad=dict(t=0, b=4), buttons=buttons, showactive=True, active=0)],
        # the scene keeps clear of the title and buttons; the camera sits far enough out that
        # the cube and its axis titles fit inside the figure at every rotation
        scene=dict(domain=_DOMAIN, aspectmode="cube", camera=CAMERA, annotations=labels,
                   xaxis=dict(axis, range=ranges[0], title=f"PC 1 ({100 * ev[0]:.1f}% var.)"),
                   yaxis=dict(axis, range=ranges[1], title=f"PC 2 ({100 * ev[1]:.1f}% var.)"),
                   zaxis=dict(axis, range=ranges[2], title=f"PC 3 ({100 * ev[2]:.1f}% var.)")),
        legend=dict(itemsizing="constant", x=0.86, y=0.5, yanchor="middle"),
    )
    return fig


def pca_map_figure(wp: WordPCA):
    """The words on their top two principal directions, flat, each labelled where no label overlaps.

    Both axes have the same pixels per unit (distances read true); labels sit beside their point or,
    in the dense centre, away from it on a thin line of the group's colour.

    Returns:
        ``plotly.graph_objects.Figure`` (1,150 x 640 px): G marker traces and ``layout.annotations``
        (one per labelled word; every word when the placement finds room, which it does for the
        default 60 words).
    """
    import plotly.graph_objects as go

    p = wp.pca
    order = list(dict.fromkeys(wp.groups))
    xy = [(float(c[0]), float(c[1])) for c in p.coords]
    w = WIDTH - _MARGIN_2D["l"] - _MARGIN_2D["r"]
    h = HEIGHT_2D - _MARGIN_2D["t"] - _MARGIN_2D["b"]
    # equal scale on both axes, with room around the points for labels
    xr, yr = _padded(min(x for x, _ in xy), max(x for x, _ in xy), 0.08), _padded(min(y for _, y in xy), max(y for _, y in xy), 0.12)
    scale = min(w / (xr[1] - xr[0]), h / (yr[1] - yr[0]))
    cx, cy = sum(xr) / 2, sum(yr) / 2
    xr, yr = [cx - w / scale / 2, cx + w / scale / 2], [cy - h / scale / 2, cy + h / scale / 2]
    px = [((x - xr[0]) * scale, (yr[1] - y) * scale) for x, y in xy]
    labels = _label_annotations(wp.words, wp.groups, order, px, w, h,
                                lambda i: dict(x=xy[i][0], y=xy[i][1], xref="x", yref="y"), max_leader=160.0)
    fig = go.Figure()
    for gi, g in enumerate(order):
        idx = [i for i, gg in enumerate(wp.groups) if gg == g]
        fig.add_trace(go.Scatter(x=[xy[i][0] for i in idx], y=[xy[i][1] for i in idx], mode="markers", name=g,
                                 hovertext=[wp.words[i] for i in idx], hovertemplate="%{hovertext} (" + g + ")<extra></extra>",
                                 marker=dict(size=2 * POINT_PX - 2, color=_PALETTE[gi % len(_PALETTE)], opacity=0.85)))
    ev = p.explained_variance.tolist()
    fig.update_layout(
        width=WIDTH, height=HEIGHT_2D, autosize=False, margin=_MARGIN_2D, annotations=labels,
        title=dict(text=f"the top two directions, flat: {len(labels)} of {len(wp.words)} words labelled",
                   font=dict(size=14), x=0.01, y=0.99, yanchor="top"),
        xaxis=dict(range=xr, autorange=False, title=f"PC 1 ({100 * ev[0]:.1f}% var.)", zeroline=False, automargin=False),
        yaxis=dict(range=yr, autorange=False, title=f"PC 2 ({100 * ev[1]:.1f}% var.)", zeroline=False, automargin=False),
        legend=dict(itemsizing="constant", x=1.02, xanchor="left", y=0.5, yanchor="middle"),
        plot_bgcolor="#f7f8fb",
    )
    return fig


def _title(wp: WordPCA, view: str) -> str:
    n = len(wp.words)
    if view == "PCA":
        return (f"{n} word embeddings on their top-3 principal directions "
                f"({100 * float(wp.pca.explained_variance.sum()):.1f}% of their variance; PCA fitted on these rows)")
    return (f"the same {n} embeddings on three random orthonormal directions (seed {wp.pca.seed}; "
            f"{100 * float(wp.pca.random_explained_variance.sum()):.1f}% of their variance)")


def pca_section(wp: WordPCA, div_id: str = "pca-3d", map_id: str = "pca-2d") -> Section:
    """The report's PCA section: the rotatable 3-D figure with its PCA / random switch, then the flat map."""
    p = wp.pca
    fig3, fig2 = pca_figure(wp), pca_map_figure(wp)
    shown = len(fig3.layout.scene.annotations)
    text = (f"Embedding rows (W_E) of {len(wp.words)} common words in {len(set(wp.groups))} groups, coloured by group. "
            f"PCA is fitted on these rows only (centred on their mean): the top three directions keep "
            f"{100 * float(p.explained_variance.sum()):.1f}% of their variance, three random orthonormal "
            f"directions {100 * float(p.random_explained_variance.sum()):.1f}%. In 3-D, {shown} of the "
            f"{len(wp.words)} words are labelled: those whose label overlaps no other label and hides no point "
            f"in this view; hover a point for any word, drag to rotate, scroll to zoom; the buttons switch views.")
    if wp.skipped:
        text += f" Skipped (several tokens here): {', '.join(wp.skipped)}."
    flat = (f"The same words on the top two directions ({100 * float(p.explained_variance[:2].sum()):.1f}% of their "
            f"variance), flat, same scale on both axes: {len(fig2.layout.annotations)} of {len(wp.words)} words "
            f"labelled; a line joins a label set apart to its point. Groups apart only along PC 3 overlap here.")
    return Section(id="pca", title="Word embeddings in 3-D",
                   html=(f"<p>{esc(text)}</p><div class='scroll'>" + figure_html(fig3, div_id)
                         + f"</div><p>{esc(flat)}</p><div class='scroll'>" + figure_html(fig2, map_id) + "</div>"))


# ---------- the renderers of a pca result (vocablens.handle.results.WordPCA)
def _json_of(r) -> dict:
    wp = r.value
    return {"words": list(wp.words), "groups": list(wp.groups), "skipped": list(wp.skipped), "matrix": wp.matrix,
            "coords": json_ready(wp.pca.coords), "explained_variance": json_ready(wp.pca.explained_variance)}


def _print_of(r, out) -> None:
    wp = r.value
    out.print(f"3-D PCA of {len(wp.words)} words in {len(set(wp.groups))} groups (input embedding)"
              + (f"; skipped (several tokens): {', '.join(wp.skipped)}" if wp.skipped else "")
              + ". .figure() draws it.")


def _figure_of(r):
    """The report's 3-D word map."""
    return pca_figure(r.value)


def _rows_of(r) -> list[dict]:
    """A row per word: its group, id and coordinates on the three principal directions."""
    wp = r.value
    return [{"word": w, "group": g, "id": int(i), "pc1": float(c[0]), "pc2": float(c[1]), "pc3": float(c[2])}
            for w, g, i, c in zip(wp.words, wp.groups, wp.pca.ids.tolist(), wp.pca.coords.tolist())]


#: how a ``pca`` result shows itself
RENDERER = Renderer("pca", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "CAMERA", "HEIGHT_2D", "HEIGHT_3D", "WIDTH", "pca_figure", "pca_map_figure", "pca_section"]
