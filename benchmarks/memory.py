"""Peak resident memory of vocablens commands, each in a fresh process, next to the bytes they need.

For each command: the peak RSS of the process (``ru_maxrss`` of a child run alone), the bytes of the
tensors the analysis reads, and the target of issue 17, ``1.3 x needed + bare``. *bare* is the peak of
an interpreter with torch and transformers imported (``transformers.modeling_utils``: ``import
transformers`` alone is lazy and loads nothing), measured in the same run. What each command needs:

- ``matrices``: the embedding and an untied head (``neighbors``);
- ``borders``: + head bias and final norm (``argmax``; ``argmax-norm`` adds the final-norm bounds);
- ``block``: + the weights of one block (``project --block N``, head circuits);
- ``values``: borders + every block's FFN value vectors (``project --token``);
- ``all``: every parameter (a forward pass: ``score``, ``lens``, ``bottleneck``).

Run: ``python benchmarks/memory.py [--model smollm2] [--commands neighbors,project-block,score]``;
``--max-memory 200MB`` adds the streamed forward (``score``/``lens`` with ``--max-memory``).
Sizes print in MiB (2^20 bytes); 550 MB (10^6) = 524.5 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BLOCK = 22
SRC = Path(__file__).resolve().parent.parent / "src"
COMMANDS = {
    "neighbors": (["neighbors", " king", "-k", "5", "--json"], "matrices"),
    "argmax": (["argmax", "--json", "--no-norm"], "borders"),
    "argmax-norm": (["argmax", "--json"], "borders"),
    "project-block": (["project", "--block", str(BLOCK), "--neuron", "935", "--json"], "block"),
    "project-token": (["project", "--token", " three", "-k", "4", "--json"], "values"),
    "bottleneck": (["bottleneck", "--json"], "all"),
    "score": (["score", "The capital of France is Paris.", "--json"], "all"),
    "lens": (["lens", "The capital of France is", "--json"], "all"),
}
STREAMED = ("score", "lens")

_PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
         "stderr=subprocess.PIPE); u = resource.getrusage(resource.RUSAGE_CHILDREN); "
         "print(r.returncode, u.ru_maxrss, u.ru_utime + u.ru_stime)")


def peak_kib(argv: list[str]) -> tuple[int, int, float, float]:
    """(exit code, peak RSS in KiB, wall s, CPU s) of ``argv`` run alone in a child process."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, check=True)
    rc, kib, cpu = out.stdout.split()
    return int(rc), int(kib), time.perf_counter() - t0, float(cpu)


def needed_bytes(model: str) -> dict[str, int]:
    """Bytes of the tensors each kind of command reads, from the checkpoint read lazily (only the
    borders and block ``BLOCK`` are loaded here; the other blocks are counted at the checkpoint dtype)."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(SRC)!r}); "
        "from vocablens.models.files.partial import load_borders_only; "
        f"lm = load_borders_only({model!r}, blocks=[{BLOCK}]); b = lm.borders; "
        "nb = lambda ts: sum(t.numel() * t.element_size() for t in ts); "
        "mat = nb([b.W_E] + ([] if b.tied else [b.unembedding.weight])); "
        "bor = mat + nb(([b.unembedding.bias] if b.unembedding.bias is not None else []) "
        "+ list(b.final_norm.parameters() if b.final_norm is not None else [])); "
        f"blk = bor + nb(b.blocks[{BLOCK}].parameters()); es = b.W_E.element_size(); "
        "tot = sum(p.numel() * (es if p.is_meta else p.element_size()) for p in b.model.parameters()); "
        "from vocablens.models.blocks import block_views; "
        "val = bor + sum(p.numel() * es for v in block_views(b) for p in v.mlp_out.parameters()); "
        "print(json.dumps({'matrices': mat, 'borders': bor, 'block': blk, 'values': val, 'all': tot}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def stream_timing(model: str, max_memory: str, tokens: int = 128, reps: int = 3) -> None:
    """CPU and wall seconds of one forward over ``tokens`` tokens, normal load vs blocks streamed under
    ``max_memory`` (one process, alternating, median of ``reps``), and the load times."""
    code = f"""
import sys, time, statistics, torch; sys.path.insert(0, {str(SRC)!r})
from vocablens.models import load
from vocablens.models.files.streaming import load_streaming
def t(f):
    c, w = time.process_time(), time.perf_counter(); r = f(); return r, time.process_time() - c, time.perf_counter() - w
full, cl, wl = t(lambda: load({model!r}))
st, cs, ws = t(lambda: load_streaming({model!r}, {max_memory!r}))
print(f"load: normal {{wl:.1f}} s wall / {{cl:.1f}} s CPU; streamed {{ws:.1f}} s wall / {{cs:.1f}} s CPU; "
      f"{{len(st.model.vocablens_streamers)}} of {{st.borders.n_layers}} blocks streamed")
ids = torch.randint(0, 30000, ({tokens},))
res = {{"normal": [], "streamed": []}}
for _ in range({reps}):
    for name, lm in (("normal", full), ("streamed", st)):
        r, c, w = t(lambda: lm.borders.residual_stream(ids))
        res[name].append((c, w))
    assert torch.equal(full.borders.residual_stream(ids)[1], st.borders.residual_stream(ids)[1])
m = {{k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in res.items()}}
print(f"forward over {tokens} tokens (median of {reps}): normal {{m['normal'][1]:.3f}} s wall / {{m['normal'][0]:.3f}} s CPU, "
      f"streamed {{m['streamed'][1]:.3f}} s wall / {{m['streamed'][0]:.3f}} s CPU: x{{m['streamed'][0] / m['normal'][0]:.2f}} CPU, "
      f"x{{m['streamed'][1] / m['normal'][1]:.2f}} wall; logits identical")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    print(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--max-memory", default="", help="also run score/lens streamed under this cap (e.g. 200MB)")
    ap.add_argument("--src", default=str(SRC), help="vocablens sources the commands run from (e.g. an older "
                    "checkout's src, for a before/after table); the needed bytes always come from this one")
    a = ap.parse_args()
    env_cmd = [sys.executable, "-m", "vocablens"]
    os.environ["PYTHONPATH"] = os.pathsep.join([a.src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    bare = peak_kib([sys.executable, "-c", "import torch, transformers.modeling_utils"])[1]
    lazy_bare = peak_kib([sys.executable, "-c", "import torch, transformers"])[1]
    need = needed_bytes(a.model)
    print(f"model {a.model}: matrices {need['matrices'] / 2**20:.1f} MiB, borders {need['borders'] / 2**20:.1f}, "
          f"borders + block {BLOCK} {need['block'] / 2**20:.1f}, borders + value vectors {need['values'] / 2**20:.1f}, all parameters {need['all'] / 2**20:.1f} MiB")
    print(f"bare interpreter: torch + transformers.modeling_utils {bare / 1024:.1f} MiB "
          f"(torch + lazy `import transformers`: {lazy_bare / 1024:.1f} MiB)")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'command':<22}{'reads':>9}{'needs':>11}{'peak RSS':>11}{'target':>11}{'met':>5}{'wall s':>8}{'CPU s':>7}")
    runs = [(n, COMMANDS[n][0], COMMANDS[n][1]) for n in a.commands.split(",")]
    if a.max_memory:
        runs += [(f"{n} --max-memory", COMMANDS[n][0] + ["--max-memory", a.max_memory], "all")
                 for n in STREAMED if n in a.commands.split(",")]
    if a.max_memory:
        stream_timing(a.model, a.max_memory)
    for name, args, what in runs:
        rc, kib, wall, cpu = peak_kib([*env_cmd, *args, "--model", a.model])
        target = 1.3 * need[what] / 1024 + bare
        ok = "yes" if kib <= target else "no"
        print(f"{name:<22}{what:>9}{need[what] / 2**20:>9.1f}Mi{kib / 1024:>9.1f}Mi{target / 1024:>9.1f}Mi{ok:>5}"
              f"{wall:>8.1f}{cpu:>7.1f}" + ("" if rc == 0 else f"  (exit {rc})"), flush=True)


if __name__ == "__main__":
    main()
