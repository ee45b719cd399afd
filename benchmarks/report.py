"""Benchmark: the whole ``vocablens report`` on a 0.5B model with a 151,936-token vocabulary.

Target (issue 15): <= 3 minutes on 2 cores, every section within its stated budget.

No such model ships with a package and nothing is downloaded here, so the script builds one with
the shape of Qwen2.5-0.5B (qwen2, V = 151,936, d = 896, 24 layers, 14 heads / 2 kv heads, d_ff 4,864,
tied, 494M parameters) and random weights, stored as float32 safetensors (what vocablens caches a
dequantized GGUF file as), and a byte-level BPE tokenizer of 151,643 tokens + 22 specials (SmolLM2's
tokenizer extended with merges of its own tokens; rows beyond it are padding as in Qwen's). The
report's work depends on these shapes, not on the weights' values — except the argmax section, whose
exact work on a trained head differs: there the time budget is what bounds it.

Prints per section its budget, CPU and wall seconds and whether it was cut short (each section run
alone, so on a busy machine one overrun does not skip the rest; CPU time is the contention-free
figure on a shared machine), or with ``--command`` the whole command's wall and CPU seconds.

Measured on the shared 2-core machine (load average 10-13; in-process, budget 150 s), CPU seconds
(wall in brackets): load 7.0 (37), neighbours 17.1 (87, budget 3), PCA 0.3, logit lens 4.8 (24),
argmax 14.5 (75.6 for a 67.5 s budget: cut in its preparation stage at that load, every token
undecided, none guessed), value vectors 16.0 (62, budget 12), explain 6.8 (25), settle 50.7 (108,
budget 34; 128 of 256 tokens), page 5.2 (11): 123 CPU seconds in all for two threads. On 2 free
cores: the argmax section's 67.5 s of wall clock plus 108 CPU-s of the rest (54-108 s wall,
depending on how well two threads overlap): 2.0-2.9 minutes, within the 3-minute target. The
argmax section is bounded by wall time (its budget is checked per block in every stage); the
sections over their share in CPU seconds are neighbours, value vectors and settle.

    PYTHONPATH=src python benchmarks/report.py [--dir /tmp/vocablens-qwen05-shape] [--budget 150] [--command]
    PYTHONPATH=src python benchmarks/report.py --model smollm2 --command    # the README's figure

``--model SPEC`` times that model instead of building the 0.5B shape (``smollm2``: the default model,
whose float32 copy is read from the cache after its first load; see ``benchmarks/load.py``).
``VOCABLENS_ARGMAX_CACHE=off`` makes the argmax section scan even where a stored scan exists. Both
modes print the argmax section's budget share: in a real run it gets what the sections before it
left, at least 10% of ``--budget`` (``vocablens.report.runner.argmax_share``); the per-section mode gives it
that same share, computed from the wall seconds the sections before it took here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

V, D, LAYERS, HEADS, KV_HEADS, FF = 151_936, 896, 24, 14, 2, 4864
N_TOKENS, N_SPECIAL = 151_643, 22


def build_tokenizer(out: Path) -> None:
    """SmolLM2's byte-level BPE grown to N_TOKENS by merging pairs of its own tokens (lowest rank)."""
    import random

    from tokenizers import Tokenizer

    import vocablens

    tok = vocablens.load("smollm2").tokenizer
    j = json.loads(tok.backend_tokenizer.to_str())
    vocab: dict[str, int] = j["model"]["vocab"]
    merges = j["model"]["merges"]
    as_pairs = bool(merges) and isinstance(merges[0], list)
    words = [t for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 3]
    tails = [t for t in vocab if t.isalpha() and 2 <= len(t) <= 5]
    rng = random.Random(0)
    next_id = max(vocab.values()) + 1  # SmolLM2's own special tokens keep their ids
    while next_id < N_TOKENS:
        a, b = rng.choice(words), rng.choice(tails)
        if a + b in vocab:
            continue
        vocab[a + b] = next_id
        next_id += 1
        merges.append([a, b] if as_pairs else f"{a} {b}")
    for k in range(N_SPECIAL):
        j["added_tokens"].append({"id": N_TOKENS + k, "content": f"<|extra_{k}|>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    out.mkdir(parents=True, exist_ok=True)
    Tokenizer.from_str(json.dumps(j)).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768}))


def build_model(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=True,
                      max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                      bos_token_id=None, eos_token_id=N_TOKENS)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)


def measure(spec: str, budget: float, out: str) -> None:
    """Each section alone (so an overrun of one never skips the next), its planned budget, CPU and
    wall seconds; then the page. CPU seconds count both torch threads."""
    import torch

    from vocablens.models import load
    from vocablens.render.report import cut_short_html, render_report, report_sections, write_atomic
    from vocablens.report.runner import ARGMAX_MIN_SHARE, ORDER, ReportRun, argmax_share, run_report

    total_cpu = total_wall = 0.0

    def row(name, c0, w0, budget_s=None, note=""):
        nonlocal total_cpu, total_wall
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        total_cpu, total_wall = total_cpu + cpu, total_wall + wall
        b = f"budget {budget_s:5.1f} s" if budget_s is not None else " " * 14
        print(f"  {name:<14} cpu {cpu:6.1f} s  wall {wall:6.1f} s  {b}  {note[:110]}", flush=True)

    c0, w0 = time.process_time(), time.perf_counter()
    lm = load(spec)
    row("load", c0, w0)
    runs = []
    before_argmax = 0.0  # wall seconds of the sections that run before the argmax scan (all but it)
    for key in ORDER:
        c0, w0 = time.process_time(), time.perf_counter()
        if key == "argmax":  # alone, it would get the whole budget: give it the share a real run gives
            share = argmax_share(budget, before_argmax)     # (the under-trained share not kept aside here)
            print(f"  argmax budget share: {share:.1f} s of {budget:.0f} s ({share / budget:.0%}; what the "
                  f"sections before it left, at least {ARGMAX_MIN_SHARE:.0%})", flush=True)
            r = run_report(lm, model=spec, budget_s=share, only=(key,))
        else:
            r = run_report(lm, model=spec, budget_s=budget, only=(key,))
            before_argmax += time.perf_counter() - w0
        runs.append(r.sections[0])
        row(key, c0, w0, r.sections[0].plan.budget_s, r.sections[0].cut_short or "")
    c0, w0 = time.process_time(), time.perf_counter()
    run = ReportRun(prompt=r.prompt, input_ids=r.input_ids, budget_s=budget, seconds=total_wall, sections=runs)
    write_atomic(out, render_report(f"vocablens report — {lm.provenance.name}", [lm.provenance.describe()],
                                    report_sections(run, lm, spec), banner=cut_short_html(run)))
    row("page", c0, w0)
    print(f"total: CPU {total_cpu:.0f} s, wall {total_wall:.0f} s, torch threads {torch.get_num_threads()} "
          "(target: <= 180 s wall on 2 free cores)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/vocablens-qwen05-shape")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--out", default="/tmp/vocablens-qwen05-report.html")
    ap.add_argument("--model", default=None, help="time this model (e.g. smollm2) instead of the built 0.5B shape")
    ap.add_argument("--command", action="store_true",
                    help="time the `vocablens report` command as a whole instead of each section")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    d = Path(args.dir)
    spec = args.model or str(d)
    if args.model is None and not (d / "model.safetensors").is_file() and not any(d.glob("model-*.safetensors")):
        t0 = time.perf_counter()
        build_tokenizer(d)
        build_model(d)
        print(f"built {d} in {time.perf_counter() - t0:.0f} s")
    if not args.command:
        measure(spec, args.budget, args.out)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    cmd = [sys.executable, "-m", "vocablens", "report", "--model", spec, "--out", args.out,
           "--budget", str(args.budget), "--json"]
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(p.stderr[-3000:])
    rep = json.loads(p.stdout)
    print(f"model: {rep['borders']['vocab_size']:,} x {rep['borders']['d_model']}, {rep['borders']['n_layers']} layers")
    for k, v in rep["timings_s"].items():
        print(f"  {k:<48} {v:8.1f} s")
    for k, why in rep["cut_short"].items():
        print(f"  cut short: {k}: {why}")
    # the argmax scan runs after the cheap sections and gets what they left less the under-trained
    # section's planned share, at least 10%; that section runs last with its share or what the scan left
    from vocablens.report.runner import AFTER_SCAN, ARGMAX_MIN_SHARE, after_scan_share, argmax_share, plan_report

    planned_after = next(p.budget_s for p in plan_report(spec, args.budget) if p.key == AFTER_SCAN)
    tail = ("argmax", "under-trained")
    before = sum(v for k, v in rep["timings_s"].items() if k not in ("total", "load") and not any(t in k for t in tail))
    share = argmax_share(args.budget, before, planned_after)
    scan = next((v for k, v in rep["timings_s"].items() if "argmax" in k), 0.0)
    after = after_scan_share(args.budget, before + scan, planned_after)
    print(f"  argmax budget share: {share:.1f} s of {args.budget:.0f} s ({share / args.budget:.0%}; the cheap "
          f"sections took {before:.0f} s, the scan gets what they leave less the under-trained section's "
          f"{planned_after:.0f} s, at least {ARGMAX_MIN_SHARE:.0%}); it took {scan:.1f} s")
    print(f"  under-trained share: {after:.1f} s (its {planned_after:.0f} s, or what the scan left when more)")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"whole command: wall {wall:.0f} s, CPU {cpu:.0f} s (target: <= 180 s wall on 2 cores)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
