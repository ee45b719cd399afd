"""Benchmark of the logit lens and of ``lens eval`` on the default model (issue 10, §3).

Measured in one run, on the same machine state:

1. The logit lens over all layers 0..L and all positions of a T-token prompt
   (:func:`vocablens.lens.logit_lens`, ``positions="all"``) against its floor: one forward pass
   with residual capture (timed alone) plus the unavoidable (L+1)·T LM-head rows, 2·V·d FLOPs each,
   run here as plain 512-row GEMMs right after the lens (same load). Target: ratio <= 1.2.
   Peak RSS growth of the lens call against a budget: the peak growth of the forward pass alone
   plus 2 · T · V · 4 bytes (two [T, V] float32). It must stay below; [L+1, T, V] would be 30x that.
2. ``lens eval`` (:func:`vocablens.lens.evaluate.evaluate`, both lenses, all L layers, on
   ``--eval-tokens`` tokens in rows of ``--seq-len``) against its floor: the forwards plus
   (2L + 1) LM-head rows per token (logit and tuned lens at L layers, and layer L), run as plain
   GEMMs right after. Target: ratio <= 1.3.

Usage: ``python benchmarks/lens.py [--threads 2] [--T 512] [--eval-tokens 4096] [--seq-len 512]``
(``--eval-tokens 1024`` shows the same ratio in a quarter of the time).
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

import torch


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakRSS:
    """Peak resident-set growth (bytes) of a block, sampled every millisecond."""

    def __enter__(self):
        gc.collect()
        self.base = self.peak = _rss()
        self.stop = False

        def watch():
            while not self.stop:
                self.peak = max(self.peak, _rss())
                time.sleep(0.001)

        self.t = threading.Thread(target=watch, daemon=True)
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.t.join()
        self.peak = max(self.peak, _rss())
        self.growth = self.peak - self.base
        return False


def gemm_seconds(W: torch.Tensor, n_rows: int, block: int = 512) -> float:
    """Wall time of the unavoidable LM-head work itself: ``n_rows`` rows of [block, d] @ W.T float32
    GEMMs into a reused output (the GEMM the lens cannot avoid, run now, under the same load)."""
    X = torch.randn(block, W.shape[1])
    out = torch.empty(block, W.shape[0])
    torch.mm(X, W.T, out=out)
    t0 = time.perf_counter()
    done = 0
    while done < n_rows:
        r = min(block, n_rows - done)
        torch.mm(X[:r], W.T, out=out[:r])
        done += r
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--eval-tokens", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--skip-eval", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import vocablens
    from vocablens.corpus import load_documents, pack_tokens
    from vocablens.lens import logit_lens

    lm = vocablens.load("smollm2")
    b = lm.borders
    L, V, d = b.n_layers, b.vocab_size, b.d_emb
    W = b.W_U.detach().float()
    rows = pack_tokens(load_documents("pydoc-topics"), lm.tokenizer, args.T, max_tokens=args.T)
    ids = rows[0]
    print(f"model: {lm.provenance.describe()}; threads {args.threads}")

    with torch.no_grad():
        b.residual_stream(ids[None])  # warm-up
        logit_lens(b, ids[:16], positions="all", k=5)
        gc.collect()
        with PeakRSS() as fwd_mem:
            t0 = time.perf_counter()
            out = b.residual_stream(ids[None])
            t_fwd = time.perf_counter() - t0
            del out
        gc.collect()
        with PeakRSS() as lens_mem:
            t0 = time.perf_counter()
            res = logit_lens(b, ids, positions="all", k=5)
            t_lens = time.perf_counter() - t0
        del res
        t_gemm = gemm_seconds(W, (L + 1) * args.T)
    floor = t_fwd + t_gemm
    per_row = t_gemm / ((L + 1) * args.T)
    budget = fwd_mem.growth + 2 * args.T * V * 4
    print(f"logit lens, T={args.T}, layers 0..{L}, all positions: {t_lens:.2f} s; forward {t_fwd:.2f} s + "
          f"{(L + 1) * args.T} head rows at {2 * V * d / per_row / 1e9:.1f} GFLOP/s = floor {floor:.2f} s")
    print(f"  ratio lens / (forward + GEMM): {t_lens / floor:.3f}   (target <= 1.2)")
    print(f"  peak RSS growth {lens_mem.growth / 2**20:.0f} MiB; budget = forward {fwd_mem.growth / 2**20:.0f} MiB"
          f" + 2 x [T, V] float32 {2 * args.T * V * 4 / 2**20:.0f} MiB = {budget / 2**20:.0f} MiB;"
          f" [L+1, T, V] would be {(L + 1) * args.T * V * 4 / 2**20:.0f} MiB")
    print(f"  memory ratio growth / budget: {lens_mem.growth / budget:.3f}   (target <= 1.0)")
    if args.skip_eval:
        return

    from vocablens.lens.evaluate import evaluate
    from vocablens.lens.tuned import load_for_model

    lens = load_for_model(b, "smollm2")
    ev_rows = pack_tokens(load_documents("pydoc-topics"), lm.tokenizer, args.seq_len, max_tokens=args.eval_tokens)
    n_tok = ev_rows.numel()
    with torch.no_grad():
        t0 = time.perf_counter()
        for r in range(ev_rows.shape[0]):
            b.residual_stream(ev_rows[r: r + 1])
        t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    evaluate(b, lens, ev_rows)
    t_eval = time.perf_counter() - t0
    with torch.no_grad():
        t_gemm = gemm_seconds(W, (2 * L + 1) * n_tok)
    floor = t_fwd + t_gemm
    per_row = t_gemm / ((2 * L + 1) * n_tok)
    print(f"lens eval, both lenses, {n_tok} tokens, {L} layers: {t_eval:.1f} s; forwards {t_fwd:.1f} s + "
          f"{(2 * L + 1) * n_tok} head rows at {2 * V * d / per_row / 1e9:.1f} GFLOP/s = floor {floor:.1f} s")
    print(f"  ratio eval / (forward + GEMM): {t_eval / floor:.3f}   (target <= 1.3)")


if __name__ == "__main__":
    main()
