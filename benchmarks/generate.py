"""Prefill with the head at every position vs the last position only, on the default model (one run).

A prompt of ``--tokens`` (default 1,000) tokens runs through the base decoder once (shared); then the
unembedding is applied to every position (what ``model(ids).logits`` does) or to the last one (what
``vocablens generate`` does). Prints head time, head FLOPs, logits bytes and the whole prefill's time
for both, and the measured saving next to the seeds' 99.9% head-FLOP figure.

Run: ``PYTHONPATH=src python benchmarks/generate.py [--tokens 1000] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import time

import torch


def _best(fn, reps):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    import vocablens
    from vocablens.generate.loop import base_decoder

    lm = vocablens.load("smollm2")
    borders, U = lm.borders, lm.borders.unembedding
    text = " ".join(["The borders of a language model are its embedding and its unembedding."] * 200)
    ids = lm.tokenizer(text, return_tensors="pt").input_ids[:, : a.tokens]
    T, V, d = ids.shape[1], U.vocab_size, U.d_emb
    dec = base_decoder(borders)
    with torch.no_grad():
        t_dec, out = _best(lambda: dec(input_ids=ids, use_cache=False).last_hidden_state, 1)
        t_all, z_all = _best(lambda: U.logits(out[0]), a.reps)  # [T, V]
        t_last, z_last = _best(lambda: U.logits(out[0, -1:]), a.reps)  # [1, V]
    assert torch.allclose(z_all[-1:], z_last, atol=1e-4)
    f_all, f_last = 2 * T * V * d, 2 * V * d
    b_all, b_last = z_all.numel() * z_all.element_size(), z_last.numel() * z_last.element_size()
    print(f"SmolLM2-135M (V={V}, d={d}), prompt of {T} tokens, {torch.get_num_threads()} threads, best of {a.reps}")
    print(f"{'':22} {'every position':>16} {'last only':>12} {'ratio':>10}")
    print(f"{'head time (s)':22} {t_all:16.4f} {t_last:12.5f} {t_last / t_all:10.5f}")
    print(f"{'head FLOPs':22} {f_all:16.3e} {f_last:12.3e} {f_last / f_all:10.5f}")
    print(f"{'logits bytes':22} {b_all:16,d} {b_last:12,d} {b_last / b_all:10.5f}")
    print(f"{'prefill time (s)':22} {t_dec + t_all:16.4f} {t_dec + t_last:12.4f} "
          f"{(t_dec + t_last) / (t_dec + t_all):10.4f}   (decoder {t_dec:.3f} s, shared)")
    print(f"measured saving: {1 - f_last / f_all:.4%} of head FLOPs (seeds: 99.9% for a 1,000-token prompt), "
          f"{1 - t_last / t_all:.4%} of head time, {1 - b_last / b_all:.4%} of logits memory, "
          f"{1 - (t_dec + t_last) / (t_dec + t_all):.2%} of the whole prefill's time")


if __name__ == "__main__":
    main()
