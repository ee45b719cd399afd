"""Benchmark: what each init method does to the default model, and what HF's resize does.

Adds the same k tokens with every init method of ``vocablens expand`` and with transformers'
``resize_token_embeddings`` (mean_resizing=True / False), and prints, on held-out pydoc text,
the new-token mass (vs Hewitt's k/(V+k)), KL(old ‖ new) and the perplexity change, plus the
ratios of KL to the ``mean`` init's KL. All numbers come from this one run.

    python benchmarks/surgery.py [--texts 2] [--chars 500]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--chars", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import vocablens
    from vocablens.surgery import expand_vocab, verify_expansion
    from vocablens.surgery.io import heldout_texts

    lm = vocablens.load("smollm2")
    texts = heldout_texts("pydoc-topics", a.texts, a.chars)
    toks = [" vocablens", " logit lens", " unembedding", " softcap", " dequantization"]
    sample = "The vocablens logit lens reads the unembedding."
    rows = {}
    for init in ("subtoken-mean", "mean", "interpolate", "zeros", "random"):
        t0 = time.perf_counter()
        ex = expand_vocab(lm.model, lm.tokenizer, toks, init=init)
        dt = time.perf_counter() - t0
        v = verify_expansion(lm.model, lm.tokenizer, ex.model, ex.tokenizer, ex.result.new_ids, texts,
                             ex.result.trained_rows_head, sample)
        rows[init] = (v, dt)
    # transformers' own resize (the reference behaviour, bugs included)
    for mr in (True, False):
        m2 = copy.deepcopy(lm.model)
        t2 = copy.deepcopy(lm.tokenizer)
        t2.add_tokens(toks)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        m2.resize_token_embeddings(len(t2), mean_resizing=mr)
        dt = time.perf_counter() - t0
        ids = [t2.convert_tokens_to_ids(s) for s in toks]
        v = verify_expansion(lm.model, lm.tokenizer, m2, t2, ids, texts, 49152, sample)
        rows[f"HF resize (mean_resizing={mr})"] = (v, dt)
    ref = rows["mean"][0].kl_old_new
    print(f"k={len(toks)} new tokens, V=49152, {rows['mean'][0].positions} held-out positions; "
          f"Hewitt bound on mass k/(V+k) = {rows['mean'][0].mass_bound:.3e}")
    print(f"{'method':34s} {'mass mean':>10s} {'mass max':>10s} {'KL nats':>10s} {'KL/KL(mean)':>12s} "
          f"{'ppl rel':>10s} {'time s':>7s}")
    for k, (v, dt) in rows.items():
        print(f"{k:34s} {v.new_token_mass:10.3e} {v.new_token_mass_max:10.3e} {v.kl_old_new:10.3e} "
              f"{v.kl_old_new / ref:12.2f} {v.perplexity_relative_change:+10.2e} {dt:7.2f}")


if __name__ == "__main__":
    main()
