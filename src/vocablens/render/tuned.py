"""Rendering of the tuned lens: the evaluation table and plot, and the report's trajectory heatmaps.

The heatmaps follow Belrose et al. (2023, Fig. 1): layers on y, positions on x, the colour one of
entropy, KL to the final layer, or probability of the final top-1 token, the text the lens's top
token; logit lens and tuned lens side by side.
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table
from rich.text import Text

from vocablens.lens.logit import LensResult
from vocablens.lens.evaluate import LensEval
from vocablens.render.html import Section, esc, figure_html

COLOURS = {
    "entropy": ("entropy (nats)", "entropy"),
    "kl": ("KL(final ‖ lens) (nats)", "kl_to_final"),
    "final_prob": ("probability of the final top-1 token", "final_top1_prob"),
}


#: the KL colour scale is log10 from this floor (nats): KL spans ~1e-3..1e2 over the layers (about 107
#: nats at layer 0 of the default model), so a linear scale painted layers 1..L one colour; values
#: below the floor (layer L is 0) are drawn at it, and the colour bar says so
KL_FLOOR = 0.01


def _f(x: float) -> str:
    """At most 5 characters: 114, 13.2, 1.31, nan."""
    if x != x:
        return "nan"
    a = abs(x)
    return f"{x:.0f}" if a >= 99.95 else f"{x:.1f}" if a >= 9.995 else f"{x:.2f}"


def eval_table(res: LensEval, title: str = "") -> Table:
    """One row per layer: KL, CE (nats and bits/byte), entropy, top-1 agreement, logit | tuned."""
    from rich import box

    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False,
              show_edge=False)
    t.add_column("layer", justify="right", min_width=2, no_wrap=True)
    for name in ("KL\nlogit", "KL\ntuned", "CE\nlogit", "CE\ntuned", "bpb\nlogit", "bpb\ntuned",
                 "H\nlogit", "H\ntuned", "top1\nlogit", "top1\ntuned"):
        t.add_column(name, justify="right", no_wrap=True)
    for i in range(res.n_layers + 1):
        better = res.tuned_kl[i] < res.logit_kl[i]
        t.add_row(str(i), _f(res.logit_kl[i]),
                  (Text(_f(res.tuned_kl[i]), style="green") if better else _f(res.tuned_kl[i])),
                  _f(res.logit_ce[i]), _f(res.tuned_ce[i]),
                  _f(res.logit_bpb[i]), _f(res.tuned_bpb[i]),
                  _f(res.logit_entropy[i]), _f(res.tuned_entropy[i]),
                  _f(res.logit_top1[i]), _f(res.tuned_top1[i]))
    return t


def print_eval(res: LensEval, out, title: str = "") -> None:
    """Print :func:`eval_table` and a one-line verdict to the rich console ``out`` (stdout)."""
    out.print(eval_table(res, title))
    n_better = sum(res.tuned_kl[i] < res.logit_kl[i] for i in range(res.n_layers))
    out.print(f"tuned KL below logit KL at {n_better} of {res.n_layers} layers 0..{res.n_layers - 1} "
              f"({res.tokens} tokens; KL, CE, entropy in nats; bpb = bits per byte)")


def _series(res: LensEval, unit: str = "nats") -> dict[str, dict[str, list[float]]]:
    ce = (res.logit_ce, res.tuned_ce) if unit == "nats" else (res.logit_bpb, res.tuned_bpb)
    return {"logit": {"kl": res.logit_kl, "ce": ce[0], "top1_agreement": res.logit_top1},
            "tuned": {"kl": res.tuned_kl, "ce": ce[1], "top1_agreement": res.tuned_top1}}


def eval_figure(res: LensEval, title: str = "", unit: str = "nats"):
    """A plotly figure: KL, cross-entropy and top-1 agreement per layer, logit vs tuned (layers on x;
    :func:`vocablens.render.compare.panels_figure`).

    Args:
        unit: the cross-entropy's unit, ``nats`` or ``bpb`` (bits per byte, Belrose et al. 2023, Fig. 3).

    Raises:
        BadInput: another unit, or ``bpb`` of an evaluation that did not count the text's bytes.
    """
    from vocablens.errors import BadInput
    from vocablens.render.compare import PANELS, panels_figure

    if unit not in ("nats", "bpb"):
        raise BadInput(f"unit must be nats or bpb; got {unit!r}")
    if unit == "bpb" and not res.n_bytes:
        raise BadInput("bits per byte need the bytes of the text scored; this evaluation has none")
    titles = [p[1] for p in PANELS]
    if unit == "bpb":
        titles[1] = "CE vs next token (bits per byte)"
    return panels_figure(res.n_layers, _series(res, unit), title, titles)


def save_eval_plot(res: LensEval, path: str | Path, title: str = "") -> Path:
    """Write the evaluation plot: ``.html`` (plotly, self-contained) or ``.png`` (matplotlib), atomically."""
    from vocablens.render.compare import save_panels

    return save_panels(path, res.n_layers, _series(res), title,
                       png_titles=("KL to final (nats)", "CE vs next token (nats)", "top-1 agreement"))


def train_summary_to_dict(res, out_dir, steps: int, wall_s: float, world_size: int, data: dict) -> dict:
    """The dict ``lens train --json`` prints: the output folder, steps asked and resumed from, tokens
    seen, wall seconds and tokens/s, the last step's loss (nats summed over layers) and per-layer
    losses (None before any step), the world size and the data record. ``res`` is a
    :class:`vocablens.lens.train.TrainResult`."""
    last = res.history[-1] if res.history else None
    return {"out": str(out_dir) if out_dir is not None else None, "steps": steps, "resumed_from": res.resumed_from,
            "tokens": res.tokens, "seconds": round(wall_s, 2),
            "tokens_per_s": res.tokens / wall_s if wall_s > 0 else None,
            "final_loss": last.loss if last is not None else None,
            "final_layer_loss": last.layer_loss if last is not None else None,
            "world_size": world_size, "data": data}


def eval_to_dict(res: LensEval, provenance, lens_label: str, data: dict, plot: str | Path | None = None,
                 lenses: list[dict] | None = None) -> dict:
    """The dict ``lens eval --json`` prints: :meth:`LensEval.to_dict` plus ``model`` (provenance),
    ``lens`` (which lens), ``lenses`` (the tuned lens's provenance record,
    :func:`vocablens.render.lens.lens_record`), ``data`` (the evaluation corpus record) and ``plot``
    (the plot's path, null without ``--plot``: one schema either way, as ``settle --json``)."""
    d = res.to_dict()
    d.update({"model": provenance.to_dict(), "lens": lens_label, "lenses": list(lenses or []), "data": data,
              "plot": str(plot) if plot is not None else None})
    return d


def _grid(res: LensResult, field: str):
    """[L+1, P] values of one LensLayer field, and the [L+1, P] top-token ids."""
    z = [[float(v) for v in getattr(ly, field).tolist()] for ly in res.layers]
    top = [[int(t) for t in ly.top_ids[:, 0].tolist()] for ly in res.layers]
    return z, top


#: the trajectory heatmaps' cell text (px), narrowest cell and panel, gap between panels and margins (px;
#: the right margin holds the colour bar)
CELL_FONT, MIN_CELL_PX, MIN_PANEL_PX, GAP_PX, MARGIN_L, MARGIN_R = 11, 56, 320, 40, 60, 140


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


def tuned_lens_section(logit: LensResult, tuned: LensResult, tokenizer, lens_info: dict | None = None,
                       colours=("entropy", "kl", "final_prob"), eval_result: LensEval | None = None,
                       jacobian: LensResult | None = None, jacobian_info: dict | None = None) -> Section:
    """The report section: prediction trajectories of one prompt through the lenses side by side
    (logit, tuned, and the Jacobian lens when ``jacobian`` is given).

    Args:
        logit, tuned: the two lenses over the same positions of one prompt
            (:func:`vocablens.lens.logit.lens_pair`).
        tokenizer: the model's tokenizer.
        lens_info: ``{"name", "tokens"}`` of the tuned lens (its model name, training tokens).
        colours: one heatmap pair per colour (``entropy``, ``kl``, ``final_prob``).
        eval_result: an optional :class:`LensEval` to plot per-layer KL/CE/agreement too.
        jacobian, jacobian_info: the Jacobian lens over the same positions, and its provenance
            (:meth:`vocablens.lens.jacobian.JacobianLens.info`).

    Returns:
        :class:`Section` with id ``tuned-lens``.

    Raises:
        BadInput: an unknown colour.
    """
    from vocablens.render.tokens import LEGEND, special_note

    info = lens_info or {}
    positions = logit.positions.tolist()
    T = int(logit.input_ids.numel())
    parts = [f"<p>Prediction trajectories (Belrose et al. 2023, Fig. 1) of {T} tokens, positions "
             f"{positions[0]}..{positions[-1]}: each cell is one layer (rows, 0 = embedding output, "
             f"{logit.n_layers} = model output) at one position; the text is the lens's top token. "
             f"Left: logit lens; right: tuned lens ({esc(info.get('name') or 'trained')}, "
             f"{esc(info.get('tokens', '?'))} training tokens{esc(_origin(info))})"
             + (f"; third: Jacobian lens (Gurnee et al. 2026; {esc(_jinfo(jacobian_info))})" if jacobian is not None else "")
             + f". {esc(LEGEND)}</p>"]
    note = special_note(tokenizer, [int(ly.top_ids[p, 0]) for res in (logit, tuned, jacobian) if res is not None
                                    for ly in res.layers
                                    for p in range(len(positions))])
    if note:
        parts.append(f"<p class='note'>{esc(note)}</p>")
    for c in colours:
        if c not in COLOURS:
            trajectory_figure(logit, tuned, tokenizer, c)  # raises BadInput naming the colours
        parts.append(f"<h3>{esc(COLOURS[c][0])}</h3>")
        # the panels keep their width (the page scrolls sideways when they are wider than it)
        parts.append(f"<div class='scroll'>{figure_html(trajectory_figure(logit, tuned, tokenizer, c, jacobian), f'tuned-lens-{c}')}</div>")
    if eval_result is not None:
        parts.append("<h3>Per-layer quality on held-out text</h3>")
        parts.append(figure_html(eval_figure(eval_result), "tuned-lens-eval"))
    title = "Tuned lens vs logit lens" if jacobian is None else "Logit, tuned and Jacobian lens"
    return Section(id="tuned-lens", title=title, html="\n".join(parts))


def _jinfo(info: dict | None) -> str:
    """``model, corpus, N prompts, dtype, source`` of a Jacobian lens (for the caption)."""
    i = info or {}
    return ", ".join(str(x) for x in (i.get("name") or "fitted", i.get("corpus") and f"fitted on {i['corpus']}",
                                      i.get("n_prompts") and f"{i['n_prompts']} prompts",
                                      i.get("dtype") and f"stored {i['dtype']}", i.get("source")) if x) + _origin(i)


def _origin(i: dict) -> str:
    """``, format F, verified: ...`` of a lens's provenance (what its file says it was fitted for, and
    whether that was checked against the model: :func:`vocablens.lens.identity.verify_identity`)."""
    from vocablens.render.lens import quality_text

    hub = i.get("hub") or {}
    return "".join(f", {x}" for x in (i.get("revision") and f"revision {str(i['revision'])[:12]}",
                                       i.get("format") and f"format {i['format']}", i.get("verified"),
                                       hub and f"from the hub {hub.get('repo')}@{str(hub.get('revision'))[:12]}",
                                       quality_text(i.get("quality"))) if x)
