"""Rendering of update readings: one prediction explained, and where predictions settle (JSON-ready
dicts, rich tables, the settle figure, report sections). Computes nothing."""

from __future__ import annotations

from rich.table import Table

from vocablens.files import atomic_path
from vocablens.models.tokens import quoted, token_str
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.tokens import LEGEND, shown
from vocablens.render.vocab_space._fmt import join, rnd, toks
from vocablens.vocab_space import Explanation, SettleResult


def explanation_to_dict(e: Explanation, tokenizer) -> dict:
    """All of :class:`~vocablens.vocab_space.Explanation` as plain data (tokens as readable strings):
    ``{"tokens", "position", ..., "blocks": [{"block", "attn_dla", "mlp_dla", "head_dla", "sub_updates":
    [{"block", "neuron", ...}], ...}]}``, one entry per block 0..L-1 (block i reads stream layer i and
    writes layer i+1)."""
    def tok(i):
        return None if i is None else token_str(tokenizer, i)

    blocks = []
    for ly in e.blocks:
        blocks.append({
            "block": ly.block,
            "attn_dlogprob_top1": rnd(ly.attn_dlogprob_top1, 6), "mlp_dlogprob_top1": rnd(ly.mlp_dlogprob_top1, 6),
            "attn_dlogprob_token": None if ly.attn_dlogprob_token is None else rnd(ly.attn_dlogprob_token, 6),
            "mlp_dlogprob_token": None if ly.mlp_dlogprob_token is None else rnd(ly.mlp_dlogprob_token, 6),
            "attn_dla": rnd(ly.attn_dla, 6), "mlp_dla": rnd(ly.mlp_dla, 6),
            "head_dla": [rnd(x, 6) for x in ly.head_dla.tolist()],
            "attn_bias_dla": rnd(ly.attn_bias_dla, 6), "mlp_bias_dla": rnd(ly.mlp_bias_dla, 6),
            "attn_top_tokens": toks(tokenizer, ly.attn_top_ids), "mlp_top_tokens": toks(tokenizer, ly.mlp_top_ids),
            "sub_updates": [{"block": s.block, "neuron": s.neuron, "activation": rnd(s.activation, 6),
                             "dla": rnd(s.dla, 6), "dla_target": rnd(s.dla_target, 6), "top_tokens": toks(tokenizer, s.top_ids),
                             "top_ids": [int(i) for i in s.top_ids]}
                            for s in ly.sub_updates],
            "sub_update_error": ly.sub_update_error,
        })
    return {
        "tokens": toks(tokenizer, e.input_ids), "position": e.position,
        "top1": tok(e.top1), "top1_logprob": rnd(e.top1_logprob, 6),
        "token": tok(e.token), "token_logprob": None if e.token_logprob is None else rnd(e.token_logprob, 6),
        "target": tok(e.target), "target_id": int(e.target), "contrast": tok(e.contrast),
        "logit_diff_model": rnd(e.logit_diff_model, 6), "logit_diff_sum": rnd(e.logit_diff_sum, 6),
        "logit_target_model": rnd(e.logit_target_model, 6), "logit_target_sum": rnd(e.logit_target_sum, 6),
        "embed_dla": rnd(e.embed_dla, 6), "const_dla": rnd(e.const_dla, 6),
        "resid_error": e.resid_error, "final_sigma": rnd(e.final_sigma, 6), "softcap": e.softcap,
        "approximation": e.approximation, "blocks": blocks,
    }


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


def explanation_tables(e: Explanation, tokenizer) -> list:
    """Two tables: per-block updates, and the largest FFN sub-updates overall."""
    tgt, con = token_str(tokenizer, e.target), token_str(tokenizer, e.contrast)
    top1 = token_str(tokenizer, e.top1)
    t = Table(title=(f"position {e.position}: top-1 {quoted(top1)} (log p {e.top1_logprob:.3f}); DLA of logit[{quoted(tgt)}, id {int(e.target)}] - "
                     f"logit[{quoted(con)}]"), title_justify="left")
    cols = ["block", "Δlogp top-1 attn", "Δlogp top-1 mlp"]
    if e.token is not None:
        cols += ["Δlogp token attn", "Δlogp token mlp"]
    cols += ["DLA attn", "top head", "DLA mlp", "mlp promotes"]
    for c in cols:
        t.add_column(c, justify="left" if "promotes" in c else "right")
    for ly in e.blocks:
        h = int(ly.head_dla.abs().argmax())
        row = [str(ly.block), f"{ly.attn_dlogprob_top1:+.3f}", f"{ly.mlp_dlogprob_top1:+.3f}"]
        if e.token is not None:
            row += [f"{ly.attn_dlogprob_token:+.3f}", f"{ly.mlp_dlogprob_token:+.3f}"]
        row += [f"{ly.attn_dla:+.3f}", f"h{h} {float(ly.head_dla[h]):+.3f}", f"{ly.mlp_dla:+.3f}",
                join(toks(tokenizer, ly.mlp_top_ids), 3)]
        t.add_row(*row)
    s = Table(title="largest FFN sub-updates (activation x value vector) by |DLA|", title_justify="left")
    for c in ("block", "neuron", "activation", "DLA", "promotes"):
        s.add_column(c, justify="left" if c == "promotes" else "right")
    subs = sorted((x for ly in e.blocks for x in ly.sub_updates), key=lambda x: -abs(x.dla))[:12]
    for x in subs:
        s.add_row(str(x.block), str(x.neuron), f"{x.activation:+.3f}", f"{x.dla:+.3f}", join(toks(tokenizer, x.top_ids), 5))
    return [t, s]


def explanation_footer(e: Explanation) -> str:
    return (f"sum of contributions {e.logit_diff_sum:.4f} vs the model's logit difference {e.logit_diff_model:.4f} "
            f"(embedding {e.embed_dla:+.3f}, biases {e.const_dla:+.3f}); {e.approximation}"
            + ("; before the final softcap" if e.softcap else ""))


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


def attribution_figure(e: Explanation, tokenizer):
    """The explorer's attribution plot (``serve/static/app.js``, a cell's "what built it" panel) of one
    explanation: per block 0..L-1, the direct logit attribution (logits) of the attention update and of
    the FFN update to ``logit[target] - logit[contrast]``, stacked bars (Geva et al. 2022; Elhage et al.
    2021). The same traces and axes as the explorer's, with a title naming the target, the contrast and
    the position (the explorer says them beside the plot)."""
    import plotly.graph_objects as go

    blocks = [b.block for b in e.blocks]
    fig = go.Figure([
        go.Bar(x=blocks, y=[float(b.attn_dla) for b in e.blocks], name="attention", marker={"color": "#0b5cad"}),
        go.Bar(x=blocks, y=[float(b.mlp_dla) for b in e.blocks], name="FFN", marker={"color": "#e4572e"}),
    ])
    tgt, con = shown(token_str(tokenizer, e.target)), shown(token_str(tokenizer, e.contrast))
    fig.update_layout(title=f"logit[{tgt}] − logit[{con}] at position {e.position}: direct attribution per block",
                      barmode="relative", margin={"l": 50, "r": 10, "t": 60, "b": 40}, height=340,
                      legend={"orientation": "h", "y": 1.12}, xaxis={"title": {"text": "block"}},
                      yaxis={"title": {"text": "direct logit attribution"}})
    return fig


def explanation_section(e: Explanation, tokenizer, prompt: str | None = None) -> Section:
    """Report section: per-block updates and the largest sub-updates behind the report prompt's prediction."""
    tgt, con = token_str(tokenizer, e.target), token_str(tokenizer, e.contrast)
    rows = []
    for ly in e.blocks:
        h = int(ly.head_dla.abs().argmax())
        rows.append([ly.block, f"{ly.attn_dlogprob_top1:+.3f}", f"{ly.mlp_dlogprob_top1:+.3f}",
                     f"{ly.attn_dla:+.3f}", f"h{h} {float(ly.head_dla[h]):+.3f}", f"{ly.mlp_dla:+.3f}",
                     " ".join(shown(t) for t in toks(tokenizer, ly.mlp_top_ids)[:4])])
    subs = sorted((x for ly in e.blocks for x in ly.sub_updates), key=lambda x: -abs(x.dla))[:10]
    srows = [[x.block, x.neuron, f"{x.activation:+.3f}", f"{x.dla:+.3f}",
              " ".join(shown(t) for t in toks(tokenizer, x.top_ids)[:5])] for x in subs]
    head = f"<p>Prompt: <code>{esc(prompt)}</code>. " if prompt else "<p>"
    html = (head + f"The model's top-1 is <code>{esc(shown(token_str(tokenizer, e.top1)))}</code> "
            f"(log p = {e.top1_logprob:.3f}). Per block (block i reads stream layer i and writes layer i+1): the change in the logit-lens log-probability of the "
            f"top-1 when the attention and then the FFN update are added, and direct logit attribution (DLA) to "
            f"logit[{esc(shown(tgt))}] − logit[{esc(shown(con))}]. {esc(LEGEND)} The contributions sum to "
            f"{e.logit_diff_sum:.4f}; the model's logit difference is {e.logit_diff_model:.4f}. "
            f"Approximation: {esc(e.approximation)}.</p>"
            + table_html(["block", "Δlogp attn", "Δlogp mlp", "DLA attn", "top head", "DLA mlp", "mlp promotes"], rows)
            + "<p>The FFN sub-updates (activation × value vector) with the largest direct effect:</p>"
            + table_html(["block", "neuron", "activation", "DLA", "promotes"], srows))
    return Section(id="explain", title="What built the prediction", html=html)


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
