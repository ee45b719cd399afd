"""Rendering of :class:`~vocablens.lens.compare.LensComparison`: one table, one figure, the ``--json`` dict.

The ``lens_compare`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from rich.table import Table

from vocablens.lens.compare import LensComparison
from vocablens.render.renderer import Renderer

COLOURS = {"logit": "#d62728", "tuned": "#1f77b4", "jacobian": "#2ca02c"}
PANELS = (("kl", "KL to final (nats)"), ("ce", "CE vs next token (nats)"), ("top1_agreement", "top-1 agreement with final"))


def _f(x: float, nd: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def comparison_table(res: LensComparison, title: str = "") -> Table:
    """Rows = layers 0..L; per lens: KL, CE, bits per byte and top-1 agreement."""
    t = Table(title=title or None, title_justify="left")
    t.add_column("layer", justify="right")
    for k in res.kinds:
        for m, head in (("kl", "KL"), ("ce", "CE"), ("bpb", "bpb"), ("top1_agreement", "top-1")):
            t.add_column(f"{k} {head}", justify="right")
    for i in range(res.n_layers + 1):
        t.add_row(str(i), *[_f(res.metrics[k][m][i]) for k in res.kinds for m in ("kl", "ce", "bpb", "top1_agreement")])
    t.add_row("mean KL 0..L-1", *[x for k in res.kinds for x in (_f(res.mean_kl(k)), "", "", "")], style="bold")
    return t


def print_comparison(res: LensComparison, out, title: str = "") -> None:
    """Print :func:`comparison_table` and which lens has the lowest KL at how many layers."""
    out.print(comparison_table(res, title))
    L = res.n_layers
    wins = {k: 0 for k in res.kinds}
    for i in range(L):
        vals = {k: res.metrics[k]["kl"][i] for k in res.kinds if not math.isnan(res.metrics[k]["kl"][i])}
        if vals:
            wins[min(vals, key=vals.get)] += 1
    out.print("lowest KL at " + ", ".join(f"{k}: {w} layers" for k, w in wins.items()) +
              f" of 0..{L - 1} ({res.tokens} tokens; KL and CE in nats, bpb = bits per byte)")


def panels_figure(n_layers: int, series: dict[str, dict[str, list[float]]], title: str = "",
                  panel_titles: Sequence[str] = tuple(p[1] for p in PANELS)):
    """The three-panel figure of lenses scored per layer (Belrose et al. 2023, Fig. 3): KL to the final
    distribution (log scale), CE against the next token (nats) and top-1 agreement, one line per lens,
    layers 0..``n_layers`` on x. ``series[kind][metric]`` = [L+1] floats (NaN: not read, drawn as a gap);
    the metrics are ``kl``, ``ce`` and ``top1_agreement`` (``panel_titles``: the three panels' titles,
    e.g. the cross-entropy in bits per byte). ``lens eval`` draws it for any list of lenses
    (:func:`comparison_figure`) and for logit vs tuned (:func:`vocablens.render.tuned.eval_figure`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = list(range(n_layers + 1))
    fig = make_subplots(rows=1, cols=3, subplot_titles=list(panel_titles))
    for col, (m, _) in enumerate(PANELS, start=1):
        for k, s in series.items():
            fig.add_trace(go.Scatter(x=x, y=[None if math.isnan(v) else v for v in s[m]],
                                     name=f"{k} lens", line=dict(color=COLOURS.get(k)), showlegend=col == 1,
                                     legendgroup=k), row=1, col=col)
        fig.update_xaxes(title_text="layer", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=title or None, height=380, margin=dict(l=40, r=20, t=60, b=40))
    return fig


def save_panels(path: str | Path, n_layers: int, series: dict[str, dict[str, list[float]]], title: str = "",
                png_titles: tuple[str, str, str] = tuple(p[1] for p in PANELS)) -> Path:
    """Write :func:`panels_figure` to ``path``, atomically: ``.html`` (plotly, self-contained) or ``.png``
    (matplotlib, the same three panels titled ``png_titles``)."""
    from vocablens.files import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix.lower() == ".png":
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            x = list(range(n_layers + 1))
            fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
            for ax, (m, _), name in zip(axes, PANELS, png_titles):
                for k, s in series.items():
                    ax.plot(x, s[m], color=COLOURS.get(k), label=f"{k} lens")
                ax.set_xlabel("layer")
                ax.set_title(name)
            axes[0].set_yscale("log")
            axes[0].legend()
            if title:
                fig.suptitle(title)
            fig.tight_layout()
            fig.savefig(tmp, dpi=110, format="png")
            plt.close(fig)
        else:
            panels_figure(n_layers, series, title).write_html(str(tmp), include_plotlyjs=True, full_html=True)
    return path


def comparison_figure(res: LensComparison, title: str = ""):
    """:func:`panels_figure` of a comparison: KL, CE and top-1 agreement per layer, one line per lens."""
    return panels_figure(res.n_layers, {k: res.metrics[k] for k in res.kinds}, title)


def save_comparison_plot(res: LensComparison, path: str | Path, title: str = "") -> Path:
    """Write the comparison figure: ``.html`` (plotly, self-contained) or ``.png`` (matplotlib), atomically."""
    return save_panels(path, res.n_layers, {k: res.metrics[k] for k in res.kinds}, title)


def comparison_to_dict(res: LensComparison, provenance, lenses: list[dict], data: dict,
                       plot: str | Path | None = None) -> dict:
    """The dict ``lens eval --kind ... --json`` prints for a list of kinds other than logit,tuned:
    :meth:`LensComparison.to_dict` plus ``model``, ``lenses`` (each lens's provenance), ``data`` and
    ``plot`` (null without ``--plot``)."""
    d = res.to_dict()
    d.update({"model": provenance.to_dict(), "lenses": lenses, "data": data,
              "plot": str(plot) if plot is not None else None})
    return d


# ---------- the renderers of a lens_compare result (vocablens.handle.results.LensComparison)
def _json_of(r) -> dict:
    o = r.options
    return comparison_to_dict(r.value, r.provenance, o["lenses"], o["data"], o.get("plot"))


def _print_of(r, out) -> None:
    print_comparison(r.value, out, title=r.options["table_title"])


def _figure_of(r):
    """The three panels ``lens eval --plot`` writes, with its title."""
    return comparison_figure(r.value, r.options["title"])


def _rows_of(r) -> list[dict]:
    """A row per (layer, lens): KL, CE (nats), bits per byte, entropy (nats), top-1 agreement."""
    from vocablens.lens.compare import METRICS

    res = r.value
    return [{"layer": i, "kind": k, **{m: res.metrics[k][m][i] for m in METRICS}}
            for i in range(res.n_layers + 1) for k in res.kinds]


#: how a ``lens_compare`` result shows itself
RENDERER = Renderer("lens_compare", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "comparison_figure", "comparison_table", "comparison_to_dict", "panels_figure", "print_comparison",
           "save_comparison_plot", "save_panels"]
