"""Benchmark: linear + cross-entropy through the LM head — naive vs torch's chunked path vs vocablens.

For each configuration (N tokens, d, V, dtype) and each method, a fresh subprocess runs forward (no
grad), then forward+backward, and reports for each the wall time (best of --reps after one warm-up)
and the peak resident memory above the inputs (RSS high-water mark delta, bytes; between the two
modes freed heap is returned to the OS and the mark is reset through /proc/self/clear_refs, so the
fwd+bwd figure leaves out one-time set-up, e.g. torch's first call, already paid by the forward run).
Methods:

* naive: ``F.cross_entropy((h @ W.T).float(), t)`` — full [N, V] logits, float32 softmax;
* torch: ``F.linear_cross_entropy(h, W, t, options=torch.nn.LinearCrossEntropyOptions())``, the
  batch-chunked path of torch >= 2.13 (skipped when absent);
* vocablens: :func:`vocablens.ops.linear_cross_entropy`.

Every 5th target is ignore_index (-100); reduction="sum" so the loss can also be compared with a
float64 reference (chunked, computed after the measurements in the vocablens subprocess for bf16
configurations and under --quick).
Ratios printed: vocablens / naive and vocablens / torch for peak memory and time, fwd and fwd+bwd.

Usage: ``python benchmarks/logprobs.py [--quick] [--threads 2] [--reps 1] [--json out.json]
[--config N,d,V,dtype ...]``.
The CPU may be shared: timings are noisy; compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

FULL = [(4096, 256, 32000, "float32"), (4096, 256, 32000, "bfloat16")] + [
    (N, d, V, dt) for dt in ("float32", "bfloat16") for V in (49152, 151936) for d in (576, 1024) for N in (2048, 8192)
]
# --quick: one float32 and one bf16 configuration, small enough that the whole run (every method in
# its own subprocess) takes well under a minute; bf16 GEMMs are several times slower than float32 ones
# on CPUs without native bf16 (AVX2), so the naive and torch bf16 baselines get the smaller shape
QUICK = [(512, 256, 16000, "float32"), (256, 128, 4096, "bfloat16")]
METHODS = ("naive", "torch", "vocablens")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    """Return freed heap memory to the OS (glibc malloc_trim, so memory the first mode freed is counted
    again when the second mode touches it) and reset this process's RSS high-water mark (VmHWM,
    Linux >= 4.0), so one child can measure two modes."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 40


def child(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    N, d, V, dt = spec["N"], spec["d"], spec["V"], getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(0)
    # inputs built in blocks straight into their dtype, so no temporary raises the RSS high-water mark
    h = torch.empty(N, d, dtype=dt)
    W = torch.empty(V, d, dtype=dt)
    for a in range(0, V, 4096):
        W[a:a + 4096] = (torch.randn(min(4096, V - a), d, generator=g) * d ** -0.5).to(dt)
    for a in range(0, N, 4096):
        h[a:a + 4096] = torch.randn(min(4096, N - a), d, generator=g).to(dt)
    t = torch.randint(0, V, (N,), generator=g)
    t[::5] = -100
    method = spec["method"]
    if method == "naive":
        def fn():
            return F.cross_entropy((h @ W.T).float(), t, reduction="sum", ignore_index=-100)
    elif method == "torch":
        if not hasattr(F, "linear_cross_entropy"):
            return {"skipped": "torch has no F.linear_cross_entropy"}
        opts = torch.nn.LinearCrossEntropyOptions()

        def fn():
            return F.linear_cross_entropy(h, W, t, reduction="sum", ignore_index=-100, options=opts)
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
        from vocablens.ops import linear_cross_entropy

        def fn():
            return linear_cross_entropy(h, W, t, reduction="sum", ignore_index=-100)
    import warnings

    warnings.filterwarnings("ignore")
    out_modes = {}
    for mode in ("fwd", "fwdbwd"):  # fwd first: its peak is below fwdbwd's even where the reset is unavailable
        if mode == "fwdbwd":
            h.requires_grad_(True)
            W.requires_grad_(True)
        _reset_peak()
        base = _status_bytes("VmRSS")
        times, loss = [], None
        for _ in range(1 + spec["reps"]):
            h.grad = W.grad = None
            t0 = time.perf_counter()
            if mode == "fwd":
                with torch.no_grad():
                    out = fn()
            else:
                out = fn()
                out.backward()
            times.append(time.perf_counter() - t0)
            loss = float(out.detach().float())
            del out
        peak = _status_bytes("VmHWM")
        grads = sum(x.grad.numel() * x.grad.element_size() for x in (h, W) if x.grad is not None)
        out_modes[mode] = {"time_s": min(times[1:]) if len(times) > 1 else times[0],
                           "peak_extra_bytes": max(0, peak - base), "grad_bytes": grads,
                           "workspace_bytes": max(0, peak - base - grads), "loss": loss}
    if spec.get("ref64"):  # after the measurements, so it cannot raise their high-water marks
        tot = 0.0
        hd, Wd = h.detach().double(), W.detach().double()
        for a in range(0, N, 256):
            tot += float(F.cross_entropy(hd[a:a + 256] @ Wd.T, t[a:a + 256], reduction="sum", ignore_index=-100))
        out_modes["ref64"] = tot
    return out_modes


def run_child(spec: dict, timeout: float) -> dict:
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timeout after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"skipped": f"failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _mb(b):
    return f"{b / 2**20:8.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced grid (2 small configurations, < 60 s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="timed repetitions after one warm-up (best is kept)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    ap.add_argument("--json", default="", help="also write all measurements to this file")
    ap.add_argument("--config", action="append", default=[], metavar="N,d,V,dtype",
                    help="run only this configuration (repeatable), e.g. 2048,576,49152,bfloat16")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    grid = QUICK if a.quick else FULL
    if a.config:
        grid = []
        for c in a.config:
            N, d, V, dt = c.split(",")
            grid.append((int(N), int(d), int(V), dt))
    import torch

    print(f"torch {torch.__version__}, {a.threads} threads, {os.cpu_count()} CPUs; peak = RSS high-water mark "
          f"above the inputs (also shown without the h/W gradient outputs every method returns); "
          f"time = best of {a.reps} after a warm-up; reduction=sum, 20% ignored targets; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    rows = []
    for N, d, V, dt in grid:
        esize = 2 if dt == "bfloat16" else 4
        naive_need = N * V * (esize + 4 * 3)
        print(f"\n== N={N} d={d} V={V} {dt} ==", flush=True)
        res, ref = {}, {}
        for method in METHODS:
            spec = dict(N=N, d=d, V=V, dtype=dt, method=method, threads=a.threads, reps=a.reps,
                        ref64=method == "vocablens" and (dt != "float32" or a.quick))
            if method not in a.methods.split(","):
                r = {"skipped": "not in --methods"}
            elif method == "naive" and naive_need > 0.7 * _mem_available():
                r = {"skipped": f"needs ~{naive_need / 2**30:.1f} GiB, {_mem_available() / 2**30:.1f} GiB available"}
            else:
                r = run_child(spec, a.timeout)
            if "ref64" in r:
                ref = {"loss": r["ref64"]}
            for mode in ("fwd", "fwdbwd"):
                rm = res[(method, mode)] = r if "skipped" in r else r[mode]
                if "skipped" in rm:
                    print(f"  {method:10s} {mode:7s} skipped: {rm['skipped']}", flush=True)
                else:
                    print(f"  {method:10s} {mode:7s} {rm['time_s']:8.2f} s  peak {_mb(rm['peak_extra_bytes'])}  "
                          f"(without the {_mb(rm['grad_bytes']).strip()} of gradients: "
                          f"{_mb(rm['workspace_bytes']).strip()})  loss {rm['loss']:.6g}", flush=True)
        row = {"N": N, "d": d, "V": V, "dtype": dt,
               "results": {f"{m}/{md}": r for (m, md), r in res.items()}, "ref64_loss": ref.get("loss")}

        def ratio(m1, m2, mode, key):
            r1, r2 = res[(m1, mode)], res[(m2, mode)]
            if "skipped" in r1 or "skipped" in r2 or not r2[key]:
                return None
            return r1[key] / r2[key]

        for other in ("naive", "torch"):
            for mode in ("fwd", "fwdbwd"):
                tr = ratio("vocablens", other, mode, "time_s")
                mr = ratio("vocablens", other, mode, "peak_extra_bytes")
                wr = ratio("vocablens", other, mode, "workspace_bytes")
                row[f"time_ratio_vs_{other}_{mode}"] = tr
                row[f"mem_ratio_vs_{other}_{mode}"] = mr
                row[f"workspace_ratio_vs_{other}_{mode}"] = wr
                print(f"  vocablens/{other:6s} {mode:7s}: time {'n/a' if tr is None else f'{tr:.3f}x'}, "
                      f"peak memory {'n/a' if mr is None else f'{100 * mr:.1f}%'}, "
                      f"without gradients {'n/a' if wr is None else f'{100 * wr:.1f}%'}")
        if ref.get("loss") is not None:
            for m in METHODS:
                r = res[(m, "fwdbwd")]
                if "loss" in r:
                    rel = abs(r["loss"] - ref["loss"]) / abs(ref["loss"])
                    row[f"loss_rel_err_{m}"] = rel
                    print(f"  summed-loss relative error vs float64, {m:10s}: {rel:.2e}")
        rows.append(row)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
