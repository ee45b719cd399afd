"""Executed early exit on the default model: blocks run, wall time, agreement and perplexity (one run).

For held-out prompts (written here, not from the tuned lens's training corpus), greedy decoding with the
full model is the reference. For each lens (logit, tuned) and threshold, the same prompts are decoded
with ``--early-exit``; we report the mean fraction of blocks run over the decode steps, the FLOPs
actually spent (blocks + K/V fills + lens reads + head) against the full model's, wall time against
the full model's, token agreement with full greedy decoding (position by position, and the mean
length of the agreeing prefix), and the full model's perplexity on the early-exit text (the full
greedy text's perplexity alongside). The ``candidates`` exit test (the lens on the previous token's
top-32 rows first) runs for each lens at each threshold. The same full-greedy sequences are fed
to ``settle`` (teacher-forced estimate) for comparison, next to Geva et al.'s ~20% saved compute.

The issue asks for 20 prompts x 64 new tokens (the defaults); on a shared 2-core machine run fewer:
``PYTHONPATH=src python benchmarks/early_exit.py --prompts 4 --new-tokens 16 --plot /tmp/ee.png``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

PROMPTS = [
    "The history of the Roman Empire begins with",
    "To make a good cup of coffee, you should",
    "The main difference between a virus and a bacterium is",
    "Once upon a time, in a kingdom far away, there lived",
    "The theory of relativity, proposed by Albert Einstein,",
    "Here is a Python function that reverses a string:",
    "The capital of Japan is",
    "Photosynthesis is the process by which",
    "The most important lesson I learned in school was",
    "Water boils at 100 degrees Celsius because",
    "The first step in writing a research paper is",
    "In 1969, astronauts landed on",
    "A healthy breakfast usually includes",
    "The stock market crashed in 1929, which led to",
    "My favorite book is",
    "The human heart has four chambers:",
    "To solve a quadratic equation, you can",
    "The Amazon rainforest is home to",
    "Machine learning models are trained by",
    "The Eiffel Tower was built for",
]


def perplexity(model, prompt_ids: torch.Tensor, new_ids: list[int]) -> float:
    """exp(mean NLL) of the full model on ``new_ids`` after the prompt (nats per token)."""
    seq = torch.cat([prompt_ids, torch.tensor(new_ids)])[None]
    with torch.no_grad():
        lp = torch.log_softmax(model(seq, use_cache=False).logits[0].float(), -1)
    T = prompt_ids.numel()
    nll = -lp[T - 1: seq.shape[1] - 1].gather(1, torch.tensor(new_ids)[:, None]).mean()
    return float(math.exp(float(nll)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--thresholds", default="0.5,0.8,0.9,0.95")
    ap.add_argument("--lenses", default="logit,tuned")
    ap.add_argument("--min-layer", type=int, default=15)
    ap.add_argument("--plot", default=None, help="write the trade-off plot (PNG) here")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    import vocablens
    from vocablens.generate import ExitRule, generate, load_tuned_lens
    from vocablens.vocab_space import settle

    lm = vocablens.load("smollm2")
    model, tok, borders = lm.model, lm.tokenizer, lm.borders
    L = borders.n_layers
    prompts = [tok(p, return_tensors="pt").input_ids[0] for p in PROMPTS[: a.prompts]]
    ths = [float(t) for t in a.thresholds.split(",")]
    tuned = load_tuned_lens(borders, "smollm2") if "tuned" in a.lenses else None
    stop = [tok.eos_token_id]

    def run(rule):
        out = []
        for p in prompts:
            r = generate(borders, p, max_new_tokens=a.new_tokens, stop_ids=stop, early_exit=rule)
            out.append(r)
        return out

    full = run(None)
    t_full = sum(r.time_s for r in full)
    ppl_full = sum(perplexity(model, p, r.ids) for p, r in zip(prompts, full)) / len(prompts)
    print(f"SmolLM2-135M, {L} blocks; {len(prompts)} held-out prompts x up to {a.new_tokens} new tokens, greedy; "
          f"exits checked from layer {a.min_layer}")
    print(f"full model: {t_full:.1f} s, {sum(len(r.ids) for r in full)} tokens, perplexity of its own text "
          f"{ppl_full:.2f}")
    hdr = (f"{'lens':6} {'test':10} {'thr':>5} {'blocks run':>10} {'FLOPs/full':>10} {'time/full':>9} "
           f"{'agree':>6} {'prefix':>6} {'ppl':>7}")
    print(hdr)
    rows = []
    configs = [(lens, "full", th) for lens in a.lenses.split(",") for th in ths]
    configs += [(lens, "candidates", th) for lens in a.lenses.split(",") for th in ths]
    for lens, test, th in configs:
        rule = ExitRule(lens=lens, threshold=th, min_layer=a.min_layer, test=test, candidates=32,
                        tuned=tuned if lens == "tuned" else None)
        res = run(rule)
        exits = [s.exit_layer for r in res for s in r.steps]
        blocks = sum(exits) / (len(exits) * L)
        flops = sum(r.flops["total"] for r in res) / sum(r.flops["full_model"] for r in res)
        t = sum(r.time_s for r in res) / t_full
        agree_n = agree_d = 0
        prefix = 0
        for r, f in zip(res, full):
            n = min(len(r.ids), len(f.ids))
            agree_n += sum(int(x == y) for x, y in zip(r.ids[:n], f.ids[:n]))
            agree_d += n
            k = 0
            while k < n and r.ids[k] == f.ids[k]:
                k += 1
            prefix += k
        ppl = sum(perplexity(model, p, r.ids) for p, r in zip(prompts, res)) / len(prompts)
        row = dict(lens=lens, test=test, threshold=th, blocks=blocks, flops=flops, time=t,
                   agreement=agree_n / agree_d, prefix=prefix / len(prompts), ppl=ppl)
        rows.append(row)
        print(f"{lens:6} {test:10} {th:5.2f} {blocks:10.1%} {flops:10.2f} {t:9.2f} {row['agreement']:6.1%} "
              f"{row['prefix']:6.1f} {ppl:7.2f}", flush=True)

    # settle's teacher-forced estimate on the same full-greedy sequences
    seqs = [torch.cat([p, torch.tensor(r.ids)])[None] for p, r in zip(prompts, full)]
    print("settle's estimate on the full model's own sequences (every position, teacher forcing):")
    for lens in a.lenses.split(","):
        est = settle(borders, seqs, thresholds=ths, translator=tuned if lens == "tuned" else None,
                     min_layer=a.min_layer)
        for ex in est.exits:
            ours = next(r for r in rows if r["lens"] == lens and r["test"] == "full" and r["threshold"] == ex.threshold)
            print(f"  {lens:6} thr {ex.threshold:4.2f}: settle blocks run {1 - ex.saved_block_fraction:6.1%}, "
                  f"FLOPs {1 - ex.saved_flops_fraction:5.2f}x, agreement {ex.agreement:6.1%}  |  executed: blocks "
                  f"{ours['blocks']:6.1%}, FLOPs {ours['flops']:5.2f}x, agreement {ours['agreement']:6.1%}")
    best = min((r for r in rows), key=lambda r: r["flops"])
    print(f"Geva et al. 2022 saved ~20% of compute; here the cheapest setting ({best['lens']}, {best['test']} test, "
          f"threshold {best['threshold']}) spends {best['flops']:.2f}x the full model's FLOPs "
          f"({1 - best['flops']:+.1%} saved) and {best['time']:.2f}x its wall time.")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from vocablens.files import atomic_path

        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for (lens, test) in sorted({(r["lens"], r["test"]) for r in rows}):
            rs = [r for r in rows if r["lens"] == lens and r["test"] == test]
            lab = f"{lens} lens, {test} test"
            ax[0].plot([r["blocks"] for r in rs], [r["agreement"] for r in rs], "o-", label=lab)
            ax[1].plot([r["threshold"] for r in rs], [r["flops"] for r in rs], "o-", label=lab)
        ax[0].set_xlabel("fraction of blocks run")
        ax[0].set_ylabel("token agreement with full greedy")
        ax[1].axhline(1.0, color="gray", lw=0.8)
        ax[1].set_xlabel("threshold")
        ax[1].set_ylabel("FLOPs / full model")
        ax[0].legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(a.plot, suffix=".png") as tmp:
            fig.savefig(tmp)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
