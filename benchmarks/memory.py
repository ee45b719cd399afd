"""Peak resident memory of vocablens commands, each in a fresh process, next to the bytes they need.

For each command: the peak RSS of the process (``ru_maxrss`` of a child run alone), the bytes of the
tensors the analysis reads (from the model's config: embedding, head, final norm; or every
parameter for a forward pass), and the target ``1.3 x needed + bare``, where *bare* is the peak of an
interpreter that only imports torch and transformers (measured in the same run).

Run: ``python benchmarks/memory.py [--model smollm2] [--commands neighbors,argmax,bottleneck,score]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

COMMANDS = {
    "neighbors": (["neighbors", " king", "-k", "5", "--json"], "borders"),
    "bottleneck": (["bottleneck", "--json"], "borders"),
    "argmax": (["argmax", "--json", "--no-norm"], "borders"),
    "score": (["score", "The capital of France is Paris.", "--json"], "all"),
    "lens": (["lens", "The capital of France is", "--json"], "all"),
}

_PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
         "stderr=subprocess.PIPE); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_kib(argv: list[str]) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, check=True)
    rc, kib = out.stdout.split()
    return int(rc), int(kib)


def needed_bytes(model: str) -> dict[str, int]:
    """Bytes of the borders (embedding + untied head + bias + final norm) and of all parameters,
    from the checkpoint read lazily (nothing is loaded here but those tensors)."""
    code = (
        "import json, sys; sys.path.insert(0, 'src'); from vocablens.models.lazy import load_borders_only; "
        f"lm = load_borders_only({model!r}); b = lm.borders; "
        "ts = [b.W_E] + ([] if b.tied else [b.W_U]) + ([b.b_U] if b.b_U is not None else []) "
        "+ list(b.final_norm.parameters() if b.final_norm is not None else []); "
        "n = sum(t.numel() * t.element_size() for t in ts); "
        "tot = sum(p.numel() * p.element_size() for p in b.model.parameters()); "
        "print(json.dumps({'borders': n, 'all': tot}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--commands", default="neighbors,bottleneck,score")
    a = ap.parse_args()
    _, bare = peak_kib([sys.executable, "-c", "import torch, transformers"])
    need = needed_bytes(a.model)
    print(f"model {a.model}: borders {need['borders'] / 2**20:.1f} MiB, all parameters {need['all'] / 2**20:.1f} MiB; "
          f"bare interpreter (torch + transformers imported) {bare / 1024:.1f} MiB")
    print(f"{'command':<12}{'needs':>11}{'peak RSS':>11}{'target':>11}{'met':>6}")
    for name in a.commands.split(","):
        args, what = COMMANDS[name]
        rc, kib = peak_kib([sys.executable, "-m", "vocablens", *args, "--model", a.model])
        target = 1.3 * need[what] / 1024 + bare
        ok = "yes" if kib <= target else "no"
        print(f"{name:<12}{need[what] / 2**20:>9.1f}Mi{kib / 1024:>9.1f}Mi{target / 1024:>9.1f}Mi{ok:>6}"
              + ("" if rc == 0 else f"  (exit {rc})"))


if __name__ == "__main__":
    main()
