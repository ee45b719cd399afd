"""Benchmark of tuned-lens training (vocablens.lens.train.train) on the default model.

Measured in one run, on the same token rows:

- training tokens/s (``train`` for a few steps),
- forward-only tokens/s (the frozen model's forward with residual capture, no lens),
- GEMM FLOP/s of one LM-head GEMM of the shape training uses ([rows, d] @ [d, V], same dtype),

and printed:

- ratio 1 = achieved FLOP/s of training / GEMM FLOP/s, where the achieved FLOPs are the unavoidable
  work per token (frozen forward ≈ 2·params + per layer an LM-head forward and backward, 2·2·V·d each)
  over the training time (target >= 0.6),
- ratio 2 = training time per token / unavoidable time per token (measured forward time + L·4·V·d
  FLOPs at the GEMM rate); 1.0 would be no overhead at all.

Usage: ``python benchmarks/tuned_lens.py [--threads 2] [--steps 3] [--gemm-dtype float32|bfloat16]``.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--tokens-per-step", type=int, default=256)
    ap.add_argument("--gemm-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--chunk-rows", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import vocablens
    from vocablens.corpus import load_documents, pack_tokens
    from vocablens.lens.train import TrainSettings, train

    lm = vocablens.load("smollm2")
    b = lm.borders
    L, d, V = b.n_layers, b.d_emb, b.vocab_size
    n_params = sum(p.numel() for p in lm.model.parameters()) - (0 if b.tied else b.unembedding.weight.numel())
    rows = pack_tokens(load_documents("pydoc-topics"), lm.tokenizer, args.seq_len,
                       max_tokens=args.tokens_per_step * (args.steps + 1))
    s = TrainSettings(steps=args.steps, tokens_per_step=args.tokens_per_step, seq_len=args.seq_len,
                      gemm_dtype=args.gemm_dtype, chunk_rows=args.chunk_rows)
    # warm-up (allocations, one-time kernels)
    train(b, rows[:1], TrainSettings(steps=1, tokens_per_step=args.seq_len, seq_len=args.seq_len,
                                     gemm_dtype=args.gemm_dtype, chunk_rows=args.chunk_rows))
    t0 = time.perf_counter()
    res = train(b, rows, s)
    t_train = time.perf_counter() - t0
    train_tps = res.tokens / t_train

    n_fwd = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for r in range(min(rows.shape[0], max(1, res.tokens // args.seq_len))):
            b.residual_stream(rows[r: r + 1])
            n_fwd += args.seq_len
    t_fwd = time.perf_counter() - t0
    fwd_tps = n_fwd / t_fwd

    gd = torch.bfloat16 if args.gemm_dtype == "bfloat16" else torch.float32
    R = (args.chunk_rows // L) * L
    X = torch.randn(R, d).to(gd)
    W = b.unembedding.weight.detach().to(gd)
    X @ W.T
    reps, t0 = 3, time.perf_counter()
    for _ in range(reps):
        X @ W.T
    gemm = 2 * R * d * V * reps / (time.perf_counter() - t0)

    head_flops = L * 2 * (2 * V * d)  # per token: LM-head forward + backward (input grad) per layer
    fwd_flops = 2 * n_params + 2 * V * d
    achieved = (head_flops + fwd_flops) * train_tps
    unavoidable_s = 1 / fwd_tps + head_flops / gemm
    print(f"model: {lm.provenance.describe()}")
    print(f"threads {args.threads}, GEMM dtype {args.gemm_dtype}, {res.tokens} training tokens in {t_train:.1f} s")
    print(f"training tokens/s:        {train_tps:10.1f}")
    print(f"forward-only tokens/s:    {fwd_tps:10.1f}")
    print(f"GEMM FLOP/s ({R}x{d}x{V}): {gemm / 1e9:8.1f} GFLOP/s")
    print(f"achieved FLOP/s (training): {achieved / 1e9:6.1f} GFLOP/s")
    print(f"ratio achieved / GEMM FLOP/s:            {achieved / gemm:.3f}   (target >= 0.6)")
    print(f"ratio training time / unavoidable time:  {(1 / train_tps) / unavoidable_s:.3f}   (1.0 = no overhead)")


if __name__ == "__main__":
    main()
