"""Benchmark: vocablens beside the libraries its users would otherwise pick, on the default model.

Jobs (issue 28), SmolLM2-135M (V = 49,152, 30 blocks), float32, ``--threads`` threads, on English
prose from a corpus vocablens names (``pydoc-topics``: CPython's language-reference topics, shipped
with CPython, so every job reads real text and the 4,096-token job really has 4,096 tokens):

1. logit lens, 31 layers x 512 positions: top-5, entropy and KL(final || layer) at every cell;
2. per-token log-probabilities of 128, 512 and 4,096 tokens (``--score-tokens``), like for like:
   ``score_ids(b, ids, entropy=False)`` beside what a user writes for log-probs,
   ``model(ids[None], use_cache=False).logits[0, :-1].log_softmax(-1).gather(1, ids[1:, None])``, and
   ``score_ids(b, ids)`` (log-probs and the entropy, what ``vocablens score`` prints) beside the same
   call plus ``-(lp.exp() * lp).sum(-1)``; and ``score_ids(b, ids)`` beside the log-probs-only call;
3. greedy generation of 30 tokens;
4. the 10 cosine neighbours of " king" in the embedding (first call, then per query);
5. a batched lens: 16 prompts of 13..43 tokens, every position, top-5 + entropy + KL.

Beside: plain transformers / torch (always), and TransformerLens (``TransformerBridge``) and nnsight
when they are installed (``pip install vocablens[peers]``); a peer that is missing or cannot run
offline is skipped with the reason. The calls of a job alternate in one process (ABBA order); the
table gives each method's minimum of ``--reps`` runs, and the ratio vocablens / best peer both as
the ratio of the minima and as the median of the per-round ratios (each round's two calls ran
side by side, so on a busy machine the median of those pairs is the figure to trust), in wall time
and in CPU time (the process's, all threads). Peak memory growth (``--memory``, ``--lens-memory``)
is measured in a fresh process per method. Agreement with vocablens is checked: top-1 at every
(layer, position) cell, KL within 1e-3 nats + 3e-5 x KL (see ``KL_REL``), the largest difference of
log-probabilities (printed), the same generated tokens, the same neighbour ids. The load average is
printed before and after.

    python benchmarks/peers.py [--reps 5] [--threads 2] [--jobs score] [--score-tokens 128 512 4096] [--memory]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


from alternate import corpus_text, paired, timed  # noqa: E402  (benchmarks/alternate.py)
from score import _vm  # noqa: E402  (benchmarks/score.py: a process's VmRSS/VmHWM in bytes)


def _setup(threads: int):
    import torch

    import vocablens

    torch.set_num_threads(threads)
    lm = vocablens.load("smollm2")
    text = corpus_text(lm.tokenizer, 4096)
    ids = torch.tensor(lm.tokenizer(text).input_ids[:4096])
    lines = [ln for ln in text.splitlines() if len(ln) > 60][:16]
    prompts = [torch.tensor(lm.tokenizer(ln).input_ids[:13 + 2 * i]) for i, ln in enumerate(lines)]
    return torch, lm, ids, prompts


# ------------------------------------------------------------------------------------------ peers
def find_peers(lm) -> tuple[dict, dict]:
    """``(found, skipped)``: name -> wrapper object, name -> reason."""
    import copy

    found, skipped = {}, {}
    # each peer wraps its own copy: TransformerLens's bridge replaces the model's modules and nnsight
    # patches their forwards, which would slow (and change) the transformers and vocablens calls
    try:
        from nnsight import LanguageModel

        found["nnsight"] = LanguageModel(copy.deepcopy(lm.model), tokenizer=lm.tokenizer)
    except ImportError as e:
        skipped["nnsight"] = f"not installed ({e.name}); pip install vocablens[peers]"
    except Exception as e:  # noqa: BLE001 (a peer that cannot wrap this model is skipped, said why)
        skipped["nnsight"] = f"cannot wrap the model: {type(e).__name__}: {str(e)[:120]}"
    try:
        from transformer_lens.model_bridge import TransformerBridge

        found["TransformerLens"] = _boot_bridge(TransformerBridge, lm)
    except ImportError as e:
        skipped["TransformerLens"] = f"not installed ({e.name}); pip install vocablens[peers]"
    except Exception as e:  # noqa: BLE001
        skipped["TransformerLens"] = f"cannot boot the model offline: {type(e).__name__}: {str(e)[:160]}"
    return found, skipped


def _boot_bridge(TransformerBridge, lm):
    import inspect

    params = inspect.signature(TransformerBridge.boot_transformers).parameters
    import copy

    kw = {k: v for k, v in (("hf_model", copy.deepcopy(lm.model)), ("tokenizer", lm.tokenizer), ("device", "cpu")) if k in params}
    bridge = TransformerBridge.boot_transformers("HuggingFaceTB/SmolLM2-135M-Instruct", **kw)
    return bridge


# ------------------------------------------------------------------------------------------ jobs
def lens_stats(torch, lp_layers, final_lp):
    """Per layer: (top-5 ids [P, 5], entropy [P], KL(final || layer) [P]) from log-probs [P, V]."""
    pf = final_lp.exp()
    out = []
    for lp in lp_layers:
        out.append((lp.topk(5, dim=-1).indices, -(lp.exp() * lp).sum(-1), (pf * (final_lp - lp)).sum(-1)))
    return out


def lens_methods(torch, lm, peers):
    from vocablens.lens import logit_lens

    model, b = lm.model, lm.borders
    norm, head = model.model.norm, model.lm_head

    def vocablens_lens(ids):
        r = logit_lens(b, ids, positions="all", k=5)
        return [(ly.top_ids, ly.entropy, ly.kl_to_final) for ly in r.layers]

    def from_states(hs, logits):  # hs: layers 0..L-1 [P, d] (before the final norm); logits [P, V]
        final = logits.float().log_softmax(-1)
        pf = final.exp()
        out = []
        for h in hs:
            lp = head(norm(h)).float().log_softmax(-1)
            out.append((lp.topk(5, dim=-1).indices, -(lp.exp() * lp).sum(-1), (pf * (final - lp)).sum(-1)))
        out.append((final.topk(5, dim=-1).indices, -(pf * final).sum(-1), torch.zeros(final.shape[0])))
        return out

    def torch_lens(ids):  # output_hidden_states: [0..L-1] = inputs of blocks 0..L-1, [L] after the norm
        o = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        return from_states([h[0] for h in o.hidden_states[:-1]], o.logits[0])

    methods = {"vocablens": vocablens_lens, "transformers": torch_lens}
    if "nnsight" in peers:
        nm = peers["nnsight"]

        def nnsight_lens(ids):
            hs = []
            with nm.trace(ids[None]):  # a loop, not a comprehension: nnsight hands back this frame's names
                for layer in nm.model.layers:
                    hs.append(layer.input.save())  # the input of block i = layer i
                logits = nm.lm_head.output.save()
            return from_states([_value(h)[0] for h in hs], _value(logits)[0])

        methods["nnsight"] = nnsight_lens
    if "TransformerLens" in peers:
        br = peers["TransformerLens"]

        def tl_lens(ids):
            logits, cache = br.run_with_cache(ids[None], names_filter=lambda n: n.endswith("hook_resid_pre"))
            L = lm.borders.n_layers
            hs = [cache[f"blocks.{i}.hook_resid_pre"][0] for i in range(L)]
            return from_states(hs, logits[0])

        methods["TransformerLens"] = tl_lens
    return methods


def _value(x):
    return getattr(x, "value", x)


def score_methods(torch, lm, peers):
    from vocablens.generate.score import score_ids

    model = lm.model

    def gather(lg, ids):
        return lg[:-1].float().log_softmax(-1).gather(1, ids[1:, None])[:, 0]

    def user(ids):  # what a user writes: the whole forward, then a [T-1, V] log-softmax and a gather
        return model(ids[None], use_cache=False).logits[0, :-1].log_softmax(-1).gather(1, ids[1:, None])[:, 0]

    def user_like_score(ids):  # what a user writes to get what `vocablens score` prints: log-probs and entropy
        lp = model(ids[None], use_cache=False).logits[0, :-1].log_softmax(-1)
        return lp.gather(1, ids[1:, None])[:, 0], -(lp.exp() * lp).sum(-1)

    methods = {"vocablens": lambda ids: score_ids(lm.borders, ids).logprobs,
               "vocablens log-probs": lambda ids: score_ids(lm.borders, ids, entropy=False).logprobs,
               "transformers": user, "transformers+entropy": lambda ids: user_like_score(ids)[0]}
    if "nnsight" in peers:
        nm = peers["nnsight"]

        def nnsight_score(ids):
            with nm.trace(ids[None]):
                logits = nm.lm_head.output.save()
            return gather(_value(logits)[0], ids)

        methods["nnsight"] = nnsight_score
    if "TransformerLens" in peers:
        br = peers["TransformerLens"]
        methods["TransformerLens"] = lambda ids: gather(br(ids[None], return_type="logits")[0], ids)
    return methods


def generate_methods(torch, lm, peers, n: int):
    from vocablens.generate.loop import generate

    model = lm.model

    def hf(ids):
        out = model.generate(ids[None], do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=lm.tokenizer.eos_token_id)
        return out[0, ids.numel():].tolist()

    methods = {"vocablens": lambda ids: [t.id for t in generate(lm.borders, ids, max_new_tokens=n, top_n=0).tokens],
               "transformers": hf}
    if "TransformerLens" in peers:
        br = peers["TransformerLens"]

        def tl(ids):
            out = br.generate(ids[None], max_new_tokens=n, do_sample=False, stop_at_eos=False, verbose=False)
            return out[0, ids.numel():].tolist()

        methods["TransformerLens"] = tl
    return methods


def batch_methods(torch, lm, peers):
    from vocablens.lens import logit_lens

    model, b = lm.model, lm.borders
    norm, head = model.model.norm, model.lm_head

    def unpack(results):
        return [[(ly.top_ids, ly.entropy, ly.kl_to_final) for ly in r.layers] for r in results]

    def torch_batch(prompts):  # right-padded batch, attention mask, then every layer's head per prompt
        n = [int(x.numel()) for x in prompts]
        ids = torch.zeros(len(prompts), max(n), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, x in enumerate(prompts):
            ids[i, :n[i]], mask[i, :n[i]] = x, 1
        o = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        keep = mask.bool()
        final = o.logits[keep].float().log_softmax(-1)  # [N, V] every real position of every prompt
        pf = final.exp()
        per_layer = []
        for h in o.hidden_states[:-1]:
            lp = head(norm(h[keep])).float().log_softmax(-1)
            per_layer.append((lp.topk(5, dim=-1).indices, -(lp.exp() * lp).sum(-1), (pf * (final - lp)).sum(-1)))
        per_layer.append((final.topk(5, dim=-1).indices, -(pf * final).sum(-1), torch.zeros(final.shape[0])))
        offs = [0]
        for c in n:
            offs.append(offs[-1] + c)
        return [[tuple(t[offs[i]:offs[i + 1]] for t in ly) for ly in per_layer] for i in range(len(prompts))]

    return {"vocablens batched": lambda ps: unpack(logit_lens(b, ps, positions="all", k=5)),
            "vocablens one by one": lambda ps: unpack([logit_lens(b, x, positions="all", k=5) for x in ps]),
            "transformers batched": torch_batch}


# ------------------------------------------------------------------------------------------ checks
#: the peers' KL(final || layer) is a float32 log-softmax of each layer's logits, then a float32 sum:
#: its error grows with the logits' size, not with V. Beside a float64 reference on the same hidden
#: states (512 tokens, every layer), the peers' KL was off by up to 3.3e-3 nats where KL = 238 nats
#: (layer 0; 1.4e-5 x KL; 5e-4 at KL = 36, layer 1), vocablens's by at most 7e-5 nats (its readout
#: shifts each row by its max before the log-softmax and sums in float32 rows): the disagreement was
#: the peers' rounding. So a cell agrees when |dKL| <= 1e-3 + KL_REL x KL.
KL_REL = 3e-5


def lens_agreement(torch, ours, theirs) -> str:
    top1 = all(torch.equal(a[0][:, 0], c[0][:, 0]) for a, c in zip(ours, theirs))
    kl = max(float((a[2] - c[2]).abs().max()) for a, c in zip(ours, theirs))
    excess = max(float(((a[2] - c[2]).abs() - (1e-3 + KL_REL * a[2].abs())).max()) for a, c in zip(ours, theirs))
    ok = top1 and excess <= 0
    return (f"{'ok' if ok else 'DISAGREES'} (top-1 equal at every cell: {top1}; max |dKL| {kl:.1e} nats, "
            f"within 1e-3 + {KL_REL:.0e} x KL: {excess <= 0})")


def memory_child(job: str, method: str, threads: int, T: int) -> None:
    torch, lm, ids, _ = _setup(threads)
    peers = find_peers(lm)[0] if method not in ("vocablens", "transformers") else {}
    fn = (score_methods if job == "score" else lens_methods)(torch, lm, peers)[method]
    with torch.inference_mode():
        fn(ids[:16])  # one-time set-up (kernels, lazy buffers) before the baseline
        base = _vm("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark
        fn(ids[:T])
        peak = _vm("VmHWM")
    print(json.dumps({"extra_bytes": peak - base}))


def memory(job: str, methods, threads: int, T: int) -> dict:
    out = {}
    for k in methods:
        r = subprocess.run([sys.executable, __file__, "--child", job, k, str(threads), str(T)],
                           capture_output=True, text=True)
        lines = r.stdout.strip().splitlines()
        out[k] = json.loads(lines[-1])["extra_bytes"] if r.returncode == 0 and lines else None
    return out


def row(name, best, rounds, ref="vocablens", extra=None, exclude=()):
    others = {k: v for k, v in best.items() if k != ref and k not in exclude}
    peer = min(others, key=others.get)
    cells = ", ".join(f"{k} {v:.3f} s" for k, v in best.items())
    r = paired(rounds, ref, peer)
    print(f"| {name} | {cells} | {r['min_wall']:.2f}x (median of pairs {r['median_wall']:.2f}x; CPU "
          f"{r['min_cpu']:.2f}x, median {r['median_cpu']:.2f}x) vs {peer} |{'' if extra is None else ' ' + extra + ' |'}")
    return r


JOBS = ("lens", "score", "generate", "neighbours", "batch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="positions of the logit-lens job")
    ap.add_argument("--score-tokens", type=int, nargs="*", default=[128, 512, 4096],
                    help="prompt lengths of the per-token log-probs job")
    ap.add_argument("--jobs", nargs="*", choices=JOBS, default=list(JOBS), help="the jobs to run (default all)")
    ap.add_argument("--memory", action="store_true", help="also the peak memory growth of score at 4,096 tokens")
    ap.add_argument("--lens-memory", action="store_true", help="with --memory: the lens's too, every method")
    a = ap.parse_args()
    load = os.getloadavg()
    torch, lm, ids, prompts = _setup(a.threads)
    from vocablens.geometry.embedding import nearest_neighbors

    peers, skipped = find_peers(lm) if {"lens", "score", "generate"} & set(a.jobs) else ({}, {})
    b, T = lm.borders, a.tokens
    x = ids[:T]
    print(f"model smollm2 (V={b.vocab_size}, d={b.d_model}, {b.n_layers} blocks), float32, {a.threads} threads, "
          f"{a.reps} alternated rounds; text: pydoc-topics; torch {torch.__version__}")
    print(f"peers found: {', '.join(['transformers'] + list(peers))}")
    for k, why in skipped.items():
        print(f"peer skipped: {k}: {why}")
    print("| job | times (min) | vocablens / best peer | agreement |")
    print("|---|---|---|---|")
    if "lens" in a.jobs:
        best, out, rounds = timed(torch, lens_methods(torch, lm, peers), x, a.reps)
        agree = "; ".join(f"{k}: {lens_agreement(torch, out['vocablens'], v)}" for k, v in out.items() if k != "vocablens")
        row(f"logit lens, {b.n_layers + 1} layers x {T} positions, top-5 + entropy + KL", best, rounds, extra=agree)
    score_ratios = {}
    for n in (sorted(set(a.score_tokens)) if "score" in a.jobs else []):
        best, out, rounds = timed(torch, score_methods(torch, lm, peers), ids[:n], a.reps)
        agree = "; ".join(f"{k}: max |dlogp| {float((out['vocablens'] - v).abs().max()):.1e}" for k, v in out.items()
                          if k != "vocablens")
        score_ratios[f"{n:,} tokens, log-probs (entropy=False)"] = paired(rounds, "vocablens log-probs", "transformers")
        score_ratios[f"{n:,} tokens, log-probs + entropy (as score prints)"] = paired(rounds, "vocablens",
                                                                                    "transformers+entropy")
        score_ratios[f"{n:,} tokens, score_ids with its entropy vs log-probs only"] = paired(rounds, "vocablens",
                                                                                           "transformers")
        row(f"per-token log-probs of {n} tokens", best, rounds, extra=agree, exclude=("vocablens log-probs",))
    if "generate" in a.jobs:
        best, out, rounds = timed(torch, generate_methods(torch, lm, peers, 30), ids[:16], a.reps)
        agree = "; ".join(f"{k}: same tokens {out['vocablens'][:len(v)] == v}" for k, v in out.items() if k != "vocablens")
        row("greedy generate, 30 tokens", best, rounds, extra=agree)
    nb = None
    if "neighbours" in a.jobs:  # the first call after the load (mask, token table), then per query
        tok = lm.tokenizer
        t0 = time.perf_counter()
        first = nearest_neighbors(b, tok, [" king"], k=10)
        t_first = time.perf_counter() - t0
        qid = first.results[0].query_ids[0]
        W = b.W_E.detach()

        def plain(_):
            Wn = torch.nn.functional.normalize(W.float(), dim=1)
            return (Wn @ Wn[qid]).topk(11).indices

        nb_best, nb_out, nb_rounds = timed(torch, {"vocablens": lambda _: nearest_neighbors(b, tok, [" king"], k=10),
                                                   "torch": plain}, None, max(a.reps, 10))
        same = first.results[0].lists[0].ids.tolist() == [i for i in nb_out["torch"].tolist() if i != qid][:10]
        row('neighbours of " king", top 10 (per query)', nb_best, nb_rounds,
            extra=f"first call {t_first:.3f} s; same ids: {same}")
        nb = (nb_best["vocablens"] / nb_best["torch"], t_first)
    if "batch" in a.jobs:
        best, out, rounds = timed(torch, batch_methods(torch, lm, peers), prompts, a.reps)
        agree = "; ".join(f"{k}: " + lens_agreement(torch, [c for p in out["vocablens batched"] for c in p],
                                                    [c for p in v for c in p])
                          for k, v in out.items() if k != "vocablens batched")
        n_tok = sum(int(p.numel()) for p in prompts)
        row(f"batched lens, {len(prompts)} prompts ({n_tok} tokens), every position", best, rounds,
            ref="vocablens batched", extra=agree)
    if a.memory:
        mem = memory("score", ["vocablens", "transformers"], a.threads, 4096)
        print(f"score peak memory growth at 4,096 tokens: " + ", ".join(
            f"{k} {v / 2**20:.0f} MiB" for k, v in mem.items() if v is not None)
              + (f"; ratio {mem['vocablens'] / mem['transformers']:.2f}x (target <= 0.5x)" if all(mem.values()) else ""))
        if a.lens_memory:
            mem = memory("lens", ["vocablens", "transformers", *peers], a.threads, T)
            print(f"lens peak memory growth at {T} positions: " + ", ".join(
                f"{k} {v / 2**20:.0f} MiB" for k, v in mem.items() if v is not None))
    end = os.getloadavg()
    if score_ratios:
        print("target: score <= 1.0x transformers' time (vocablens / transformers):")
        for n, r in score_ratios.items():
            print(f"  {n}: {r['min_wall']:.2f}x (median of pairs {r['median_wall']:.2f}x; CPU {r['min_cpu']:.2f}x, "
                  f"median {r['median_cpu']:.2f}x)")
    if nb is not None:
        print(f"targets: neighbours per query {nb[0]:.2f}x torch (<= 1.5x), first call {nb[1]:.3f} s (<= 0.5 s)")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before, {end[0]:.2f} {end[1]:.2f} {end[2]:.2f} after")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        memory_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
