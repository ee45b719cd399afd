"""Benchmarks for vocablens.vocab_space on the default model (prints ratios measured in one run).

1. Value vectors of one layer: streamed top-k (chunks of rows x V) vs one [d_ff, V] matrix — peak
   bytes of scores held (by construction) and time.
2. A head's OV circuit: the low-rank streamed product ([c, d_head] @ [d_head, V]) vs the dense route
   ([c, d] @ [d, V] after forming E·W_V·W_O), over the same source tokens — time ratio, same top pairs.
3. Reverse token search over all blocks, ranked by the token's z-score within each vector's own logits:
   the exact moments of every vector (``value_stats``: 2·V·d² + 2·N·d² FLOPs, once per model) plus
   one [d_ff] score vector per block and token, vs scoring every value vector against the whole
   vocabulary (2·N·V·d) — time for one block, extrapolated to all blocks; and the z-scores of that
   block checked against the dense scores.
4. ``interpretable_vectors`` (32 sampled neurons per block, projected in full) vs projecting every vector.

Run: ``PYTHONPATH=src python benchmarks/vocab_space.py [--threads 2] [--sources 4096]``.
"""

from __future__ import annotations

import argparse
import time

import torch


def _t(fn, reps=1):
    best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sources", type=int, default=4096)
    ap.add_argument("--layer", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    import vocablens
    from vocablens import vocab_space as vs
    from vocablens.models.blocks import block_view
    from vocablens.vocab_space.readout import rows_per_chunk

    lm = vocablens.load("smollm2")
    b = lm.borders
    V = b.real_vocab_size
    v = block_view(b, a.layer)
    d_ff = v.d_ff
    print(f"model: {lm.provenance.describe()}; V={V}, d={b.d_model}, d_ff={d_ff}, L={b.n_layers}, threads={a.threads}")

    # 1. one layer's value vectors
    layers, neurons = [a.layer] * d_ff, list(range(d_ff))
    chunk = rows_per_chunk(V)
    t_stream, res = _t(lambda: vs.project_vectors(b, layers, neurons, k=10))
    R = vs.readout(b, True)

    def dense():
        S = v.W_out.detach().float() @ R.t()  # [d_ff, V] at once
        torch.topk(S, 10, dim=-1, largest=False)  # both ends, as the streamed path
        return torch.topk(S, 10, dim=-1).indices

    t_dense, top_dense = _t(dense)
    assert torch.equal(top_dense, res.top_ids)
    full_all = b.n_layers * d_ff * V * 4
    print(f"[values] layer {a.layer}: streamed {t_stream:.2f} s (peak scores {chunk * V * 4 / 2**20:.0f} MiB) vs "
          f"dense {t_dense:.2f} s (peak {d_ff * V * 4 / 2**20:.0f} MiB): memory ratio "
          f"{d_ff / min(chunk, d_ff):.1f}x, time ratio {t_stream / t_dense:.2f}; all layers at once would be "
          f"{full_all / 2**30:.1f} GiB")

    # 2. OV circuit, low rank vs dense
    n = min(a.sources, V)
    t_low, hc = _t(lambda: vs.head_circuit(b, a.layer, 0, "ov", k=10, max_sources=n))
    E = vs.input_embedding(b)[:n]
    Wv, Wo = (w.detach().float() for w in v.W_OV(0))

    def dense_ov():
        OV = Wv @ Wo  # [d, d]
        best = torch.empty(0)
        best_i = torch.empty(0, dtype=torch.long)
        step = rows_per_chunk(V)
        for i in range(0, n, step):
            S = (E[i:i + step] @ OV) @ R.t()
            t = torch.topk(S.flatten(), 10)
            s = torch.cat([best, t.values])
            f = torch.cat([best_i, (t.indices // V + i) * V + t.indices % V])
            t2 = torch.topk(s, 10)
            best, best_i = t2.values, f[t2.indices]
        return best_i

    t_dense_ov, di = _t(dense_ov)
    same = (hc.src_ids * V + hc.tgt_ids).tolist() == di.tolist()
    print(f"[ov] layer {a.layer} head 0, {n} sources: low-rank {t_low:.2f} s vs dense {t_dense_ov:.2f} s: "
          f"speed-up {t_dense_ov / t_low:.2f}x (d/d_head = {b.d_model / v.d_head:.0f}); same top pairs: {same}")

    # 3. reverse search (z-score ranking)
    tid = lm.tokenizer(" three", add_special_tokens=False).input_ids[0]
    full = t_dense * b.n_layers  # every value vector against the whole vocabulary
    t_stats, st = _t(lambda: vs.value_stats(b, True))
    t_tok, s = _t(lambda: vs.search_token(b, tid, k=10, stats=st), reps=3)
    Sd = v.W_out.detach().float() @ R.t()
    sd, mu = torch.std_mean(Sd, dim=1, correction=0)
    here = st.blocks == a.layer
    err_z = float(((Sd[:, tid] - mu) / sd - (Sd[:, tid] - st.mean[here]) / st.std[here]).abs().max())
    print(f"[search] ' three' over {b.n_layers} blocks: value_stats {t_stats:.2f} s once per model, then "
          f"{t_tok:.3f} s per token; projecting every value vector would take ~{full:.1f} s: ratio "
          f"{full / (t_stats + t_tok):.0f}x for the first token, {full / t_tok:.0f}x for each further token; "
          f"max |z error| on block {a.layer} vs the dense scores {err_z:.1e}; first row: block "
          f"{int(s.promote_blocks[0])} neuron {int(s.promote_neurons[0])} (z {float(s.promote_z[0]):.2f}, rank "
          f"{int(s.promote_ranks[0])})")

    # 4. interpretable vectors
    t_int, iv = _t(lambda: vs.interpretable_vectors(b, n=20, per_block=32))
    print(f"[interpretable] 20 of {iv.n_candidates} sampled vectors: {t_int:.2f} s vs ~{full:.1f} s to project "
          f"every vector (ratio {full / t_int:.0f}x); best: block {int(iv.vectors.layers[0])} neuron "
          f"{int(iv.vectors.neurons[0])}, top z {float(iv.top_z[0]):.1f}")


if __name__ == "__main__":
    main()
