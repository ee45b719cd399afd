"""The Jacobian lens on the default model: fitting against TransformerLens 4.3, applying against the
tuned lens, and held-out KL per layer for the logit, tuned and Jacobian lens.

    python benchmarks/jacobian_lens.py fit [--prompts 1 --seq-len 64 --dim-batch 8 --tl-python /work/venv-tl/bin/python]
    python benchmarks/jacobian_lens.py apply [--tokens 512 --repeats 5]
    python benchmarks/jacobian_lens.py kl [--lens DIR --max-tokens 2048]

``fit``: the same token ids (pydoc-topics, training split) are fitted by vocablens
(:func:`vocablens.lens.jacobian_fit.fit_jacobian_lens`) and by TransformerLens 4.3's estimator
(``transformer_lens.tools.analysis.jacobian_lens``: a raw ``TransformerBridge`` booted on the same
checkpoint folder, its per-prompt driver fed the same ids), each in its own process, alternating
(ours, theirs, ours, theirs ...), each process in its own virtual environment (TransformerLens in
``--tl-python``'s, installed apart: ``python3 -m venv /work/venv-tl; pip install torch==2.13.0
transformer-lens==4.3.0``). Printed: wall seconds and CPU seconds (user + system, all threads) of the fit alone, peak resident memory of the
process and the part the fit added, the ratios, and the largest difference between the two
lenses' matrices (their block l = our stream layer l+1). Where TransformerLens does not install or
boot, the ratio is not printed and the reason is.

``apply``: per layer, the translator's cost (tuned: ``h + h Aᵀ + b``; Jacobian: ``h Jᵀ``) for all L
layers of N tokens, and the shared readout (final norm, head, KL over V) that follows both, timed
alternately in one process.

``kl``: :func:`vocablens.lens.compare.compare_lenses` on held-out text (the validation split of
pydoc-topics, which neither shipped lens was fitted on): KL per layer for the three lenses.

Threads: the same for both (``--threads``, default 1: on a shared machine a second thread mostly
spins; CPU time is the figure least moved by the load).

Always say the load average with a figure (it is printed): the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TL_DRIVER = r'''
import json, resource, sys, time, torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis import jacobian_lens as jl
model_dir, ids_path, out_path, dim_batch, skip = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(int(sys.argv[6]))
ids = torch.load(ids_path, weights_only=True)
bridge = TransformerBridge.boot_transformers(model_dir, device="cpu", dtype=torch.float32)
bridge.eval()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ru0 = resource.getrusage(resource.RUSAGE_SELF)
layers = list(range(bridge.cfg.n_layers - 1))
t0 = time.perf_counter()
sums = None
with jl._frozen_parameters(bridge):
    for row in ids:
        J = jl._jacobian_for_prompt(bridge, row[None], source_layers=layers, dim_batch=dim_batch,
                                    skip_first_positions=skip, backward_provider=jl._ordinary_vjp)
        sums = J if sums is None else {k: sums[k] + J[k] for k in J}
wall = time.perf_counter() - t0
ru1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
torch.save({k: v / len(ids) for k, v in sums.items()}, out_path)
print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "rss_before_fit_kib": rss0}))
'''

_OURS_DRIVER = r'''
import json, resource, sys, time, torch
from vocablens.models.files.loader import load_mode
from vocablens.lens.jacobian_fit import JacobianFitSettings, fit_jacobian_lens
model_dir, ids_path, out_path, dim_batch, skip = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(int(sys.argv[6]))
ids = torch.load(ids_path, weights_only=True)
lm = load_mode(model_dir, "full")
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ru0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
lens = fit_jacobian_lens(lm.borders, ids, JacobianFitSettings(skip_first=skip, dim_batch=dim_batch,
                                                              layers=tuple(range(1, lm.borders.n_layers))))
wall = time.perf_counter() - t0
ru1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
torch.save({ly: lens.matrix(ly) for ly in lens.layers}, out_path)
print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "rss_before_fit_kib": rss0}))
'''


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _model_dir() -> str:
    """The default model's dequantized checkpoint folder (safetensors + config), which both fits read."""
    from vocablens.models.files.loader import load_mode

    lm = load_mode("smollm2", "full")
    src = getattr(lm.provenance, "cache_dir", None) or getattr(lm.provenance, "path", None)
    cands = sorted(Path.home().glob(".cache/vocablens/gguf/SmolLM2-135M-Instruct*/config.json"))
    if cands:
        return str(cands[0].parent)
    raise SystemExit(f"no dequantized folder of the default model found ({src}); run `vocablens anatomy` once")


def fit(args) -> None:
    import torch

    import vocablens

    lm = vocablens.load("smollm2")
    rows, _ = lm.corpus_rows("pydoc-topics", "train", args.seq_len, args.prompts * args.seq_len, 0.1, 0, 0)
    rows = rows[: args.prompts]
    model_dir = _model_dir()
    tmp = Path(tempfile.mkdtemp(prefix="jlens-bench-"))
    torch.save(rows.clone(), tmp / "ids.pt")
    env = dict(os.environ)
    runs: dict[str, list[dict]] = {"vocablens": [], "transformer_lens": []}
    why_not = None
    for rep in range(args.repeats):
        for who in ("vocablens", "transformer_lens"):
            if who == "transformer_lens" and (why_not or not Path(args.tl_python).exists()):
                why_not = why_not or f"{args.tl_python} does not exist"
                continue
            py = sys.executable if who == "vocablens" else args.tl_python
            code = _OURS_DRIVER if who == "vocablens" else _TL_DRIVER
            out = tmp / f"{who}.pt"
            cmd = [py, "-c", code, model_dir, str(tmp / "ids.pt"), str(out), str(args.dim_batch), str(args.skip_first),
                   str(args.threads)]
            e = env if who == "vocablens" else {k: v for k, v in env.items() if k != "PYTHONPATH"}
            p = subprocess.run(cmd, capture_output=True, text=True, env=e)
            if p.returncode != 0:
                if who == "transformer_lens":
                    why_not = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
                    continue
                raise SystemExit(p.stderr[-2000:])
            rec = json.loads(p.stdout.strip().splitlines()[-1])
            rec["load"] = _load()
            runs[who].append(rec)
            print(f"{who:17s} rep {rep + 1}: fit {rec['seconds']:7.1f} s ({rec['cpu_seconds']:.1f} CPU s), peak RSS {rec['peak_rss_kib'] / 1024:7.0f} MiB "
                  f"(before the fit {rec['rss_before_fit_kib'] / 1024:.0f} MiB), load {rec['load']}", flush=True)
    print(f"\n{args.prompts} prompts x {args.seq_len} tokens, dim_batch {args.dim_batch}, skip_first {args.skip_first}, "
          f"{args.threads} threads, source layers = every block output below the last (TL 0..L-2 = our 1..L-1)")
    if why_not or not runs["transformer_lens"]:
        print(f"TransformerLens 4.3 not measured: {why_not}")
        return
    best = {w: min(r["seconds"] for r in runs[w]) for w in runs}
    cpu = {w: min(r["cpu_seconds"] for r in runs[w]) for w in runs}
    peak = {w: max(r["peak_rss_kib"] for r in runs[w]) for w in runs}
    add = {w: max(r["peak_rss_kib"] - r["rss_before_fit_kib"] for r in runs[w]) for w in runs}
    print(f"time  vocablens / TransformerLens = {best['vocablens']:.1f} / {best['transformer_lens']:.1f} s "
          f"= {best['vocablens'] / best['transformer_lens']:.2f}x (best of {args.repeats} each); CPU time "
          f"{cpu['vocablens']:.1f} / {cpu['transformer_lens']:.1f} s = {cpu['vocablens'] / cpu['transformer_lens']:.2f}x")
    print(f"peak RSS  {peak['vocablens'] / 1024:.0f} / {peak['transformer_lens'] / 1024:.0f} MiB = "
          f"{peak['vocablens'] / peak['transformer_lens']:.2f}x; added by the fit {add['vocablens'] / 1024:.0f} / "
          f"{add['transformer_lens'] / 1024:.0f} MiB")
    ours = torch.load(tmp / "vocablens.pt", weights_only=True)
    theirs = torch.load(tmp / "transformer_lens.pt", weights_only=True)
    diffs = [float((ours[b + 1] - theirs[b]).abs().max()) for b in sorted(theirs)]
    scale = max(float(m.abs().max()) for m in theirs.values())
    print(f"max |J_ours - J_TL| over {len(diffs)} layers: {max(diffs):.2e} (largest entry {scale:.2f}; "
          f"attention: ours the model's own, TL eager)")


def apply(args) -> None:
    import torch

    from vocablens.lens.jacobian import JacobianLens
    from vocablens.lens.tuned import TunedLens
    from vocablens.models.files.loader import load_mode
    from vocablens.ops import kl_readout

    lm = load_mode("smollm2", "full")
    b = lm.borders
    L, d = b.n_layers, b.d_model
    tuned = TunedLens.for_model(b)
    jac = JacobianLens(torch.eye(d).repeat(L, 1, 1), list(range(L)), L)
    H = torch.randn(L, args.tokens, d)
    U = b.unembedding.float32()
    ref = torch.randn(args.tokens, b.vocab_size)
    t = {"tuned": [], "jacobian": [], "readout": []}
    for _ in range(args.repeats):
        for name, fn in (("tuned", lambda: tuned.translate_all(H)), ("jacobian", lambda: jac.translate_all(H)),
                         ("readout", lambda: kl_readout(U.normed(H[:4], torch.float32), U.weight, ref, **U.head_kwargs()))):
            t0 = time.perf_counter()
            with torch.no_grad():
                fn()
            t[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in t.items()}
    per_layer_readout = best["readout"] / 4
    print(f"{L} layers x {args.tokens} tokens, d={d}, V={b.vocab_size}; best of {args.repeats}; load {_load()}")
    print(f"translators, all layers: tuned {best['tuned'] * 1e3:.1f} ms, Jacobian {best['jacobian'] * 1e3:.1f} ms "
          f"(ratio {best['jacobian'] / best['tuned']:.2f}x)")
    print(f"shared readout (final norm, head, KL over V): {per_layer_readout * 1e3:.1f} ms per layer, "
          f"{per_layer_readout * L * 1e3:.0f} ms for all layers; lens total Jacobian / tuned = "
          f"{(best['jacobian'] + per_layer_readout * L) / (best['tuned'] + per_layer_readout * L):.3f}x")


def kl(args) -> None:
    import vocablens
    from vocablens.lens.compare import compare_lenses
    from vocablens.lens.evaluate import text_bytes
    from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens
    from vocablens.lens.tuned import load_for_model
    from vocablens.models.files.loader import load_mode

    lm = vocablens.load("smollm2")
    b = lm.borders
    tuned = load_for_model(b, "smollm2")
    jac = JacobianLens.load(find_jacobian_lens("smollm2", args.lens or None), b)
    rows, info = lm.corpus_rows("pydoc-topics", "validation", args.seq_len, args.max_tokens, 0.1, 0, None, shrink=True)
    t0 = time.perf_counter()
    res = compare_lenses(b, {"logit": None, "tuned": tuned, "jacobian": jac}, rows, n_bytes=text_bytes(lm.tokenizer, rows))
    print(f"{res.tokens} held-out tokens of pydoc-topics (validation), {time.perf_counter() - t0:.0f} s, load {_load()}")
    print(f"Jacobian lens: {jac.info()}")
    print("| layer | logit KL | tuned KL | Jacobian KL |\n|---:|---:|---:|---:|")
    for i in range(res.n_layers + 1):
        print(f"| {i} | " + " | ".join(f"{res.metrics[k]['kl'][i]:.3f}" for k in res.kinds) + " |")
    print("| mean 0..L-1 | " + " | ".join(f"{res.mean_kl(k):.3f}" for k in res.kinds) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--prompts", type=int, default=1)
    f.add_argument("--seq-len", type=int, default=64)
    f.add_argument("--dim-batch", type=int, default=8)
    f.add_argument("--skip-first", type=int, default=16)
    f.add_argument("--repeats", type=int, default=2)
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--tl-python", default="/work/venv-tl/bin/python")
    a = sub.add_parser("apply")
    a.add_argument("--tokens", type=int, default=512)
    a.add_argument("--repeats", type=int, default=5)
    k = sub.add_parser("kl")
    k.add_argument("--lens", default="")
    k.add_argument("--max-tokens", type=int, default=2048)
    k.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    {"fit": fit, "apply": apply, "kl": kl}[args.what](args)


if __name__ == "__main__":
    main()
