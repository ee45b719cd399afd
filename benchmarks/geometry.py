"""Benchmark: chunked cosine neighbours vs normalising the whole matrix in float32.

For a bf16 matrix of Qwen3-0.6B's size ([151,936, 1,024], random values), ``cosine_neighbors`` reads
the matrix in chunks of 16,384 rows, so its extra memory is one float32 chunk instead of a float32
copy of the whole matrix (622 MB). Each variant runs in its own process; the script prints the peak
resident memory each one added over the matrix itself, and their wall times, measured in this run.

    python benchmarks/geometry.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

V, D, K = 151_936, 1024, 10


def _one(kind: str) -> None:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    W = torch.empty(V, D, dtype=torch.bfloat16)
    for s in range(0, V, 4096):  # filled in pieces so no float32 copy raises the baseline peak
        W[s:s + 4096] = torch.randn(min(4096, V - s), D, generator=g)
    q = W[1234].float()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if kind == "chunked":
        from vocablens.geometry import cosine_neighbors

        ids, _ = cosine_neighbors(W, q, K + 1)
    else:
        Wn = torch.nn.functional.normalize(W.float(), dim=1)
        ids = (Wn @ (q / q.norm())).topk(K + 1).indices
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"kind": kind, "seconds": dt, "extra_kib": peak - base, "top": ids[:3].tolist()}))


def main() -> None:
    res = {}
    for kind in ("chunked", "naive"):
        out = subprocess.run([sys.executable, __file__, kind], capture_output=True, text=True, check=True)
        res[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    c, n = res["chunked"], res["naive"]
    assert c["top"] == n["top"], "the two methods disagree"
    print(f"matrix [{V:,}, {D:,}] bf16 ({V * D * 2 / 1e6:.0f} MB); same top-3 ids: {c['top']}")
    print(f"extra peak memory: chunked {c['extra_kib'] / 1024:.0f} MiB, naive {n['extra_kib'] / 1024:.0f} MiB, "
          f"ratio naive/chunked = {n['extra_kib'] / max(c['extra_kib'], 1):.1f}x")
    print(f"time: chunked {c['seconds']:.2f} s, naive {n['seconds']:.2f} s, ratio chunked/naive = "
          f"{c['seconds'] / n['seconds']:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _one(sys.argv[1])
    else:
        main()
