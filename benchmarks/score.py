"""Benchmark: `score` (vocablens.generate.score.score_ids) beside transformers' own per-token log-probabilities.

transformers: ``model(ids).logits[0, :-1].log_softmax(-1).gather(1, ids[1:, None])`` — the whole
forward including the LM head ([T, V] float32 logits), then a [T, V] log-softmax.
vocablens: ``score_ids(borders, ids)`` — the blocks without the head (the forward stops after the
last block), then the head once, chunked (log-probabilities, entropy; nothing [T, V]).

* time: T = 512 tokens (default), calls alternated in one process, minimum of --reps runs each;
* memory: T = 4,096 tokens (default), each method in a fresh subprocess, the peak resident memory
  (VmHWM) above the loaded model's;
* agreement: max |Δ log-prob| between the two.

Prints the ratios vocablens / transformers measured in this run, with the load average (`uptime`).

    python benchmarks/score.py [--tokens 512] [--mem-tokens 4096] [--reps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _setup(threads: int, T: int):
    sys.path.insert(0, SRC)
    import torch

    import vocablens

    torch.set_num_threads(threads)
    lm = vocablens.load("smollm2")
    V = lm.borders.real_vocab_size
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(0))
    return torch, lm, ids


def _methods(torch, lm):
    from vocablens.generate.score import score_ids

    def transformers(ids):
        lg = lm.model(input_ids=ids[None], use_cache=False).logits[0, :-1]
        return lg.log_softmax(-1).gather(1, ids[1:, None])[:, 0]

    def vocablens_score(ids):
        return score_ids(lm.borders, ids).logprobs

    return {"transformers": transformers, "vocablens": vocablens_score}


def memory_child(method: str, threads: int, T: int) -> None:
    torch, lm, ids = _setup(threads, T)
    fn = _methods(torch, lm)[method]
    with torch.inference_mode():
        fn(ids[:16])  # one-time set-up (kernels, lazy buffers) before the baseline
        base = _vm("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark
        fn(ids)
        peak = _vm("VmHWM")
    print(json.dumps({"method": method, "extra_bytes": peak - base}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--mem-tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    load = os.getloadavg()
    torch, lm, ids = _setup(a.threads, a.tokens)
    fns = _methods(torch, lm)
    best = {k: float("inf") for k in fns}
    out = {}
    with torch.inference_mode():
        for k, f in fns.items():
            out[k] = f(ids)  # warm-up, and the values compared
        for _ in range(a.reps):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f(ids)
                best[k] = min(best[k], time.perf_counter() - t0)
    diff = float((out["vocablens"] - out["transformers"]).abs().max())
    mem = {}
    for k in fns:
        r = subprocess.run([sys.executable, __file__, "--child", k, str(a.threads), str(a.mem_tokens)],
                           capture_output=True, text=True, check=True)
        mem[k] = json.loads(r.stdout.strip().splitlines()[-1])["extra_bytes"]
    load_after = os.getloadavg()
    print(f"model smollm2 (V={lm.borders.vocab_size}, d={lm.borders.d_model}, {lm.borders.n_layers} blocks), "
          f"float32, {a.threads} threads; load average {load[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"time at {a.tokens} tokens (min of {a.reps}): transformers {best['transformers']:.3f} s, "
          f"vocablens {best['vocablens']:.3f} s, ratio {best['vocablens'] / best['transformers']:.2f}x (target <= 1.0x)")
    print(f"peak memory growth at {a.mem_tokens} tokens: transformers {mem['transformers'] / 2**20:.0f} MiB, "
          f"vocablens {mem['vocablens'] / 2**20:.0f} MiB, ratio {mem['vocablens'] / max(1, mem['transformers']):.2f}x "
          f"(target <= 0.5x)")
    print(f"max |log-prob difference| at {a.tokens} tokens: {diff:.2e} nats (target <= 1e-5)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        memory_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
