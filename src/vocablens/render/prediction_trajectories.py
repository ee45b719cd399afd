"""Prediction trajectories of one prompt through the logit lens and a translator (tuned, Jacobian) side by
side, the report's heatmaps and the figure of a lens result read through several lenses.

The heatmaps follow Belrose et al. (2023, Fig. 1): layers on y, positions on x, the colour one of
entropy, KL to the final layer, or probability of the final top-1 token, the text the lens's top
token; logit lens and tuned lens side by side.
"""

from __future__ import annotations

import math

from vocablens.lens.logit import LensResult

#: the trajectory heatmaps' cell text (px), narrowest cell and panel, gap between panels and margins (px;
#: the right margin holds the colour bar)
CELL_FONT, MIN_CELL_PX, MIN_PANEL_PX, GAP_PX, MARGIN_L, MARGIN_R = 11, 56, 320, 40, 60, 140


COLOURS = {
    "entropy": ("entropy (nats)", "entropy"),
    "kl": ("KL(final ‖ lens) (nats)", "kl_to_final"),
    "final_prob": ("probability of the final top-1 token", "final_top1_prob"),
}


#: the KL colour scale is log10 from this floor (nats): KL spans ~1e-3..1e2 over the layers (about 107
#: nats at layer 0 of the default model), so a linear scale painted layers 1..L one colour; values
#: below the floor (layer L is 0) are drawn at it, and the colour bar says so
KL_FLOOR = 0.01


def _grid(res: LensResult, field: str):
    """[L+1, P] values of one LensLayer field, and the [L+1, P] top-token ids."""
    z = [[float(v) for v in getattr(ly, field).tolist()] for ly in res.layers]
    top = [[int(t) for t in ly.top_ids[:, 0].tolist()] for ly in res.layers]
    return z, top


def trajectory_figure(logit: LensResult, tuned: LensResult, tokenizer, colour: str = "entropy",
                      jacobian: LensResult | None = None):
    """Heatmaps side by side (logit | tuned, and | jacobian when given): layers x positions, colour by
    ``colour`` (``entropy``, ``kl`` or ``final_prob``), text = the lens's top token (a lens that reads
    no matrix for a layer, as a published Jacobian lens at layer 0, leaves that row out). KL is coloured on a log10
    scale from :data:`KL_FLOOR` nats (the cut named on the colour bar); every hover gives the value.

    Raises:
        BadInput: unknown colour.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from vocablens.errors import BadInput
    from vocablens.render.tokens import display_token

    if colour not in COLOURS:
        raise BadInput(f"colour must be one of {', '.join(COLOURS)}; got {colour!r}")
    label, field = COLOURS[colour]
    pos = logit.positions.tolist()
    xs = [f"{p}: {display_token(tokenizer, int(logit.input_ids[p]))}" for p in pos]
    results = [logit, tuned] + ([jacobian] if jacobian is not None else [])
    n = len(results)
    grids = [_grid(r, field) for r in results]
    texts = [[[display_token(tokenizer, t) for t in row] for row in top] for _, top in grids]
    # each cell as wide as the longest top token at CELL_FONT px (about 0.62 em a character), never under
    # MIN_CELL_PX: a panel squeezed into a third of the page cut tokens ("NotFoundErro") or spilled them over
    longest = max(len(t) for panel in texts for row in panel for t in row)
    panel = max(MIN_PANEL_PX, len(pos) * max(MIN_CELL_PX, math.ceil(0.62 * CELL_FONT * longest) + 12))
    width = n * panel + (n - 1) * GAP_PX + MARGIN_L + MARGIN_R
    fig = make_subplots(rows=1, cols=n, subplot_titles=[f"{r.kind} lens" for r in results],
                        horizontal_spacing=GAP_PX / (width - MARGIN_L - MARGIN_R))
    top_z = max(max(max(r) for r in g[0]) for g in grids)
    bar = dict(title=dict(text=label, side="right"))
    if colour == "final_prob":
        zmin, zmax = 0.0, 1.0
    elif colour == "kl":  # log colour scale from KL_FLOOR (the cut is stated on the colour bar)
        zmin, zmax = math.log10(KL_FLOOR), max(math.log10(KL_FLOOR) + 1, math.ceil(math.log10(max(top_z, KL_FLOOR))))
        ticks = list(range(int(zmin), int(zmax) + 1))
        bar = dict(title=dict(text=f"{label}, log scale; below {KL_FLOOR:g} drawn as {KL_FLOOR:g}", side="right"),
                   tickvals=ticks, ticktext=[f"{10.0 ** t:g}" for t in ticks])
    else:
        zmin, zmax = 0.0, top_z or 1.0
    for col, ((z, _), text, res) in enumerate(zip(grids, texts, results), start=1):
        shown = [[math.log10(max(v, KL_FLOOR)) for v in row] for row in z] if colour == "kl" else z
        fig.add_trace(go.Heatmap(z=shown, customdata=z, x=xs, y=[ly.layer for ly in res.layers], text=text,
                                 texttemplate="%{text}", textfont=dict(size=CELL_FONT), zmin=zmin, zmax=zmax,
                                 colorscale="Viridis" if colour != "final_prob" else "Blues",
                                 colorbar=bar if col == n else None, showscale=col == n,
                                 hovertemplate="layer %{y}, position %{x}<br>top %{text}<br>"
                                               + label + " %{customdata:.3f}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(tickangle=-45, row=1, col=col)
        fig.update_yaxes(title_text="layer" if col == 1 else None, row=1, col=col)
    fig.update_layout(width=width, height=max(400, 20 * len(logit.layers) + 140),
                      margin=dict(l=MARGIN_L, r=MARGIN_R, t=50, b=90))
    return fig


__all__ = ["COLOURS", "KL_FLOOR", "trajectory_figure"]
