"""One prediction explained (``explain``, :meth:`vocablens.Model.explain`): its JSON, tables, attribution
figure, report section and rows, registered as :data:`RENDERER`. Computes nothing."""

from __future__ import annotations

from rich.table import Table

from vocablens.models.tokens import quoted, token_str
from vocablens.render.html import Section, esc, table_html
from vocablens.render.renderer import Renderer, model_of
from vocablens.render.tokens import LEGEND, shown
from vocablens.render.vocab_space._fmt import join, rnd, toks
from vocablens.vocab_space import Explanation


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


# ---------- the renderers of an explain result (vocablens.handle.results.Explanation)
def _json_of(r) -> dict:
    return {**explanation_to_dict(r.value, r.tokenizer), **model_of(r)}


def _print_of(r, out) -> None:
    for t in explanation_tables(r.value, r.tokenizer):
        out.print(t)
    out.print(explanation_footer(r.value), style="dim")


def _figure_of(r):
    """The explorer's attribution bars per block."""
    return attribution_figure(r.value, r.tokenizer)


def _rows_of(r) -> list[dict]:
    """A row per block: its attention and FFN updates' direct logit attributions (logits), their
    change of the top-1's (and the user's token's) log-probability (nats), per-head attributions and
    the tokens each update promotes most."""
    return [{"block": b.block, "attn_dla": float(b.attn_dla), "mlp_dla": float(b.mlp_dla),
             "attn_bias_dla": float(b.attn_bias_dla), "mlp_bias_dla": float(b.mlp_bias_dla),
             "head_dla": [float(x) for x in b.head_dla.tolist()],
             "attn_dlogprob_top1": float(b.attn_dlogprob_top1), "mlp_dlogprob_top1": float(b.mlp_dlogprob_top1),
             "attn_dlogprob_token": b.attn_dlogprob_token, "mlp_dlogprob_token": b.mlp_dlogprob_token,
             "attn_top_tokens": [token_str(r.tokenizer, int(i)) for i in b.attn_top_ids],
             "mlp_top_tokens": [token_str(r.tokenizer, int(i)) for i in b.mlp_top_ids],
             "sub_update_error": float(b.sub_update_error)} for b in r.value.blocks]


#: how an ``explain`` result shows itself
RENDERER = Renderer("explain", _json_of, _print_of, _figure_of, _rows_of)
