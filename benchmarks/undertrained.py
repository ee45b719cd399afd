"""Under-trained tokens on the default model: indicator time and verification time for N candidates.

    PYTHONPATH=src python benchmarks/undertrained.py [--candidates 500]

Targets (issue 27, §6): indicators <= 10 s (O(V·d) plus one [d, d] Gram matrix), verification of 500
candidates <= 2 minutes on 2 cores; and the report's section (its verification sized from its share
of the budget). Prints the load average (the machine may be shared), the torch threads and the CPU's
vector width (torch's CPU capability: AVX512 or AVX2), and each step in wall seconds and in CPU seconds
of this process (all threads: about threads x wall when nothing else runs). Issue 40: a user's "80 CPU-s"
for 500 candidates against the 15.6 s of docs/performance.md compared CPU seconds on an AVX2-only CPU
at load 2-4 with wall seconds on 2 threads of an AVX-512 CPU at load 1.1-1.7: twice for the two threads,
about twice for the half-width float32 GEMMs, the rest for the load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    import vocablens
    from vocablens.undertrained import classify_tokens, compute_indicators, testable, verify_tokens
    from vocablens.undertrained.verify import pick_examples

    print(f"load average before: {os.getloadavg()}; torch threads {torch.get_num_threads()}; "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    lm = vocablens.load("smollm2")
    b, tok = lm.borders, lm.tokenizer
    t0 = time.perf_counter()
    cls = classify_tokens(tok, b.vocab_size)
    t_cls = time.perf_counter() - t0
    t0 = time.perf_counter()
    ind = compute_indicators(b, cls, tok)
    t_ind = time.perf_counter() - t0
    ok = testable(cls)
    pool = ok.nonzero().flatten()
    order = pool[torch.argsort(ind.values[pool], stable=True)]
    cand = order[:a.candidates]
    ex = pick_examples(tok, order.flip(0), ok)
    t0, c0 = time.perf_counter(), time.process_time()
    v = verify_tokens(b, tok, cand, examples=ex, batch_size=a.batch_size)
    t_ver, c_ver = time.perf_counter() - t0, time.process_time() - c0
    print(f"V={b.vocab_size} d={b.d_emb}")
    print(f"tokenizer classes: {t_cls:.2f} s  {cls.counts()}")
    print(f"indicators ({ind.name}): {t_ind:.2f} s  (target <= 10 s)")
    print(f"verification of {int(cand.numel())} candidates x {len(v.templates)} templates: {t_ver:.1f} s wall, "
          f"{c_ver:.1f} CPU-s (target <= 120 s wall); {int(v.verified.sum())} verified under-trained")
    from vocablens.report.runner import run_report

    t0 = time.perf_counter()
    sec = run_report(lm, only=("undertrained",)).get("undertrained")
    print(f"report section: {time.perf_counter() - t0:.1f} s for its {sec.plan.budget_s:.1f} s share of the default "
          f"budget; {int(sec.result.candidates.numel())} candidates verified, {int(sec.result.verified.numel())} "
          "under-trained")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
