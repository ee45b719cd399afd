"""Rendering of parameter readings: FFN value/key vectors, reverse token search, interpretable
vectors and head circuits (JSON-ready dicts, rich tables, report sections). Computes nothing.

The ``project`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from rich.table import Table

from vocablens.models.tokens import quoted, token_str
from vocablens.render.html import Section, esc, table_html
from vocablens.render.tokens import LEGEND, shown
from vocablens.render.vocab_space._fmt import join, rnd, toks
from vocablens.vocab_space import HeadCircuit, InterpretableVectors, TokenSearch, VectorProjection
from vocablens.render.renderer import Renderer, model_of


def vectors_to_dict(res: VectorProjection, tokenizer) -> dict:
    """``{"kind", "apply_norm_gain", "vectors": [{"block", "neuron", "norm", "top_tokens", "top_ids",
    "top_scores", "bottom_tokens", "bottom_ids", "bottom_scores"}]}``."""
    rows = []
    for j in range(len(res.blocks)):
        rows.append({
            "block": int(res.blocks[j]), "neuron": int(res.neurons[j]), "norm": rnd(res.norms[j], 6),
            "top_tokens": toks(tokenizer, res.top_ids[j]), "top_ids": res.top_ids[j].tolist(),
            "top_scores": [rnd(x, 6) for x in res.top_scores[j].tolist()],
            "bottom_tokens": toks(tokenizer, res.bottom_ids[j]), "bottom_ids": res.bottom_ids[j].tolist(),
            "bottom_scores": [rnd(x, 6) for x in res.bottom_scores[j].tolist()],
        })
    return {"mode": "vectors", "kind": res.kind, "apply_norm_gain": res.apply_norm_gain, "vectors": rows}


def _searches(res: TokenSearch | list[TokenSearch]) -> list[TokenSearch]:
    return [res] if isinstance(res, TokenSearch) else list(res)


def search_to_dict(res: TokenSearch | list[TokenSearch], tokenizer, tops: VectorProjection | None = None) -> dict:
    """``{"token", "token_id", "tokens", "token_ids", "criterion", "promote": [{"target", "target_id",
    "block", "neuron", "z", "score", "rank", "top_tokens", "top_ids"}], "suppress": [...]}`` for one search or
    several (``token``/``token_id`` name the first target). ``block`` is the block 0..L-1; ``z`` the ranking
    key; ``score`` the raw logit per unit; ``rank`` the target's rank among the vector's logits (from
    the top for promote rows, from the bottom for suppress rows). ``top_tokens`` (what each vector
    promotes) when ``tops`` holds their projection: per search, its promote rows then its suppress rows."""
    searches = _searches(res)
    off = 0
    promote, suppress = [], []
    for s in searches:
        name = token_str(tokenizer, s.token_id) if tokenizer is not None else None
        for rows, (L, N, Z, S, R) in ((promote, (s.promote_blocks, s.promote_neurons, s.promote_z, s.promote_scores,
                                                  s.promote_ranks)),
                                      (suppress, (s.suppress_blocks, s.suppress_neurons, s.suppress_z,
                                                  s.suppress_scores, s.suppress_ranks))):
            for j in range(len(Z)):
                d = {"target": name, "target_id": s.token_id, "block": int(L[j]), "neuron": int(N[j]),
                     "z": rnd(Z[j], 4), "score": rnd(S[j], 6), "rank": int(R[j])}
                if tops is not None:
                    d["top_tokens"] = toks(tokenizer, tops.top_ids[off + j])
                    d["top_ids"] = tops.top_ids[off + j].tolist()
                rows.append(d)
            off += len(Z)
    first = searches[0]
    return {"mode": "token", "token": token_str(tokenizer, first.token_id) if tokenizer is not None else None,
            "token_id": first.token_id,
            "tokens": [token_str(tokenizer, s.token_id) if tokenizer is not None else None for s in searches],
            "token_ids": [s.token_id for s in searches], "apply_norm_gain": first.apply_norm_gain,
            "criterion": first.criterion, "promote": promote, "suppress": suppress}


def search_vectors(res: TokenSearch | list[TokenSearch]) -> tuple[list[int], list[int]]:
    """``(blocks, neurons)`` of every row of one or several searches, in the order :func:`search_to_dict`
    and :func:`search_table` read ``tops`` (per search: promote rows, then suppress rows)."""
    layers, neurons = [], []
    for s in _searches(res):
        layers += s.promote_blocks.tolist() + s.suppress_blocks.tolist()
        neurons += s.promote_neurons.tolist() + s.suppress_neurons.tolist()
    return layers, neurons


def circuit_to_dict(res: HeadCircuit, tokenizer) -> dict:
    """``{"block", "head", "kv_head", "circuit", "self_top1_fraction", "n_sources", "pairs": [{"source",
    "target", "source_id", "target_id", "score"}]}``."""
    src, tgt = toks(tokenizer, res.src_ids), toks(tokenizer, res.tgt_ids)
    return {"mode": "head", "block": res.block, "head": res.head, "kv_head": res.kv_head, "circuit": res.circuit,
            "apply_norm_gain": res.apply_norm_gain, "self_top1_fraction": rnd(res.self_top1_fraction, 6),
            "n_sources": res.n_sources,
            "pairs": [{"source": s, "target": t, "source_id": int(si), "target_id": int(ti), "score": rnd(sc, 6)}
                      for s, t, si, ti, sc in zip(src, tgt, res.src_ids.tolist(), res.tgt_ids.tolist(),
                                                  res.scores.tolist())]}


def vectors_table(res: VectorProjection, tokenizer, n: int = 8) -> Table:
    how = "value vectors through the unembedding" if res.kind == "value" else "key vectors against the input embedding"
    gain = " (final-norm gain applied)" if res.apply_norm_gain else ""
    t = Table(title=f"FFN {how}{gain}", title_justify="left")
    for c, j in (("block", "right"), ("neuron", "right"), ("norm", "right"), ("promotes", "left"), ("suppresses", "left")):
        t.add_column(c, justify=j)
    for j in range(len(res.blocks)):
        t.add_row(str(int(res.blocks[j])), str(int(res.neurons[j])), f"{float(res.norms[j]):.3f}",
                  join(toks(tokenizer, res.top_ids[j]), n), join(toks(tokenizer, res.bottom_ids[j]), n))
    return t


def search_table(res: TokenSearch | list[TokenSearch], tokenizer, tops: VectorProjection | None = None) -> Table:
    """One table for one search or several: per target, its promoting rows then its suppressing rows."""
    searches = _searches(res)
    names = ", ".join(quoted(token_str(tokenizer, s.token_id)) for s in searches)
    t = Table(title=f"value vectors that single out {names}", caption=f"ranked by {searches[0].criterion}; rank: "
              "the target's place among the vector's logits (from the bottom when suppressing)",
              title_justify="left", caption_justify="left")
    for c, j in (("target", "left"), ("", "left"), ("block", "right"), ("neuron", "right"), ("z", "right"),
                 ("logit", "right"), ("rank", "right"), ("vector's top tokens", "left")):
        t.add_column(c, justify=j)
    off = 0
    for s in searches:
        name = quoted(token_str(tokenizer, s.token_id))
        for what, L, N, Z, S, R in (("promote", s.promote_blocks, s.promote_neurons, s.promote_z, s.promote_scores,
                                     s.promote_ranks),
                                    ("suppress", s.suppress_blocks, s.suppress_neurons, s.suppress_z,
                                     s.suppress_scores, s.suppress_ranks)):
            for j in range(len(Z)):
                tops_s = join(toks(tokenizer, tops.top_ids[off + j]), 6) if tops is not None else ""
                t.add_row(name if j == 0 else "", what if j == 0 else "", str(int(L[j])), str(int(N[j])),
                          f"{float(Z[j]):+.2f}", f"{float(S[j]):+.3f}", str(int(R[j])), tops_s)
            off += len(Z)
    return t


def circuit_table(res: HeadCircuit, tokenizer) -> Table:
    what = "source -> promoted token" if res.circuit == "ov" else "query token -> key token"
    t = Table(title=(f"block {res.block} head {res.head} (kv head {res.kv_head}) {res.circuit.upper()} circuit, "
                     f"{what}; self top-1 for {res.self_top1_fraction:.1%} of {res.n_sources} sources"),
              title_justify="left")
    for c, j in (("source", "left"), ("target", "left"), ("score", "right")):
        t.add_column(c, justify=j)
    for s, g, sc in zip(toks(tokenizer, res.src_ids), toks(tokenizer, res.tgt_ids), res.scores.tolist()):
        t.add_row(quoted(s), quoted(g), f"{sc:.4f}")
    return t


def _intro(apply_norm_gain: bool) -> str:
    gain = "with the final norm's gain applied" if apply_norm_gain else "without the final norm's gain"
    return (f"Each FFN neuron writes a fixed <em>value vector</em> (a row of the down projection's transpose) "
            f"scaled by its activation. Read through the unembedding ({esc(gain)}), a value vector is a ranking "
            f"of tokens: what it promotes and what it suppresses (Geva et al. 2022; Dar et al. 2022).")


def _vector_rows(res: VectorProjection, tokenizer, n: int, middle: list[str], show=quoted) -> list[list]:
    """Table rows ``[block, neuron, middle[j], promotes, suppresses]`` of a projection (each token
    through ``show``)."""
    return [[int(res.blocks[j]), int(res.neurons[j]), middle[j],
             " ".join(show(x) for x in toks(tokenizer, res.top_ids[j])[:n]),
             " ".join(show(x) for x in toks(tokenizer, res.bottom_ids[j])[:n])] for j in range(len(res.blocks))]


def value_vectors_section(res: VectorProjection, tokenizer, n: int = 8, note: str | None = None) -> Section:
    """Report section: top and bottom tokens of a sample of value vectors per block (``note`` replaces
    the sentence that introduces the table)."""
    rows = _vector_rows(res, tokenizer, n, [f"{float(x):.3f}" for x in res.norms.tolist()])
    intro = (f"<p>{_intro(res.apply_norm_gain)} "
             f"{esc(note) if note else 'A random sample of neurons per block:'}</p>")
    return Section(id="value-vectors", title="FFN value vectors in vocabulary space",
                   html=intro + table_html(["block", "neuron", "norm", "promotes", "suppresses"], rows))


def interpretable_to_dict(res: InterpretableVectors, tokenizer) -> dict:
    """``{"mode": "interpretable", "criterion", "n_candidates", "vectors": [... as in
    :func:`vectors_to_dict`, plus "top_z"]}``, best first."""
    d = vectors_to_dict(res.vectors, tokenizer)
    for row, z in zip(d["vectors"], res.top_z.tolist()):
        row["top_z"] = rnd(z, 4)
    return {**d, "mode": "interpretable", "criterion": res.criterion, "n_candidates": res.n_candidates}


def interpretable_table(res: InterpretableVectors, tokenizer, n: int = 8) -> Table:
    """The chosen vectors, best first, with the criterion as the caption."""
    v = res.vectors
    gain = " (final-norm gain applied)" if v.apply_norm_gain else ""
    t = Table(title=f"most interpretable FFN value vectors{gain}", caption=f"top z: {res.criterion}",
              title_justify="left", caption_justify="left")
    for c, j in (("block", "right"), ("neuron", "right"), ("top z", "right"), ("promotes", "left"),
                 ("suppresses", "left")):
        t.add_column(c, justify=j)
    for j in range(len(v.blocks)):
        t.add_row(str(int(v.blocks[j])), str(int(v.neurons[j])), f"{float(res.top_z[j]):.1f}",
                  join(toks(tokenizer, v.top_ids[j]), n), join(toks(tokenizer, v.bottom_ids[j]), n))
    return t


def value_vectors_report_section(searches: list[TokenSearch], tops: VectorProjection,
                                 interp: InterpretableVectors, tokenizer, n: int = 8) -> Section:
    """Report section: the value vectors that single out a few probe tokens (each row names its target),
    then the most interpretable vectors of a sample, each table with its criterion.

    ``tops`` is the projection of :func:`search_vectors` ``(searches)`` (only promote rows are shown)."""
    rows, off = [], 0
    for s in searches:
        k = len(s.promote_z)
        for j in range(k):
            rows.append([shown(token_str(tokenizer, s.token_id)), int(s.promote_blocks[j]), int(s.promote_neurons[j]),
                         f"{float(s.promote_z[j]):.1f}", int(s.promote_ranks[j]),
                         " ".join(shown(x) for x in toks(tokenizer, tops.top_ids[off + j])[:n])])
        off += k + len(s.suppress_z)
    irows = _vector_rows(interp.vectors, tokenizer, n, [f"{z:.1f}" for z in interp.top_z.tolist()], shown)
    html = (f"<p>{_intro(interp.vectors.apply_norm_gain)} {esc(LEGEND)}</p>"
            f"<p>The value vectors that most single out each probe token, ranked by the {esc(searches[0].criterion)}; "
            f"rank is the target's place among the vector's own logits (0 = its top token):</p>"
            + table_html(["target", "block", "neuron", "z", "rank", "the vector promotes"], rows)
            + f"<p>The most interpretable value vectors, by {esc(interp.criterion)}:</p>"
            + table_html(["block", "neuron", "top z", "promotes", "suppresses"], irows))
    return Section(id="value-vectors", title="FFN value vectors in vocabulary space", html=html)


# ---------- the renderers of a project result (vocablens.handle.results.Projection)
def _json_of(r) -> dict:
    how = r.options.get("how", "vectors")
    if how == "search":
        d = search_to_dict(r.value, r.tokenizer, r.options.get("tops"))
    elif how == "interpretable":
        d = interpretable_to_dict(r.value, r.tokenizer)
    elif how == "circuit":
        d = circuit_to_dict(r.value, r.tokenizer)
    else:
        d = vectors_to_dict(r.value, r.tokenizer)
    return {**d, **model_of(r)}


def _print_of(r, out) -> None:
    how = r.options.get("how", "vectors")
    t = (search_table(r.value, r.tokenizer, r.options.get("tops")) if how == "search" else
         interpretable_table(r.value, r.tokenizer) if how == "interpretable" else
         circuit_table(r.value, r.tokenizer) if how == "circuit" else vectors_table(r.value, r.tokenizer))
    out.print(t)


def _rows_of(r) -> list[dict]:
    """A row per vector (value/key vectors, the most interpretable ones), per (direction, vector) of a
    token's search (``direction``: promote / suppress), or per (source, target) pair of a head's circuit:
    the entries of ``project --json``."""
    how = r.options.get("how", "vectors")
    if how == "search":
        d = search_to_dict(r.value, r.tokenizer, r.options.get("tops"))
        return [{"direction": k, **e} for k in ("promote", "suppress") for e in d[k]]
    if how == "circuit":
        return circuit_to_dict(r.value, r.tokenizer)["pairs"]
    d = interpretable_to_dict(r.value, r.tokenizer) if how == "interpretable" else vectors_to_dict(r.value, r.tokenizer)
    return d["vectors"]


#: how a ``project`` result shows itself
RENDERER = Renderer("project", _json_of, _print_of, None, _rows_of)
