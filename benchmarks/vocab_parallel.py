"""Benchmark: vocabulary-parallel LM head + cross-entropy on R gloo ranks vs one process.

For each world size R, R processes on this machine each hold a [V/R, d] shard of the head, compute
their [N, V/R] slice of the logits and the vocab-parallel cross-entropy forward+backward (without
gathering the logits). Reported per rank: the weight-shard and local-logits bytes (exact, from the
tensors), the peak RSS above the inputs, and the wall time; ratios are against R=1.
Target: per-rank weight and logits memory <= 1/R + 5% of the single process's.

Usage: ``python benchmarks/vocab_parallel.py [--quick] [--threads 1]``. With R processes on 2 CPU
cores, the time ratio measures communication and oversubscription, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(rank: int, world: int, port: int, cfg: dict, outdir: str) -> None:
    import torch
    import torch.distributed as dist

    from vocablens.ops import VocabParallelLMHead, shard_range

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    N, d, V = cfg["N"], cfg["d"], cfg["V"]
    g = torch.Generator().manual_seed(0)
    start, stop = shard_range(V, world, rank)
    head = VocabParallelLMHead(d, V)
    with torch.no_grad():  # each rank draws only its rows, from a per-row-block seed
        for blk in range(start // 1024 * 1024, stop, 1024):
            rows = torch.randn(1024, d, generator=torch.Generator().manual_seed(10**6 + blk)) * d ** -0.5
            a, b = max(start, blk), min(stop, blk + 1024)
            head.weight[a - start:b - start] = rows[a - blk:b - blk]
    h = torch.randn(N, d, generator=g).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    base = _rss()
    times = []
    for _ in range(1 + cfg["reps"]):
        dist.barrier()
        t0 = time.perf_counter()
        z = head(h)
        loss = head.cross_entropy(h, t)
        loss.backward()
        dist.barrier()
        times.append(time.perf_counter() - t0)
        logits_bytes = z.numel() * z.element_size()
        del z
        head.zero_grad()
        h.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    res = {"rank": rank, "rows": stop - start, "weight_bytes": head.weight.numel() * head.weight.element_size(),
           "logits_bytes": logits_bytes, "peak_extra_bytes": max(0, peak),
           "time_s": min(times[1:]) if len(times) > 1 else times[0], "loss": float(loss.detach())}
    with open(os.path.join(outdir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()  # no rank tears down its gloo pairs while another still uses them
    dist.destroy_process_group()


def run(world: int, cfg: dict) -> list[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as td:
        mp.start_processes(worker, args=(world, port, cfg, td), nprocs=world, join=True, start_method="spawn")
        out = []
        for r in range(world):
            with open(os.path.join(td, f"r{r}.json")) as f:
                out.append(json.load(f))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller N and worlds 1, 2, 3")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    cfg = dict(N=512 if a.quick else 2048, d=576, V=49152, threads=a.threads, reps=a.reps)
    worlds = (1, 2, 3) if a.quick else (1, 2, 3, 4)
    print(f"vocab-parallel head + cross-entropy fwd+bwd, N={cfg['N']} d={cfg['d']} V={cfg['V']} float32, gloo, "
          f"{a.threads} thread(s) per rank")
    base = None
    for R in worlds:
        res = run(R, cfg)
        w = max(r["weight_bytes"] for r in res)
        lg = max(r["logits_bytes"] for r in res)
        pk = max(r["peak_extra_bytes"] for r in res)
        tm = max(r["time_s"] for r in res)
        if base is None:
            base = (w, lg, pk, tm, res[0]["loss"])
        print(f"R={R}: rows/rank {[r['rows'] for r in res]}; per-rank weight {w / 2**20:.1f} MB "
              f"({w / base[0]:.4f} of R=1, target <= {1 / R + 0.05:.4f}), logits {lg / 2**20:.1f} MB "
              f"({lg / base[1]:.4f}), peak RSS above inputs {pk / 2**20:.0f} MB ({pk / max(1, base[2]):.3f}), "
              f"time {tm:.2f} s ({tm / base[3]:.2f}x), loss {res[0]['loss']:.6f} "
              f"(|Δ| vs R=1 {abs(res[0]['loss'] - base[4]):.2e})", flush=True)


if __name__ == "__main__":
    main()
