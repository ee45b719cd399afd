"""The measurements behind the defaults of :mod:`vocablens.ops` (chunk rows, exp2, float32 sums, GEMM dtype).

Each default in ``ops`` rests on a comparison of two ways to do the same work; this script runs each
comparison side by side in one process (alternating, best of ``--reps``) and prints both times and
their ratio, with the CPU's flags and the load average, so the choice can be checked on another
machine. Shapes are the default model's (V = 49,152, d = 576).

1. ``gemm-rows``: GFLOP/s of one [rows, d] x [d, V] float32 GEMM for 64, 240, 256 and 512 rows
   (:data:`vocablens.ops.kl.DEFAULT_CHUNK_BYTES`, :data:`~vocablens.ops.kl.READOUT_CHUNK_BYTES`,
   :data:`vocablens.ops.logprobs.MIN_FULL_ROW_TOKENS`).
2. ``gemm-dtype``: [256, d] x [d, V] in bfloat16 against float32
   (:func:`vocablens.ops.chunking.gemm_operands` widens bf16 to float32 on the CPU).
3. ``exp``: torch.exp against :func:`vocablens.ops.kl_block.exp_shifted` (exp2 of y·log2 e, clamped),
   on y in [-10, 0] and in [-300, 0] (where exp's results are subnormal); nanoseconds per element.
4. ``row-sums``: float32 row sums of [512, V] against float64 ones
   (:func:`vocablens.ops.logprobs` keeps float32 sums).
5. ``stat-rows``: three passes (max, shift, exp + sum) over [240, V] logits at once against the same
   passes in blocks of :data:`vocablens.ops.kl_block.STATS_ROWS` rows.

Usage: ``PYTHONPATH=src python benchmarks/ops_defaults.py [--threads 1] [--reps 5] [--only NAME ...]``.
Timings depend on the CPU and its load: compare the ratios printed by one run, never figures of two.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

V, D = 49_152, 576


def _best(fns: dict, reps: int) -> dict:
    """Best wall seconds of each callable, calls alternated (one warm-up each)."""
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def gemm_rows(reps: int) -> None:
    W = torch.randn(V, D)
    fns = {}
    for r in (64, 240, 256, 512):
        h, out = torch.randn(r, D), torch.empty(r, V)
        fns[r] = (lambda h=h, out=out: torch.mm(h, W.t(), out=out))
    t = _best(fns, reps)
    for r, s in t.items():
        print(f"gemm-rows  {r:4d} rows: {2 * r * D * V / s / 1e9:6.1f} GFLOP/s")


def gemm_dtype(reps: int) -> None:
    h, W = torch.randn(256, D), torch.randn(V, D)
    hb, Wb = h.bfloat16(), W.bfloat16()
    t = _best({"float32": lambda: h @ W.t(), "bfloat16": lambda: hb @ Wb.t()}, reps)
    print(f"gemm-dtype [256, {D}] x [{D}, {V}]: float32 {t['float32']:.3f} s, bfloat16 {t['bfloat16']:.3f} s "
          f"({t['bfloat16'] / t['float32']:.2f}x)")


def exp_vs_exp2(reps: int) -> None:
    from vocablens.ops.kl_block import exp_shifted
    n = 240 * V
    for lo in (-10.0, -300.0):
        y, out = torch.rand(n) * lo, torch.empty(n)
        t = _best({"exp": lambda: torch.exp(y, out=out), "exp2": lambda: exp_shifted(y, out)}, reps)
        print(f"exp        y in [{lo:g}, 0]: exp {t['exp'] / n * 1e9:.2f} ns, exp_shifted {t['exp2'] / n * 1e9:.2f} ns "
              f"per element ({t['exp'] / t['exp2']:.2f}x)")


def row_sums(reps: int) -> None:
    e = torch.rand(512, V)
    t = _best({"float32": lambda: e.sum(1), "float64": lambda: e.sum(1, dtype=torch.float64)}, reps)
    print(f"row-sums   [512, {V}]: float32 {t['float32'] * 1e3:.1f} ms, float64 {t['float64'] * 1e3:.1f} ms "
          f"({t['float64'] / t['float32']:.2f}x)")


def stat_rows(reps: int) -> None:
    from vocablens.ops.kl_block import STATS_ROWS
    z0 = torch.randn(240, V) * 4
    z, e = z0.clone(), torch.empty_like(z0)

    def passes(a, b):  # the passes over rows a..b at once
        zb = z[a:b]
        zb.copy_(z0[a:b])
        zb.sub_(zb.amax(1, keepdim=True))
        torch.exp(zb, out=e[a:b]).sum(1)

    whole = lambda: passes(0, 240)  # noqa: E731
    blocked = lambda: [passes(i, min(240, i + STATS_ROWS)) for i in range(0, 240, STATS_ROWS)]  # noqa: E731
    t = _best({"whole": whole, "blocked": blocked}, reps)
    print(f"stat-rows  [240, {V}]: at once {t['whole'] * 1e3:.1f} ms, in {STATS_ROWS}-row blocks "
          f"{t['blocked'] * 1e3:.1f} ms ({t['whole'] / t['blocked']:.2f}x)")


CASES = {"gemm-rows": gemm_rows, "gemm-dtype": gemm_dtype, "exp": exp_vs_exp2, "row-sums": row_sums,
         "stat-rows": stat_rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # a benchmark script: its own process
    torch.manual_seed(0)
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            fl = next((ln for ln in f if ln.startswith("flags")), "").split()
        flags = " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in fl)
    load = open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"
    print(f"torch {torch.__version__}, {a.threads} thread(s), CPU flags: {flags or '?'}, load average {load}")
    for name in a.only or CASES:
        CASES[name](a.reps)


if __name__ == "__main__":
    main()
