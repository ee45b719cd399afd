"""Scaling over processes (issue 17 §4): the argmax scan and ``lens eval`` on 1, 2 and 4 ranks, and a
table on paper for a Llama-3-70B head.

Measured (each world size is one ``torchrun --nproc-per-node W`` of gloo ranks on this CPU, one
torch thread per rank: ``OMP_NUM_THREADS=1``; on a 2-core machine 4 ranks are oversubscribed, so
their wall time shows contention, not scaling; CPU seconds summed over ranks show the overhead):

  (a) :func:`vocablens.argmax.find_unargmaxable` on a random Gaussian [V, d] matrix with planted
      interior rows (``benchmarks/argmax.py``'s :func:`planted_matrix`); the all-pairs stage and the
      proofs are split over ranks (:mod:`vocablens.argmax.distributed`). Per world size: wall seconds
      of the scan (slowest rank), CPU seconds (all ranks), per-rank peak RSS, planted rows found
      exactly. Issue size: 151,936 x 1,024 (``--V 151936 --d 1024 --planted 64``); ``--quick``:
      32,768 x 256 with 16 planted rows.
  (b) ``vocablens lens eval`` on the default model (shipped tuned lens), rows split over ranks and
      float64 sums all-reduced (:mod:`vocablens.parallel.processes`): wall and CPU seconds of the whole
      command (model load included), per-rank peak RSS, and the largest difference of any metric
      from the 1-rank result.

On paper: Llama-3-70B's counts from :func:`vocablens.accounting.anatomy.anatomy` on a meta-device model built
from its config (V = 128,256, d = 8,192, 80 layers, untied), times from FLOPs and the per-core
throughput measured here (float32 GEMM, CPU seconds of one thread; the argmax all-pairs stage's own
rate from run (a)), on 1, 8 and 64 ranks.

Usage: PYTHONPATH=src python benchmarks/scale.py --quick [--ranks 1,2,4] [--skip-argmax] [--skip-eval]
       PYTHONPATH=src python benchmarks/scale.py --V 151936 --d 1024 --planted 64 --eval-tokens 1024
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _fmt_bytes(n: float) -> str:
    for unit, k in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n / 1024:.0f} KiB"


def _fmt_s(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.2f} s"


# ------------------------------------------------------------------ the workers (one per rank)
def worker(job: dict) -> None:
    """One rank: ``job`` (from the environment variable ``VOCABLENS_SCALE_JOB``) names what to run."""
    import torch.distributed as dist

    args = argparse.Namespace(**job)

    torch.set_num_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    rec = {"rank": rank}
    if args.worker == "argmax":
        sys.path.insert(0, str(HERE))
        from argmax import planted_matrix

        from vocablens.argmax import UNARGMAXABLE, find_unargmaxable

        W, planted = planted_matrix(args.V, args.d, args.planted)
        rec["rss_before"] = _rss_bytes()
        if dist.is_initialized():
            dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        res = find_unargmaxable(W, row_budget_s=None)
        rec.update(wall=time.perf_counter() - t, cpu=time.process_time() - c, timings=res.timings, cpu_s=res.cpu_s,
                   settled=res.settled, found=torch.nonzero(res.verdict == UNARGMAXABLE)[:, 0].tolist() == planted)
    else:
        import vocablens.lens.evaluate as ev
        from vocablens.cli.common import run_app

        inner = ev.evaluate

        def timed(*a, **kw):  # the scoring itself, apart from loading the model
            t, c = time.perf_counter(), time.process_time()
            res = inner(*a, **kw)
            rec.update(eval_wall=time.perf_counter() - t, eval_cpu=time.process_time() - c)
            return res

        ev.evaluate = timed
        buf = io.StringIO()
        t, c = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(buf):
            code = run_app(["lens", "eval", "--max-tokens", str(args.eval_tokens), "--seq-len", str(args.seq_len),
                            "--json"])
        rec.update(wall=time.perf_counter() - t, cpu=time.process_time() - c, code=code, out=buf.getvalue())
    rec["rss_peak"] = _rss_bytes()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(rec))
    if dist.is_initialized():
        dist.barrier()  # no rank tears down its gloo pairs while another still uses them
        dist.destroy_process_group()


def launch(world: int, job: dict) -> list[dict]:
    """One torchrun of ``world`` ranks running this file's worker on ``job``; the per-rank records.
    (The job travels in the environment: torchrun would take ``--d`` for one of its own options.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent / "src"),
               "VOCABLENS_SCALE_JOB": json.dumps({**job, "out": out})}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-port", port,
               str(Path(__file__).resolve())]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{world} ranks failed:\n{r.stderr[-3000:]}")
        return [json.loads(Path(out, f"rank{k}.json").read_text()) for k in range(world)]


# ------------------------------------------------------------------ measured
def run_argmax(args, ranks: list[int]) -> dict:
    print(f"\n(a) argmax scan, random {args.V:,} x {args.d:,} with {args.planted} planted interior rows "
          f"(1 thread per rank)")
    print(f"{'ranks':>5} {'wall s':>8} {'speed-up':>8} {'CPU s (all)':>11} {'CPU s (max rank)':>16} {'prepare CPU s':>13} "
          f"{'gemm s':>7} {'RSS/rank peak':>14} {'RSS/rank before':>15} {'planted found':>13}")
    base, rate = None, None
    for w in ranks:
        recs = launch(w, {"worker": "argmax", "V": args.V, "d": args.d, "planted": args.planted, "threads": args.threads})
        wall = max(r["wall"] for r in recs)
        cpu = sum(r["cpu"] for r in recs)
        gemm = max(r["timings"]["gemm"] for r in recs)
        base = base or wall
        if w == 1:  # CPU seconds of the all-pairs stage, from its share of the wall time (one thread)
            r0 = recs[0]
            rate = args.V ** 2 / 2 * args.d / (r0["cpu"] * r0["timings"]["gemm"] / r0["timings"]["total"])
        print(f"{w:>5} {wall:8.2f} {base / wall:8.2f} {cpu:11.2f} {max(r['cpu'] for r in recs):16.2f} "
              f"{max(r['cpu_s']['prepare'] for r in recs):13.2f} {gemm:7.2f} "
              f"{_fmt_bytes(max(r['rss_peak'] for r in recs)):>14} {_fmt_bytes(max(r['rss_before'] for r in recs)):>15} "
              f"{str(all(r['found'] for r in recs)):>13}", flush=True)
    return {"gemm_rate": rate}


def run_eval(args, ranks: list[int]) -> None:
    print(f"\n(b) vocablens lens eval, default model, {args.eval_tokens} tokens in rows of {args.seq_len} "
          f"(wall, CPU: the whole command, model load included; eval: the scoring alone)")
    print(f"{'ranks':>5} {'wall s':>8} {'CPU s (all)':>11} {'eval wall s':>11} {'speed-up':>8} {'eval CPU s (all)':>16} "
          f"{'eval CPU s (max rank)':>21} {'RSS/rank peak':>14} {'max |diff| vs 1 rank':>20}")
    ref, base = None, None
    for w in ranks:
        recs = launch(w, {"worker": "eval", "eval_tokens": args.eval_tokens, "seq_len": args.seq_len,
                          "threads": args.threads})
        if recs[0]["code"] != 0 or any(r["out"] for r in recs[1:]):
            sys.exit(f"lens eval on {w} ranks: exit {recs[0]['code']}, or a rank other than 0 printed")
        got = json.loads(recs[0]["out"])
        ref = ref or got
        diff = max(abs(a[s][k] - b[s][k]) for a, b in zip(got["layers"], ref["layers"]) for s in ("logit", "tuned")
                   for k in ("kl", "ce", "entropy", "top1_agreement"))
        ew = max(r["eval_wall"] for r in recs)
        base = base or ew
        print(f"{w:>5} {max(r['wall'] for r in recs):8.2f} {sum(r['cpu'] for r in recs):11.2f} {ew:11.2f} {base / ew:8.2f} "
              f"{sum(r['eval_cpu'] for r in recs):16.2f} {max(r['eval_cpu'] for r in recs):21.2f} "
              f"{_fmt_bytes(max(r['rss_peak'] for r in recs)):>14} {diff:20.2e}", flush=True)


def gemm_rate_per_core() -> float:
    """float32 GEMM FLOP/s of one thread, from CPU seconds ([512, 2048] x [2048, 2048], ~1 s)."""
    torch.set_num_threads(1)
    A, B = torch.randn(512, 2048), torch.randn(2048, 2048)
    A @ B
    n, c = 0, time.process_time()
    while time.process_time() - c < 1.0:
        A @ B
        n += 1
    return n * 2 * 512 * 2048 * 2048 / (time.process_time() - c)


# ------------------------------------------------------------------ on paper
def llama3_70b():
    """Anatomy of Llama-3-70B from its config (meta device: shapes only, no weights)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from vocablens.accounting.anatomy import anatomy
    from vocablens.models import Borders

    cfg = LlamaConfig(vocab_size=128_256, hidden_size=8_192, intermediate_size=28_672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False,
                      max_position_embeddings=8_192, rope_theta=500_000.0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return anatomy(Borders.from_model(model), name="Llama-3-70B (config)", context=512, source="config")


def paper_table(f32_rate: float, gemm_rate: float | None) -> None:
    a = llama3_70b()
    V, d, L = a.vocab_size, a.d_emb, a.n_layers
    head_bf16 = a.matrix_bytes["bf16"]
    gr = gemm_rate or f32_rate / 2  # multiply-adds per second
    print(f"\nOn paper: {a.name}: V = {V:,}, d = {d:,}, L = {L}, {a.params_total / 1e9:.1f} B parameters "
          f"({_fmt_bytes(a.model_bytes['bf16'])} bf16); head [V, d] = {_fmt_bytes(head_bf16)} bf16.")
    print(f"Per-core rates measured here: float32 GEMM {f32_rate / 1e9:.1f} GFLOP/s (CPU seconds, one thread); "
          f"argmax all-pairs stage {gr / 1e9:.1f} G multiply-adds/s" + ("" if gemm_rate else " (float32 rate: (a) skipped)"))
    print("One core per rank; times are FLOPs / (ranks x per-core rate), communication not counted.")
    lens_flops = 1000 * (a.flops_forward + (2 * L + 1) * a.flops_head + 2 * L * a.d_model ** 2)
    rows = [
        ("argmax prepare (centre, whiten: 4 V d^2; eigh ~9 d^3)",
         lambda w: (4 * V * d * d / w + 9 * d ** 3) / f32_rate,
         lambda w: V * d * (2 + 4 + 1), "row blocks split, sums all-reduced; eigh on every rank"),
        ("argmax gemm (all pairs: V^2 d / 2 mult-adds)", lambda w: V * V * d / 2 / (w * gr),
         lambda w: V * d * (2 + 4 + 1) + 2048 * V * 4, "query blocks split"),
        ("head split over V (score/generate), per token", lambda w: a.flops_head / (w * f32_rate),
         lambda w: head_bf16 / w, "vocab-parallel head"),
        ("lens eval per 1k tokens (context 512)", lambda w: lens_flops / (w * f32_rate),
         lambda w: a.model_bytes["bf16"] + L * (d * d + d) * 4, "rows split; model replicated"),
    ]
    head = " | ".join(f"{w} rank{'s' if w > 1 else ''}: time, memory/rank" for w in (1, 8, 64))
    print(f"\n| stage | {head} | split |")
    print("|---|---|---|---|---|")
    for name, t, m, how in rows:
        print(f"| {name} | " + " | ".join(f"{_fmt_s(t(w))}, {_fmt_bytes(m(w))}" for w in (1, 8, 64)) + f" | {how} |")
    print("argmax reflect/proof/verify: cost depends on the rows stage 1 leaves open (run (a) shows them per stage); "
          "they are dealt round-robin over ranks.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="32,768 x 256, 16 planted; lens eval on 256 tokens")
    ap.add_argument("--V", type=int, default=151_936)
    ap.add_argument("--d", type=int, default=1_024)
    ap.add_argument("--planted", type=int, default=64)
    ap.add_argument("--eval-tokens", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--skip-argmax", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    if os.environ.get("VOCABLENS_SCALE_JOB"):
        return worker(json.loads(os.environ["VOCABLENS_SCALE_JOB"]))
    args = ap.parse_args()
    if args.quick:
        args.V, args.d, args.planted, args.eval_tokens = 32_768, 256, 16, 256
    ranks = [int(x) for x in args.ranks.split(",")]
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at start; OMP_NUM_THREADS=1 per rank")
    rate = run_argmax(args, ranks)["gemm_rate"] if not args.skip_argmax else None
    if not args.skip_eval:
        run_eval(args, ranks)
    paper_table(gemm_rate_per_core(), rate)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
