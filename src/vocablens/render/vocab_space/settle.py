"""Where predictions settle (``settle``, :meth:`vocablens.Model.settle`): its JSON, tables, panels figure,
plot file, report section and rows, registered as :data:`RENDERER`. Computes nothing."""

from __future__ import annotations

from rich.table import Table

from vocablens.files import atomic_path
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.renderer import Renderer, model_of
from vocablens.render.vocab_space._fmt import rnd
from vocablens.vocab_space import SettleResult


def settle_to_dict(res: SettleResult) -> dict:
    """``{"kind", "n_positions", "n_layers", "histogram", "settled_fraction", "top1_agreement",
    "mean_settle_layer", "block_flops", "head_flops", "exits": [{"threshold", "mean_exit_layer",
    "saved_block_fraction", "saved_flops_fraction", "agreement"}]}``."""
    return {
        "kind": res.kind, "n_positions": res.n_positions, "n_layers": res.n_layers, "min_layer": res.min_layer,
        "histogram": res.histogram.tolist(),
        "settled_fraction": [rnd(x, 6) for x in res.settled_fraction.tolist()],
        "top1_agreement": [rnd(x, 6) for x in res.top1_agreement.tolist()],
        "mean_settle_layer": rnd(res.settle_layer.float().mean(), 4),
        "block_flops": res.block_flops, "head_flops": res.head_flops,
        "exits": [{"threshold": x.threshold, "mean_exit_layer": rnd(x.mean_exit_layer, 4),
                   "saved_block_fraction": rnd(x.saved_block_fraction, 6),
                   "saved_flops_fraction": rnd(x.saved_flops_fraction, 6), "agreement": rnd(x.agreement, 6)}
                  for x in res.exits],
    }


def settle_tables(res: SettleResult) -> list:
    L = res.n_layers
    t = Table(title=f"{res.kind} lens: where the top-1 settles ({res.n_positions} positions, {L} blocks)",
              title_justify="left")
    for c in ("layer", "settles here", "settled by", "top-1 = final"):
        t.add_column(c, justify="right")
    for layer in range(L + 1):
        t.add_row(str(layer), str(int(res.histogram[layer])), f"{float(res.settled_fraction[layer]):.1%}",
                  f"{float(res.top1_agreement[layer]):.1%}")
    x = Table(title=(f"early exit at a confidence threshold, checked from layer {res.min_layer} "
                     f"(lens read: {res.head_flops / 1e6:.2f} MFLOP, "
                     f"block: {res.block_flops / 1e6:.2f} MFLOP per token)"), title_justify="left")
    for c in ("threshold", "mean exit layer", "blocks saved", "FLOPs saved (net)", "agreement"):
        x.add_column(c, justify="right")
    for e in res.exits:
        x.add_row(f"{e.threshold:g}", f"{e.mean_exit_layer:.2f}", f"{e.saved_block_fraction:.1%}",
                  f"{e.saved_flops_fraction:+.1%}", f"{e.agreement:.1%}")
    return [t, x]


# one quantity per y axis: positions (shares of the corpus positions) or compute (shares of a forward pass)
POSITIONS = "share of positions"


COMPUTE = "FLOPs saved (share of a forward)"


def settle_panels(res: SettleResult) -> list[dict]:
    """The settle figure as three panels, each ``{"title", "x_title", "y_title", "traces": [{"name", "x",
    "y", "kind" ("bar"|"line"), "quantity"}]}`` with every trace of a panel in the panel's one quantity:
    where the top-1 settles by layer (positions), the top-1 kept by an early exit (positions), and the
    compute it saves before and after the lens reads (compute; net may be negative)."""
    L = res.n_layers
    layers = list(range(L + 1))
    th = [e.threshold for e in res.exits]

    def tr(name, x, y, kind="line", quantity=POSITIONS):
        return {"name": name, "x": x, "y": [float(v) for v in y], "kind": kind, "quantity": quantity}

    return [
        {"title": "where the top-1 settles", "x_title": "stream layer", "y_title": POSITIONS,
         "traces": [tr("settles at this layer", layers, (res.histogram.float() / res.n_positions).tolist(), "bar"),
                    tr("settled by this layer", layers, res.settled_fraction.tolist()),
                    tr("lens top-1 = final", layers, res.top1_agreement.tolist())]},
        {"title": "early exit: top-1 kept", "x_title": "confidence threshold", "y_title": POSITIONS,
         "traces": [tr("exit top-1 = final", th, [e.agreement for e in res.exits])]},
        {"title": "early exit: compute saved", "x_title": "confidence threshold", "y_title": COMPUTE,
         "traces": [tr("blocks skipped (before lens reads)", th, [e.saved_block_fraction for e in res.exits], quantity=COMPUTE),
                    tr("net FLOPs saved (after lens reads)", th, [e.saved_flops_fraction for e in res.exits], quantity=COMPUTE)]},
    ]


def settle_figure(res: SettleResult):
    """Plotly figure of :func:`settle_panels`: three panels side by side, each with its own legend
    below its x-axis title (never over a plot or an axis title), y axes as shares (percent ticks)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = settle_panels(res)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p["title"] for p in panels],
                        horizontal_spacing=0.09)
    colours = iter(["#bbb", "#e4572e", "#17bebb", "#2e86ab", "#76b041", "#9b5de5"])
    for col, p in enumerate(panels, 1):
        legend = "legend" if col == 1 else f"legend{col}"
        for t in p["traces"]:
            c = next(colours)
            kw = dict(x=t["x"], y=t["y"], name=t["name"], legend=legend, meta=t["quantity"],
                      hovertemplate="%{x}: %{y:.1%}")
            fig.add_trace(go.Bar(marker_color=c, **kw) if t["kind"] == "bar"
                          else go.Scatter(mode="lines+markers", line_color=c, marker_size=5, **kw), 1, col)
        fig.update_xaxes(title_text=p["x_title"], title_standoff=4, row=1, col=col)
        fig.update_yaxes(title_text=p["y_title"], title_standoff=4, tickformat=".0%", row=1, col=col,
                         range=[-0.03, 1.03] if p["y_title"] == POSITIONS else None)
        dom = fig.layout[f"xaxis{'' if col == 1 else col}"].domain
        fig.layout[legend] = dict(orientation="v", x=dom[0], xanchor="left", y=-0.17, yanchor="top",
                                  bgcolor="rgba(0,0,0,0)")
    fig.add_hline(y=0, line_dash="dot", line_color="#888", row=1, col=len(panels))
    fig.update_layout(height=450, margin=dict(l=60, r=20, t=40, b=100), bargap=0.2)
    return fig


def write_settle_plot(res: SettleResult, path) -> None:
    """Write the settle figure to ``path`` (``.html``: plotly with plotly.js inlined; ``.png``/``.svg``/
    ``.pdf``: matplotlib, the same three panels), through :func:`vocablens.files.atomic_path` (an existing
    file is replaced only once the new one is complete).

    Raises:
        WriteFailed: the directory is missing, read-only or full.
    """
    with atomic_path(path) as tmp:
        if tmp.suffix.lower() in (".html", ".htm"):
            settle_figure(res).write_html(tmp, include_plotlyjs=True, full_html=True)
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import PercentFormatter

        panels = settle_panels(res)
        fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.2))
        for ax, p in zip(axes, panels):
            handles = [ax.bar(t["x"], t["y"], color="#bbb", label=t["name"]) if t["kind"] == "bar"
                       else ax.plot(t["x"], t["y"], marker="o", markersize=3, label=t["name"])[0]
                       for t in p["traces"]]
            ax.set(title=p["title"], xlabel=p["x_title"], ylabel=p["y_title"])
            if p["y_title"] == POSITIONS:
                ax.set_ylim(-0.03, 1.03)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
        axes[-1].axhline(0, color="#888", linestyle=":")
        fig.suptitle(f"{res.kind} lens, {res.n_positions} positions")
        fig.tight_layout()
        fig.savefig(tmp)
        plt.close(fig)


def settle_section(res: SettleResult, div_id: str = "settle-curve") -> Section:
    """Report section: the settle curve and the early-exit table."""
    rows = [[f"{e.threshold:g}", f"{e.mean_exit_layer:.2f}", f"{e.saved_block_fraction:.1%}",
             f"{e.saved_flops_fraction:+.1%}", f"{e.agreement:.1%}"] for e in res.exits]
    html = (f"<p>Over {res.n_positions} corpus positions, the first layer from which the {esc(res.kind)} lens's "
            f"top-1 equals the model's final top-1 and stays (mean {float(res.settle_layer.float().mean()):.2f} of "
            f"{res.n_layers}). An early exit stops at the first layer whose lens top-1 probability reaches the "
            f"threshold (checked from layer {res.min_layer}); net FLOPs count the lens read ({res.head_flops / 1e6:.2f} MFLOP per token) at every "
            f"checked layer against {res.block_flops / 1e6:.2f} MFLOP per block.</p>"
            + figure_html(settle_figure(res), div_id)
            + table_html(["threshold", "mean exit layer", "blocks saved", "FLOPs saved (net)", "agreement"], rows))
    return Section(id="settle", title="Where predictions settle (early exit)", html=html)


# ---------- the renderers of a settle result (vocablens.handle.results.Settle)
def _json_of(r) -> dict:
    d = settle_to_dict(r.value)
    d.update({"corpus": r.options.get("corpus"), "plot": r.options.get("plot"), **model_of(r)})
    return d


def _print_of(r, out) -> None:
    for t in settle_tables(r.value):
        out.print(t)


def _figure_of(r):
    """The report's settle panels."""
    return settle_figure(r.value)


def _rows_of(r) -> list[dict]:
    """A row per stream layer 0..L: positions that settle there (``histogram``), the fraction settled
    at or before it, and the lens top-1's agreement with the final top-1 there."""
    res = r.value
    return [{"layer": layer, "histogram": int(h), "settled_fraction": float(s), "top1_agreement": float(a)}
            for layer, (h, s, a) in enumerate(zip(res.histogram.tolist(), res.settled_fraction.tolist(),
                                                  res.top1_agreement.tolist()))]


#: how a ``settle`` result shows itself
RENDERER = Renderer("settle", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "COMPUTE", "POSITIONS", "settle_figure", "settle_panels", "settle_section", "settle_tables", "settle_to_dict", "write_settle_plot"]
