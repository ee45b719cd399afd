"""Rendering of :class:`~vocablens.lens.compare.LensComparison`: one table, one figure, the ``--json`` dict."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from vocablens.lens.compare import LensComparison

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


def comparison_figure(res: LensComparison, title: str = ""):
    """A plotly figure: KL, CE and top-1 agreement per layer, one line per lens."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = list(range(res.n_layers + 1))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in PANELS])
    for col, (m, _) in enumerate(PANELS, start=1):
        for k in res.kinds:
            fig.add_trace(go.Scatter(x=x, y=[None if math.isnan(v) else v for v in res.metrics[k][m]],
                                     name=f"{k} lens", line=dict(color=COLOURS.get(k)), showlegend=col == 1,
                                     legendgroup=k), row=1, col=col)
        fig.update_xaxes(title_text="layer", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=title or None, height=380, margin=dict(l=40, r=20, t=60, b=40))
    return fig


def save_comparison_plot(res: LensComparison, path: str | Path, title: str = "") -> Path:
    """Write the comparison figure: ``.html`` (plotly, self-contained) or ``.png`` (matplotlib), atomically."""
    from vocablens.files import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix.lower() == ".png":
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            x = list(range(res.n_layers + 1))
            fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
            for ax, (m, name) in zip(axes, PANELS):
                for k in res.kinds:
                    ax.plot(x, res.metrics[k][m], color=COLOURS.get(k), label=f"{k} lens")
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
            comparison_figure(res, title).write_html(str(tmp), include_plotlyjs=True, full_html=True)
    return path


def comparison_to_dict(res: LensComparison, provenance, lenses: list[dict], data: dict,
                       plot: str | Path | None = None) -> dict:
    """The dict ``lens eval --kind ... --json`` prints for a list of kinds other than logit,tuned:
    :meth:`LensComparison.to_dict` plus ``model``, ``lenses`` (each lens's provenance), ``data`` and
    ``plot`` (null without ``--plot``)."""
    d = res.to_dict()
    d.update({"model": provenance.to_dict(), "lenses": lenses, "data": data,
              "plot": str(plot) if plot is not None else None})
    return d


__all__ = ["comparison_figure", "comparison_table", "comparison_to_dict", "print_comparison", "save_comparison_plot"]
