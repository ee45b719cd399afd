"""The rows of :meth:`vocablens.handle.Result.to_pandas`: one plain dict per item of a tabular result,
the columns named as the result's fields (and its ``--json``) name them.

One function per kind of result (:data:`ROWS`), each reading the result's own fields (``r.value``,
``r.tokenizer``, ``r.options``): a row per token, position, layer, block, vector or word, as the
result is laid out. Values are the result's own (tensors read as Python numbers, not rounded), token
ids decoded beside the ids. No pandas here: :func:`vocablens.render.shown.to_pandas` builds the frame.
"""

from __future__ import annotations

from typing import Callable

from vocablens.errors import BadInput
from vocablens.models.tokens import token_str


def _tokens(r, ids) -> list[str]:
    return [token_str(r.tokenizer, int(i)) for i in ids]


def _record(r) -> list[dict]:
    """A result that is one record (anatomy, tie check): one row of its scalar fields."""
    return [{k: v for k, v in r.value.to_dict().items() if not isinstance(v, (dict, list))}]


def _neighbors(r) -> list[dict]:
    """A row per (query, matrix, rank): the neighbour's id, token and cosine."""
    rows = []
    for q in r.value.results:
        for lst in q.lists:
            for rank, (i, c) in enumerate(zip(lst.ids.tolist(), lst.cosines.tolist()), start=1):
                rows.append({"query": q.query, "matrix": lst.matrix, "rank": rank, "id": int(i),
                             "token": token_str(r.tokenizer, int(i)), "cosine": float(c)})
    return rows


def _pca(r) -> list[dict]:
    """A row per word: its group, id and coordinates on the three principal directions."""
    wp = r.value
    return [{"word": w, "group": g, "id": int(i), "pc1": float(c[0]), "pc2": float(c[1]), "pc3": float(c[2])}
            for w, g, i, c in zip(wp.words, wp.groups, wp.pca.ids.tolist(), wp.pca.coords.tolist())]


def _lens(r) -> list[dict]:
    """A row per (prompt, kind, layer, position read): the top-1 token, its probability, entropy and
    KL to the final distribution (nats), the rank of the final top-1."""
    rows = []
    for p, per_kind in enumerate(r.value):
        for res in per_kind:
            for ly in res.layers:
                for j, pos in enumerate(res.positions.tolist()):
                    top = int(ly.top_ids[j, 0])
                    rows.append({"prompt": p, "kind": res.kind, "layer": ly.layer, "position": int(pos),
                                 "token_read": token_str(r.tokenizer, int(res.input_ids[int(pos)])),
                                 "top1_id": top, "top1": token_str(r.tokenizer, top),
                                 "top1_prob": float(ly.top_probs[j, 0]), "entropy": float(ly.entropy[j]),
                                 "kl_to_final": float(ly.kl_to_final[j]),
                                 "final_top1_rank": int(ly.final_top1_rank[j])})
    return rows


def _score(r) -> list[dict]:
    """A row per scored token (position 1.. of the ids): its log-probability and the entropy (nats)."""
    res = r.value
    ids = res.input_ids.tolist()
    return [{"position": j + 1, "id": ids[j + 1], "token": token_str(r.tokenizer, ids[j + 1]),
             "logprob": float(res.logprobs[j]), "entropy": float(res.entropy[j])} for j in range(res.logprobs.numel())]


def _explain(r) -> list[dict]:
    """A row per block: its attention and FFN updates' direct logit attributions (logits), their
    change of the top-1's (and the user's token's) log-probability (nats), per-head attributions and
    the tokens each update promotes most."""
    return [{"block": b.block, "attn_dla": float(b.attn_dla), "mlp_dla": float(b.mlp_dla),
             "attn_bias_dla": float(b.attn_bias_dla), "mlp_bias_dla": float(b.mlp_bias_dla),
             "head_dla": [float(x) for x in b.head_dla.tolist()],
             "attn_dlogprob_top1": float(b.attn_dlogprob_top1), "mlp_dlogprob_top1": float(b.mlp_dlogprob_top1),
             "attn_dlogprob_token": b.attn_dlogprob_token, "mlp_dlogprob_token": b.mlp_dlogprob_token,
             "attn_top_tokens": _tokens(r, b.attn_top_ids), "mlp_top_tokens": _tokens(r, b.mlp_top_ids),
             "sub_update_error": float(b.sub_update_error)} for b in r.value.blocks]


def _project(r) -> list[dict]:
    """A row per vector (value/key vectors, the most interpretable ones), per (direction, vector) of a
    token's search (``direction``: promote / suppress), or per (source, target) pair of a head's circuit:
    the entries of ``project --json``."""
    from vocablens.render import vocab_space as rv

    how = r.options.get("how", "vectors")
    if how == "search":
        d = rv.search_to_dict(r.value, r.tokenizer, r.options.get("tops"))
        return [{"direction": k, **e} for k in ("promote", "suppress") for e in d[k]]
    if how == "circuit":
        return rv.circuit_to_dict(r.value, r.tokenizer)["pairs"]
    d = rv.interpretable_to_dict(r.value, r.tokenizer) if how == "interpretable" else rv.vectors_to_dict(
        r.value, r.tokenizer)
    return d["vectors"]


def _settle(r) -> list[dict]:
    """A row per stream layer 0..L: positions that settle there (``histogram``), the fraction settled
    at or before it, and the lens top-1's agreement with the final top-1 there."""
    res = r.value
    return [{"layer": layer, "histogram": int(h), "settled_fraction": float(s), "top1_agreement": float(a)}
            for layer, (h, s, a) in enumerate(zip(res.histogram.tolist(), res.settled_fraction.tolist(),
                                                  res.top1_agreement.tolist()))]


def _argmax(r) -> list[dict]:
    """A row per vocabulary row: its verdict, the stage that decided it and its margin."""
    from vocablens.argmax.result import STAGES, VERDICTS

    res = r.value.result
    return [{"id": t, "token": token_str(r.tokenizer, t), "verdict": VERDICTS[v],
             "stage": STAGES[s] if s >= 0 else None, "margin": m}
            for t, (v, s, m) in enumerate(zip(res.verdict.tolist(), res.stage.tolist(), res.margin.tolist()))]


def _undertrained(r) -> list[dict]:
    """A row per token listed by ``undertrained --json`` (the verified candidates, lowest indicator
    first): its class, indicator, highest probability when prompted, verdict."""
    from vocablens.render.undertrained import undertrained_to_dict

    return undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts"))["tokens"]


def _generate(r) -> list[dict]:
    """A row per new token: its step (1..), id, token, log-probability (nats), the alternatives kept and,
    under an exit rule, the layer it exited at."""
    res = r.value
    rows = []
    for n, t in enumerate(res.tokens, start=1):
        row = {"step": n, "id": t.id, "token": token_str(r.tokenizer, t.id), "logprob": float(t.logprob),
               "top_tokens": _tokens(r, [i for i, _ in t.top]), "top_logprobs": [float(v) for _, v in t.top]}
        if res.rule is not None:
            row["exit_layer"] = t.exit_layer
        rows.append(row)
    return rows


def _steer(r) -> list[dict]:
    """A row per chosen vector: its role, block, neuron, z-score, factor and top tokens."""
    return [dict(row) for row in r.options["rows"]]


def _surgery(r) -> list[dict]:
    """``expand``: a row per added token (id, its old tokenization, the init, and where it lands on the
    under-training indicator). A trim's record is not tabular."""
    o = r.options
    if o["command"] != "expand":
        raise BadInput("a trim's record is not tabular; .to_json() holds it")
    ind = {t["id"]: t for t in o["indicator"]["new_tokens"]}
    return [{"token": nt.token, "id": nt.id, "old_pieces": list(nt.old_pieces), "init": nt.init,
             "fallback": nt.fallback, "in_padding_row": nt.in_padding_row,
             "indicator": ind.get(nt.id, {}).get("value"), "percentile": ind.get(nt.id, {}).get("percentile"),
             "looks_undertrained": ind.get(nt.id, {}).get("looks_undertrained")} for nt in r.value.new_tokens]


def _trajectory(r) -> list[dict]:
    """A row per (lens kind, stream layer): the followed token's rank there (0 = on top), its
    probability, and the lens's top-1 token."""
    rows = []
    for kind, t in r.value.items():
        if t is None:
            continue
        for layer, (rank, lp, top) in enumerate(zip(t.target_rank.tolist(), t.logprob.exp().tolist(),
                                                    t.topk_ids[:, 0].tolist())):
            rows.append({"kind": kind, "layer": layer, "rank": int(rank), "prob": float(lp), "top1_id": int(top),
                         "top1": token_str(r.tokenizer, int(top))})
    return rows


def _bottleneck(r) -> list[dict]:
    """A row per singular value (index 1..): of W_U (``sigma_W``) and of the log-probabilities over the
    contexts (``sigma_logprobs``; None past that spectrum's length)."""
    w, a = r.value.sigma_W.tolist(), r.value.sigma_A.tolist()
    return [{"index": i + 1, "sigma_W": w[i] if i < len(w) else None, "sigma_logprobs": a[i] if i < len(a) else None}
            for i in range(max(len(w), len(a)))]


def _align(r) -> list[dict]:
    """A row per best-matching pair of units listed (``align --json``'s ``best_matches``)."""
    return [dict(p) for p in r.options["best"]]


def _anomaly(r) -> list[dict]:
    """A row per test input: its index, label and text, and a column per ``kind/detector`` score."""
    o, rep = r.options, r.value
    return [{"index": i, "label": None if o["labels"] is None else int(o["labels"][i]), "text": o["texts"][i],
             **{k: float(v[i]) for k, v in rep.scores.items()}} for i in range(rep.n_test)]


def _lens_train(r) -> list[dict]:
    """A row per optimizer step run: its loss (nats summed over layers), per-layer losses, tokens seen,
    tokens/s, learning rate and gradient norm (before clipping)."""
    return [{"step": h.step, "loss": h.loss, "layer_loss": list(h.layer_loss), "tokens": h.tokens,
             "tokens_per_s": h.tokens_per_s, "lr": h.lr, "grad_norm": h.grad_norm} for h in r.value.history]


def _lens_eval(r) -> list[dict]:
    """A row per (lens, stream layer): KL to the final distribution, cross-entropy (nats), bits per
    byte, entropy (nats) and top-1 agreement, as ``lens eval --json`` names them."""
    return [{"kind": kind, "layer": ly["layer"], **ly[kind]} for kind in ("logit", "tuned")
            for ly in r.value.to_dict()["layers"]]


#: kind -> the rows of its frame
ROWS: dict[str, Callable[..., list[dict]]] = {
    "anatomy": _record, "tie_check": _record, "neighbors": _neighbors, "pca": _pca, "lens": _lens,
    "score": _score, "explain": _explain, "project": _project, "settle": _settle, "argmax": _argmax,
    "undertrained": _undertrained, "generate": _generate, "steer": _steer, "surgery": _surgery,
    "trajectory": _trajectory, "bottleneck": _bottleneck, "align": _align, "anomaly": _anomaly,
    "lens_train": _lens_train, "lens_eval": _lens_eval,
}


__all__ = ["ROWS"]
