"""Rendering of vocabulary-space results: JSON-ready dicts, rich tables, plotly figures, report sections.

Computes nothing: every number comes from a :mod:`vocablens.vocab_space` result.
"""

from __future__ import annotations

from rich.table import Table

from vocablens.models.tokens import quoted, token_str
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.vocab_space import (
    Explanation, HeadCircuit, SettleResult, TokenSearch, VectorProjection,
)


def _toks(tokenizer, ids) -> list[str]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [token_str(tokenizer, i) if tokenizer is not None else str(int(i)) for i in ids]


def _r(x: float, n: int = 4) -> float:
    return round(float(x), n)


# ---------------------------------------------------------------------------------------------- JSON
def vectors_to_dict(res: VectorProjection, tokenizer) -> dict:
    """``{"kind", "apply_norm_gain", "vectors": [{"layer", "neuron", "norm", "top_tokens", "top_ids",
    "top_scores", "bottom_tokens", "bottom_ids", "bottom_scores"}]}``."""
    rows = []
    for j in range(len(res.layers)):
        rows.append({
            "layer": int(res.layers[j]), "neuron": int(res.neurons[j]), "norm": _r(res.norms[j], 6),
            "top_tokens": _toks(tokenizer, res.top_ids[j]), "top_ids": res.top_ids[j].tolist(),
            "top_scores": [_r(x, 6) for x in res.top_scores[j].tolist()],
            "bottom_tokens": _toks(tokenizer, res.bottom_ids[j]), "bottom_ids": res.bottom_ids[j].tolist(),
            "bottom_scores": [_r(x, 6) for x in res.bottom_scores[j].tolist()],
        })
    return {"mode": "vectors", "kind": res.kind, "apply_norm_gain": res.apply_norm_gain, "vectors": rows}


def search_to_dict(res: TokenSearch, tokenizer, tops: VectorProjection | None = None) -> dict:
    """``{"token", "token_id", "promote": [{"layer", "neuron", "score", "top_tokens"}], "suppress": [...]}``;
    ``top_tokens`` (what each found vector promotes) when ``tops`` holds their projection (promote rows
    first, then suppress rows)."""
    k = len(res.promote_scores)

    def rows(layers, neurons, scores, off):
        out = []
        for j in range(len(scores)):
            d = {"layer": int(layers[j]), "neuron": int(neurons[j]), "score": _r(scores[j], 6)}
            if tops is not None:
                d["top_tokens"] = _toks(tokenizer, tops.top_ids[off + j])
            out.append(d)
        return out

    return {"mode": "token", "token": token_str(tokenizer, res.token_id) if tokenizer is not None else None,
            "token_id": res.token_id, "apply_norm_gain": res.apply_norm_gain,
            "promote": rows(res.promote_layers, res.promote_neurons, res.promote_scores, 0),
            "suppress": rows(res.suppress_layers, res.suppress_neurons, res.suppress_scores, k)}


def circuit_to_dict(res: HeadCircuit, tokenizer) -> dict:
    """``{"layer", "head", "kv_head", "circuit", "self_top1_fraction", "n_sources", "pairs": [{"source",
    "target", "source_id", "target_id", "score"}]}``."""
    src, tgt = _toks(tokenizer, res.src_ids), _toks(tokenizer, res.tgt_ids)
    return {"mode": "head", "layer": res.layer, "head": res.head, "kv_head": res.kv_head, "circuit": res.circuit,
            "apply_norm_gain": res.apply_norm_gain, "self_top1_fraction": _r(res.self_top1_fraction, 6),
            "n_sources": res.n_sources,
            "pairs": [{"source": s, "target": t, "source_id": int(si), "target_id": int(ti), "score": _r(sc, 6)}
                      for s, t, si, ti, sc in zip(src, tgt, res.src_ids.tolist(), res.tgt_ids.tolist(),
                                                  res.scores.tolist())]}


def explanation_to_dict(e: Explanation, tokenizer) -> dict:
    """All of :class:`~vocablens.vocab_space.Explanation` as plain data (tokens as readable strings)."""
    def tok(i):
        return None if i is None else token_str(tokenizer, i)

    layers = []
    for ly in e.layers:
        layers.append({
            "layer": ly.layer,
            "attn_dlogprob_top1": _r(ly.attn_dlogprob_top1, 6), "mlp_dlogprob_top1": _r(ly.mlp_dlogprob_top1, 6),
            "attn_dlogprob_token": None if ly.attn_dlogprob_token is None else _r(ly.attn_dlogprob_token, 6),
            "mlp_dlogprob_token": None if ly.mlp_dlogprob_token is None else _r(ly.mlp_dlogprob_token, 6),
            "attn_dla": _r(ly.attn_dla, 6), "mlp_dla": _r(ly.mlp_dla, 6),
            "head_dla": [_r(x, 6) for x in ly.head_dla.tolist()],
            "attn_bias_dla": _r(ly.attn_bias_dla, 6), "mlp_bias_dla": _r(ly.mlp_bias_dla, 6),
            "attn_top_tokens": _toks(tokenizer, ly.attn_top_ids), "mlp_top_tokens": _toks(tokenizer, ly.mlp_top_ids),
            "sub_updates": [{"neuron": s.neuron, "activation": _r(s.activation, 6), "dla": _r(s.dla, 6),
                             "dla_target": _r(s.dla_target, 6), "top_tokens": _toks(tokenizer, s.top_ids)}
                            for s in ly.sub_updates],
            "sub_update_error": ly.sub_update_error,
        })
    return {
        "tokens": _toks(tokenizer, e.input_ids), "position": e.position,
        "top1": tok(e.top1), "top1_logprob": _r(e.top1_logprob, 6),
        "token": tok(e.token), "token_logprob": None if e.token_logprob is None else _r(e.token_logprob, 6),
        "target": tok(e.target), "contrast": tok(e.contrast),
        "logit_diff_model": _r(e.logit_diff_model, 6), "logit_diff_sum": _r(e.logit_diff_sum, 6),
        "logit_target_model": _r(e.logit_target_model, 6), "logit_target_sum": _r(e.logit_target_sum, 6),
        "embed_dla": _r(e.embed_dla, 6), "const_dla": _r(e.const_dla, 6),
        "resid_error": e.resid_error, "final_sigma": _r(e.final_sigma, 6), "softcap": e.softcap,
        "approximation": e.approximation, "layers": layers,
    }


def settle_to_dict(res: SettleResult) -> dict:
    """``{"kind", "n_positions", "n_layers", "histogram", "settled_fraction", "top1_agreement",
    "mean_settle_layer", "block_flops", "head_flops", "exits": [{"threshold", "mean_exit_layer",
    "saved_block_fraction", "saved_flops_fraction", "agreement"}]}``."""
    return {
        "kind": res.kind, "n_positions": res.n_positions, "n_layers": res.n_layers, "min_layer": res.min_layer,
        "histogram": res.histogram.tolist(),
        "settled_fraction": [_r(x, 6) for x in res.settled_fraction.tolist()],
        "top1_agreement": [_r(x, 6) for x in res.top1_agreement.tolist()],
        "mean_settle_layer": _r(res.settle_layer.float().mean(), 4),
        "block_flops": res.block_flops, "head_flops": res.head_flops,
        "exits": [{"threshold": x.threshold, "mean_exit_layer": _r(x.mean_exit_layer, 4),
                   "saved_block_fraction": _r(x.saved_block_fraction, 6),
                   "saved_flops_fraction": _r(x.saved_flops_fraction, 6), "agreement": _r(x.agreement, 6)}
                  for x in res.exits],
    }


# ---------------------------------------------------------------------------------------------- rich
def _join(toks: list[str], n: int = 8) -> str:
    return " ".join(quoted(t) for t in toks[:n])


def vectors_table(res: VectorProjection, tokenizer, n: int = 8) -> Table:
    how = "value vectors through the unembedding" if res.kind == "value" else "key vectors against the input embedding"
    gain = " (final-norm gain applied)" if res.apply_norm_gain else ""
    t = Table(title=f"FFN {how}{gain}", title_justify="left")
    for c, j in (("layer", "right"), ("neuron", "right"), ("norm", "right"), ("promotes", "left"), ("suppresses", "left")):
        t.add_column(c, justify=j)
    for j in range(len(res.layers)):
        t.add_row(str(int(res.layers[j])), str(int(res.neurons[j])), f"{float(res.norms[j]):.3f}",
                  _join(_toks(tokenizer, res.top_ids[j]), n), _join(_toks(tokenizer, res.bottom_ids[j]), n))
    return t


def search_table(res: TokenSearch, tokenizer, tops: VectorProjection | None = None) -> Table:
    t = Table(title=f"value vectors that promote / suppress {quoted(token_str(tokenizer, res.token_id))}", title_justify="left")
    for c, j in (("", "left"), ("layer", "right"), ("neuron", "right"), ("score", "right"), ("vector's top tokens", "left")):
        t.add_column(c, justify=j)
    k = len(res.promote_scores)
    for name, L, N, S, off in (("promote", res.promote_layers, res.promote_neurons, res.promote_scores, 0),
                               ("suppress", res.suppress_layers, res.suppress_neurons, res.suppress_scores, k)):
        for j in range(len(S)):
            tops_s = _join(_toks(tokenizer, tops.top_ids[off + j]), 6) if tops is not None else ""
            t.add_row(name if j == 0 else "", str(int(L[j])), str(int(N[j])), f"{float(S[j]):+.4f}", tops_s)
    return t


def circuit_table(res: HeadCircuit, tokenizer) -> Table:
    what = "source -> promoted token" if res.circuit == "ov" else "query token -> key token"
    t = Table(title=(f"layer {res.layer} head {res.head} (kv head {res.kv_head}) {res.circuit.upper()} circuit, "
                     f"{what}; self top-1 for {res.self_top1_fraction:.1%} of {res.n_sources} sources"),
              title_justify="left")
    for c, j in (("source", "left"), ("target", "left"), ("score", "right")):
        t.add_column(c, justify=j)
    for s, g, sc in zip(_toks(tokenizer, res.src_ids), _toks(tokenizer, res.tgt_ids), res.scores.tolist()):
        t.add_row(quoted(s), quoted(g), f"{sc:.4f}")
    return t


def explanation_tables(e: Explanation, tokenizer) -> list:
    """Two tables: per-layer updates, and the largest FFN sub-updates overall."""
    tgt, con = token_str(tokenizer, e.target), token_str(tokenizer, e.contrast)
    top1 = token_str(tokenizer, e.top1)
    t = Table(title=(f"position {e.position}: top-1 {quoted(top1)} (log p {e.top1_logprob:.3f}); DLA of logit[{quoted(tgt)}] - "
                     f"logit[{quoted(con)}]"), title_justify="left")
    cols = ["layer", "Δlogp top-1 attn", "Δlogp top-1 mlp"]
    if e.token is not None:
        cols += ["Δlogp token attn", "Δlogp token mlp"]
    cols += ["DLA attn", "top head", "DLA mlp", "mlp promotes"]
    for c in cols:
        t.add_column(c, justify="left" if "promotes" in c else "right")
    for ly in e.layers:
        h = int(ly.head_dla.abs().argmax())
        row = [str(ly.layer), f"{ly.attn_dlogprob_top1:+.3f}", f"{ly.mlp_dlogprob_top1:+.3f}"]
        if e.token is not None:
            row += [f"{ly.attn_dlogprob_token:+.3f}", f"{ly.mlp_dlogprob_token:+.3f}"]
        row += [f"{ly.attn_dla:+.3f}", f"h{h} {float(ly.head_dla[h]):+.3f}", f"{ly.mlp_dla:+.3f}",
                _join(_toks(tokenizer, ly.mlp_top_ids), 3)]
        t.add_row(*row)
    s = Table(title="largest FFN sub-updates (activation x value vector) by |DLA|", title_justify="left")
    for c in ("layer", "neuron", "activation", "DLA", "promotes"):
        s.add_column(c, justify="left" if c == "promotes" else "right")
    subs = sorted((x for ly in e.layers for x in ly.sub_updates), key=lambda x: -abs(x.dla))[:12]
    for x in subs:
        s.add_row(str(x.layer), str(x.neuron), f"{x.activation:+.3f}", f"{x.dla:+.3f}", _join(_toks(tokenizer, x.top_ids), 5))
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


# ---------------------------------------------------------------------------------------------- figures
def settle_figure(res: SettleResult):
    """Plotly figure: settled fraction and top-1 agreement by layer, and the exit trade-off per threshold."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    L = res.n_layers
    fig = make_subplots(rows=1, cols=2, subplot_titles=("where the top-1 settles", "early exit by threshold"))
    layers = list(range(L + 1))
    fig.add_trace(go.Bar(x=layers, y=(res.histogram.float() / res.n_positions).tolist(), name="settles at layer",
                         marker_color="#bbb"), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=res.settled_fraction.tolist(), name="settled by layer", mode="lines+markers"), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=res.top1_agreement.tolist(), name="top-1 = final", mode="lines"), 1, 1)
    th = [e.threshold for e in res.exits]
    fig.add_trace(go.Scatter(x=th, y=[e.saved_block_fraction for e in res.exits], name="blocks saved",
                             mode="lines+markers"), 1, 2)
    fig.add_trace(go.Scatter(x=th, y=[e.saved_flops_fraction for e in res.exits], name="FLOPs saved (net)",
                             mode="lines+markers"), 1, 2)
    fig.add_trace(go.Scatter(x=th, y=[e.agreement for e in res.exits], name="agreement kept",
                             mode="lines+markers"), 1, 2)
    fig.update_xaxes(title_text="stream layer", row=1, col=1)
    fig.update_xaxes(title_text="confidence threshold", row=1, col=2)
    fig.update_yaxes(title_text="fraction of positions", row=1, col=1)
    fig.update_layout(height=420, margin=dict(l=40, r=20, t=40, b=40), legend=dict(orientation="h"))
    return fig


def write_settle_plot(res: SettleResult, path) -> None:
    """Write the settle figure to ``path`` (``.html``: plotly with plotly.js inlined; ``.png``/``.svg``/
    ``.pdf``: matplotlib), through a temporary file renamed into place."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    suffix = path.suffix.lower()
    fd, tmp = tempfile.mkstemp(prefix=".vocablens-", suffix=suffix, dir=str(path.parent or "."))
    os.close(fd)
    try:
        if suffix in (".html", ".htm"):
            settle_figure(res).write_html(tmp, include_plotlyjs=True, full_html=True)
        else:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
            L = res.n_layers
            a.bar(range(L + 1), (res.histogram.float() / res.n_positions).tolist(), color="#bbb", label="settles at layer")
            a.plot(range(L + 1), res.settled_fraction.tolist(), marker="o", label="settled by layer")
            a.plot(range(L + 1), res.top1_agreement.tolist(), label="top-1 = final")
            a.set_xlabel("stream layer")
            a.set_ylabel("fraction of positions")
            a.legend(fontsize=8)
            th = [e.threshold for e in res.exits]
            b.plot(th, [e.saved_block_fraction for e in res.exits], marker="o", label="blocks saved")
            b.plot(th, [e.saved_flops_fraction for e in res.exits], marker="o", label="FLOPs saved (net)")
            b.plot(th, [e.agreement for e in res.exits], marker="o", label="agreement kept")
            b.set_xlabel("confidence threshold")
            b.legend(fontsize=8)
            fig.suptitle(f"{res.kind} lens, {res.n_positions} positions")
            fig.tight_layout()
            fig.savefig(tmp)
            plt.close(fig)
        from vocablens.render.report import publish_mode
        publish_mode(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---------------------------------------------------------------------------------------------- report
def value_vectors_section(res: VectorProjection, tokenizer, n: int = 8, note: str | None = None) -> Section:
    """Report section: top and bottom tokens of a sample of value vectors per layer (``note`` replaces
    the sentence that introduces the table)."""
    rows = [[int(res.layers[j]), int(res.neurons[j]), f"{float(res.norms[j]):.3f}",
             " ".join(quoted(t) for t in _toks(tokenizer, res.top_ids[j])[:n]),
             " ".join(quoted(t) for t in _toks(tokenizer, res.bottom_ids[j])[:n])] for j in range(len(res.layers))]
    gain = "with the final norm's gain applied" if res.apply_norm_gain else "without the final norm's gain"
    intro = (f"<p>Each FFN neuron writes a fixed <em>value vector</em> (a row of the down projection's "
             f"transpose) scaled by its activation. Read through the unembedding ({esc(gain)}), a value vector "
             f"is a ranking of tokens: what it promotes and what it suppresses (Geva et al. 2022; Dar et al. "
             f"2022). {esc(note) if note else 'A random sample of neurons per layer:'}</p>")
    return Section(id="value-vectors", title="FFN value vectors in vocabulary space",
                   html=intro + table_html(["layer", "neuron", "norm", "promotes", "suppresses"], rows))


def explanation_section(e: Explanation, tokenizer, prompt: str | None = None) -> Section:
    """Report section: per-layer updates and the largest sub-updates behind the report prompt's prediction."""
    tgt, con = token_str(tokenizer, e.target), token_str(tokenizer, e.contrast)
    rows = []
    for ly in e.layers:
        h = int(ly.head_dla.abs().argmax())
        rows.append([ly.layer, f"{ly.attn_dlogprob_top1:+.3f}", f"{ly.mlp_dlogprob_top1:+.3f}",
                     f"{ly.attn_dla:+.3f}", f"h{h} {float(ly.head_dla[h]):+.3f}", f"{ly.mlp_dla:+.3f}",
                     " ".join(quoted(t) for t in _toks(tokenizer, ly.mlp_top_ids)[:4])])
    subs = sorted((x for ly in e.layers for x in ly.sub_updates), key=lambda x: -abs(x.dla))[:10]
    srows = [[x.layer, x.neuron, f"{x.activation:+.3f}", f"{x.dla:+.3f}",
              " ".join(quoted(t) for t in _toks(tokenizer, x.top_ids)[:5])] for x in subs]
    head = f"<p>Prompt: <code>{esc(prompt)}</code>. " if prompt else "<p>"
    html = (head + f"The model's top-1 is <code>{esc(quoted(token_str(tokenizer, e.top1)))}</code> "
            f"(log p = {e.top1_logprob:.3f}). Per layer: the change in the logit-lens log-probability of the "
            f"top-1 when the attention and then the FFN update are added, and direct logit attribution (DLA) to "
            f"logit[{esc(quoted(tgt))}] − logit[{esc(quoted(con))}]. The contributions sum to "
            f"{e.logit_diff_sum:.4f}; the model's logit difference is {e.logit_diff_model:.4f}. "
            f"Approximation: {esc(e.approximation)}.</p>"
            + table_html(["layer", "Δlogp attn", "Δlogp mlp", "DLA attn", "top head", "DLA mlp", "mlp promotes"], rows)
            + "<p>The FFN sub-updates (activation × value vector) with the largest direct effect:</p>"
            + table_html(["layer", "neuron", "activation", "DLA", "promotes"], srows))
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
