"""Benchmark of vocablens.argmax.find_unargmaxable (exact unargmaxable-token check).

Matrices:
  1. the default model's unembedding (SmolLM2-135M, 49,152 x 576);
  2. a random 151,936 x 1,024 Gaussian matrix with planted interior rows
     (``--quick``: 32,000 x 256 with 8 planted rows, the reference's own test shape).

Prints wall seconds and tokens settled per stage, the total, the process CPU seconds (the machine
is shared: CPU time is the contention-free figure), and ratios: against the reference checker's
times measured on this machine (Grivas et al.'s code with HiGHS in place of Gurobi; research note
unargmaxable.md: 658 s for the default model's matrix, 389 s for 32,000 x 256), and against one
plain all-pairs float32 product V^2 d extrapolated from a measured block.

Usage: PYTHONPATH=src python benchmarks/argmax.py [--quick] [--threads 2] [--skip-model] [--skip-random]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vocablens.argmax import STAGES, find_unargmaxable

REF_MODEL_S = 658.3      # reference on SmolLM2's deduplicated 49,141 x 576 matrix (research note §2.2)
REF_32K_S = 388.9        # reference on 32,000 x 256 + 8 planted


def planted_matrix(V: int, d: int, n_planted: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d), dtype=np.float32)
    pl = rng.choice(V, n_planted, replace=False)
    mean = W.mean(0)
    for p in pl:
        a, b = rng.choice(V, 2, replace=False)
        W[p] = 0.5 * (W[a] + W[b]) / 2 + 0.5 * mean
    return torch.from_numpy(W), sorted(pl.tolist())


def allpairs_fp32_estimate(V: int, d: int) -> float:
    """Seconds for a plain V x V x d float32 product, extrapolated from a 4096 x 8192 block."""
    A = torch.randn(4096, d)
    B = torch.randn(8192, d)
    A @ B.T
    t = time.perf_counter()
    for _ in range(3):
        A @ B.T
    per = (time.perf_counter() - t) / 3
    return per * (V / 4096) * (V / 8192)


def run(name: str, W: torch.Tensor, expect: list[int] | None, ref_s: float | None):
    print(f"\n== {name}: W [{W.shape[0]} x {W.shape[1]}]", flush=True)
    c0 = time.process_time()
    t0 = time.perf_counter()
    res = find_unargmaxable(W)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(f"{'stage':8s} {'wall s':>9s} {'settled':>9s}")
    for s in STAGES:
        print(f"{s:8s} {res.timings[s]:9.2f} {res.settled[s]:9d}")
    print(f"{'total':8s} {wall:9.2f}   (process CPU {cpu:.1f} s)")
    print("verdicts:", res.counts())
    if expect is not None:
        got = sorted(res.ids("unargmaxable").tolist())
        print("planted interior rows found exactly:", got == expect, f"({len(got)} flagged, {len(expect)} planted)")
    if ref_s:
        print(f"ratio reference / ours (wall): {ref_s / wall:.1f}x   (reference {ref_s:.0f} s)")
    est = allpairs_fp32_estimate(W.shape[0], W.shape[1])
    print(f"plain all-pairs fp32 product, measured now and extrapolated: {est:.1f} s; "
          f"gemm stage / all-pairs: {res.timings['gemm'] / est:.2f}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32,000 x 256 random matrix instead of 151,936 x 1,024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--skip-random", action="store_true")
    ap.add_argument("--planted", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_model:
        import vocablens

        lm = vocablens.load("smollm2")
        W = lm.borders.W_U.detach().clone()
        del lm
        run("default model (smollm2)", W, None, REF_MODEL_S)
    if not args.skip_random:
        if args.quick:
            W, pl = planted_matrix(32000, 256, 8)
            run("random 32,000 x 256 + 8 planted", W, pl, REF_32K_S)
        else:
            W, pl = planted_matrix(151936, 1024, args.planted)
            run(f"random 151,936 x 1,024 + {args.planted} planted", W, pl, None)


if __name__ == "__main__":
    main()
