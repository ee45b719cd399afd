"""Benchmarks for vocablens.vocab_space on the default model (prints ratios measured in one run).

1. Value vectors of one layer: streamed top-k (chunks of rows x V) vs one [d_ff, V] matrix — peak
   bytes of scores held (by construction) and time.
2. A head's OV circuit: the low-rank streamed product ([c, d_head] @ [d_head, V]) vs the dense route
   ([c, d] @ [d, V] after forming E·W_V·W_O), over the same source tokens — time ratio, same top pairs.
3. Reverse token search over all layers (one [d_ff] vector per layer) vs scoring every value vector
   against the whole vocabulary — time for one layer, extrapolated to all layers.

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

    lm = vocablens.load("smollm2")
    b = lm.borders
    V = b.real_vocab_size
    v = block_view(b, a.layer)
    d_ff = v.d_ff
    print(f"model: {lm.provenance.describe()}; V={V}, d={b.d_model}, d_ff={d_ff}, L={b.n_layers}, threads={a.threads}")

    # 1. one layer's value vectors
    layers, neurons = [a.layer] * d_ff, list(range(d_ff))
    chunk = vs._chunk_rows(V, None)
    t_stream, res = _t(lambda: vs.project_vectors(b, layers, neurons, k=10))
    R = vs._Readout.of(b, True)

    def dense():
        S = R.scores(v.W_out.detach().float())  # [d_ff, V] at once
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
    E = vs._input_embedding(b)[:n]
    Wv, Wo = (w.detach().float() for w in v.W_OV(0))

    def dense_ov():
        OV = Wv @ Wo  # [d, d]
        best = torch.empty(0)
        best_i = torch.empty(0, dtype=torch.long)
        step = vs._chunk_rows(V, None)
        for i in range(0, n, step):
            S = R.scores(E[i:i + step] @ OV)
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

    # 3. reverse search
    tid = lm.tokenizer(" three", add_special_tokens=False).input_ids[0]
    t_search, s = _t(lambda: vs.search_token(b, tid, k=10))
    print(f"[search] ' three' over {b.n_layers} layers: {t_search:.2f} s; full projection of every value vector "
          f"would take ~{t_dense * b.n_layers:.1f} s (ratio {t_dense * b.n_layers / t_search:.0f}x); "
          f"top: layer {int(s.promote_layers[0])} neuron {int(s.promote_neurons[0])}")


if __name__ == "__main__":
    main()
