"""Benchmark: loading the default model, the first time (GGUF dequantized, float32 copy cached) and again.

    PYTHONPATH=src python benchmarks/load.py [--model smollm2] [--repeat 1]

Each load runs in a fresh Python process (``python -c "import vocablens; vocablens.load(...)"``), so
the import of torch and transformers is counted as a user's first command counts it. The first load uses
an empty temporary ``VOCABLENS_CACHE`` directory (removed afterwards): it reads the ``.gguf`` file,
dequantizes every tensor and writes the float32 safetensors copy; the later loads read that copy.
Prints the wall seconds of each, the import alone, and the load average before and after (the machine
may be shared: the figures are only as good as the load beside them).

Measured on 2 idle cores (load average 0.9): first load 25.6 s, cached load 6.6 s, the imports 2.8 s.
On the shared 2-core machine at load 8-9: first load 117.8 s and 130.4 s, cached loads 34.0 and 26.4 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def timed(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeat", type=int, default=1, help="cached loads after the first")
    a = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs", flush=True)
    load = f"import vocablens; vocablens.load({a.model!r})"
    with tempfile.TemporaryDirectory(prefix="vocablens-cache-") as cache:
        env = {**os.environ, "VOCABLENS_CACHE": cache, "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        imp = timed("import vocablens.models.files.loader, transformers", env)
        print(f"import (torch, transformers, vocablens): {imp:.1f} s", flush=True)
        first = timed(load, env)
        print(f"first load ({a.model}, empty cache: dequantize + write the float32 copy): {first:.1f} s", flush=True)
        for i in range(a.repeat):
            print(f"cached load {i + 1}: {timed(load, env):.1f} s", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
