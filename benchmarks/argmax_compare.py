"""Are two versions of the exact argmax scan's verdicts and certificates identical? (issue 38)

A refactor of :mod:`vocablens.argmax` must leave every verdict and certificate as it was. This script
runs the scan of whichever ``vocablens`` is on ``sys.path`` (set ``PYTHONPATH`` to a checkout's
``src``) and stores what it returns; ``compare`` then checks two stored runs field by field, exactly
(bit-equal tensors, equal dicts; NaN equals NaN).

- ``record --head OUT``: the default model's head (SmolLM2-135M, 49,152 x 576), as ``benchmarks/argmax.py`` scans it.
- ``record --calls CALLS OUT``: the inputs of captured calls (a pickle of dicts ``W``, ``bias``, ``kw``,
  e.g. every deterministic call the argmax unit tests make, captured by a pytest plugin that wraps
  ``find_unargmaxable``), replayed through this version.
- ``compare A B``: exit status 1 and the first differences when they differ.

Timings, CPU seconds and progress are not compared (they are measurements, not results). The scans
run on ``--threads`` torch threads, 1 by default: with several, the worker threads take blocks from a
shared counter, and the order in which rows are settled can change which (valid) certificate a row
gets, and its margin, though never its verdict; one thread makes every run of a version repeat itself.
"""

from __future__ import annotations

import argparse
import pickle
import sys

import torch

FIELDS_T = ("verdict", "stage", "margin", "residual", "group", "in_play", "center", "whiten", "scale", "quant", "row")
FIELDS_V = ("quant_scale", "bias_used", "rank", "n_unique", "tol", "verified_f64", "interrupted", "cut_short")
FIELDS_D = ("group_can_tie", "x_extra", "combos", "combo_mean", "combo_tilt", "reasons", "settled")


def snapshot(res) -> dict:
    """The result's fields that are results (no timings), detached copies."""
    d = {k: getattr(res, k).clone() for k in FIELDS_T}
    d.update({k: getattr(res, k) for k in FIELDS_V})
    d.update({k: dict(getattr(res, k)) for k in FIELDS_D})
    return d


def same(a, b) -> bool:
    """Exact equality of nested results (tensors bit for bit, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b) or (a.is_floating_point()
                                                                     and torch.equal(a.nan_to_num(7.25), b.nan_to_num(7.25))
                                                                     and torch.equal(a.isnan(), b.isnan()))))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def differences(a: dict, b: dict) -> list[str]:
    return [k for k in a if not same(a[k], b.get(k))]


def record_calls(path: str) -> list[dict]:
    from vocablens.argmax import find_unargmaxable
    import inspect

    known = set(inspect.signature(find_unargmaxable).parameters)
    with open(path, "rb") as f:
        calls = pickle.load(f)
    out = []
    for c in calls:
        kw = {k: v for k, v in c["kw"].items() if k in known}      # options a version removed (screen)
        out.append(snapshot(find_unargmaxable(c["W"], c["bias"], **kw)))
    return out


def record_head() -> list[dict]:
    import vocablens
    from vocablens.argmax import find_unargmaxable

    lm = vocablens.load("smollm2")
    W = lm.borders.unembedding.weight.detach().clone()      # as benchmarks/argmax.py scans it
    del lm
    return [snapshot(find_unargmaxable(W))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--calls")
    r.add_argument("--head", action="store_true")
    r.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    r.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.cmd == "record":
        torch.set_num_threads(args.threads)
        got = record_head() if args.head else record_calls(args.calls)
        with open(args.out, "wb") as f:
            pickle.dump(got, f)
        print(f"{len(got)} scans recorded", file=sys.stderr)
        return 0
    with open(args.a, "rb") as f:
        A = pickle.load(f)
    with open(args.b, "rb") as f:
        B = pickle.load(f)
    A = [x["res"] if "res" in x else x for x in A]
    B = [x["res"] if "res" in x else x for x in B]
    if len(A) != len(B):
        print(f"different numbers of scans: {len(A)} and {len(B)}")
        return 1
    bad = [(i, differences(x, y)) for i, (x, y) in enumerate(zip(A, B)) if differences(x, y)]
    for i, fields in bad[:20]:
        print(f"scan {i}: differs in {', '.join(fields)}")
    print(f"{len(A) - len(bad)} of {len(A)} scans identical (verdicts, certificates, margins, whitening, grid)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
