"""Suppressing a concept by steering value vectors: mass removed vs fluency lost (default model).

A stand-in, with what is offline, for Geva et al. (2022) §5.1 (toxicity halved by 10 value vectors):
the concept is a list of 30 programming nouns (' function', ' class', ' module' ...), frequent in the
held-out text: the validation split of ``pydoc-topics`` (ships with Python), cut into ``--texts``
pieces of ``--chars`` characters.

For each setting (suppress mode boost|ablate, top-n, scale) it prints, measured in one run:
* the concept's mean next-token probability over all held-out positions, before and after, and the ratio;
* the perplexity of the held-out text, before and after (all tokens), and the perplexity over only the
  positions whose next token is NOT a concept word (the fluency cost outside the concept);
and then the best setting that halves the mass, and whether its perplexity cost is <= 5%.

Run: ``PYTHONPATH=src python benchmarks/steer.py [--texts 4] [--chars 1200]``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

WORDS = ["function", "class", "method", "object", "module", "variable", "argument", "value", "attribute",
         "expression", "statement", "list", "string", "integer", "dictionary", "tuple", "instance",
         "exception", "keyword", "parameter", "operator", "type", "name", "file", "loop", "index", "element",
         "sequence", "number", "code"]


def measure(borders, seqs, concept):
    """(mean concept mass, ppl over all tokens, ppl over non-concept next tokens)."""
    from vocablens.ops import token_logprobs

    U = borders.unembedding
    cset = torch.tensor(concept)
    masses, nll_all, n_all, nll_out, n_out = [], 0.0, 0, 0.0, 0
    with torch.no_grad():
        for x in seqs:
            resid, _ = borders.residual_stream(x[None])
            h = U.normed(resid[-1, 0])[:-1]
            r = token_logprobs(h, U.weight, x[1:], **U.head_kwargs())
            masses.append((U.logits(h, rows=concept) - r.lse[:, None]).exp().sum(-1))
            nll = -r.logprob.double()
            keep = ~torch.isin(x[1:], cset)
            nll_all, n_all = nll_all + float(nll.sum()), n_all + nll.numel()
            nll_out, n_out = nll_out + float(nll[keep].sum()), n_out + int(keep.sum())
    return float(torch.cat(masses).mean()), math.exp(nll_all / n_all), math.exp(nll_out / n_out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=4)
    ap.add_argument("--chars", type=int, default=1200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    import vocablens.models as M
    from vocablens.vocab_space.steer import steer
    from vocablens.surgery.io import heldout_texts

    lm = M.load("smollm2")
    b, tok = lm.borders, lm.tokenizer
    vocab = tok.get_vocab()
    concept = [vocab["Ġ" + w] for w in WORDS if "Ġ" + w in vocab]
    seqs = [tok(t, return_tensors="pt").input_ids[0][:384] for t in heldout_texts("pydoc-topics", a.texts, a.chars)]
    n_tok = sum(int(s.numel()) - 1 for s in seqs)
    m0, p0, q0 = measure(b, seqs, concept)
    print(f"concept: {len(concept)} single-token programming nouns; held-out: {len(seqs)} pydoc-topics texts, "
          f"{n_tok} predicted tokens")
    print(f"unsteered: concept mass {m0:.4f}, perplexity {p0:.3f} (non-concept positions {q0:.3f})")
    print(f"{'mode':<7}{'top-n':>6}{'scale':>7}{'mass':>9}{'ratio':>8}{'ppl':>9}{'cost':>8}{'ppl out':>9}"
          f"{'cost out':>9}{'s':>6}")
    best = None
    for mode in ("boost", "ablate"):
        for top_n in (5, 10, 20, 40):
            for scale in ((2.0, 4.0, 8.0) if mode == "boost" else (1.0,)):
                t0 = time.perf_counter()
                st = steer(b, suppress=concept, top_n=top_n, scale=scale, suppress_mode=mode)
                with st:
                    m1, p1, q1 = measure(b, seqs, concept)
                dt = time.perf_counter() - t0
                row = (mode, top_n, scale, m1, m1 / m0, p1, p1 / p0 - 1, q1, q1 / q0 - 1)
                print(f"{mode:<7}{top_n:>6}{scale if mode == 'boost' else 0:>7g}{m1:>9.4f}{m1 / m0:>8.3f}"
                      f"{p1:>9.3f}{p1 / p0 - 1:>+8.1%}{q1:>9.3f}{q1 / q0 - 1:>+9.1%}{dt:>6.1f}")
                if m1 / m0 <= 0.5 and (best is None or row[8] < best[8]):
                    best = row
    if best is None:
        print("no setting halved the concept's mass")
    else:
        mode, top_n, scale, m1, r, p1, c, q1, co = best
        print(f"best that halves the mass: {mode} top-n {top_n} scale {scale:g}: mass x{r:.3f}, perplexity "
              f"{c:+.1%} (non-concept positions {co:+.1%}); target <= +5%: {'met' if co <= 0.05 else 'missed'}")


if __name__ == "__main__":
    main()
