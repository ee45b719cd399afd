"""Worker for test_tensor_parallel.py: CLI commands and the Python API with ``--tp`` / ``tp=True``
in one torchrun process group (gloo).

Run as ``python -m torch.distributed.run --nproc-per-node 2 tests/tp_worker.py JOBS.json OUTDIR``.
JOBS.json = ``{"cli": [argv, ...], "models": {name: {"dir": D, "lens": L}}, "prompt": ids}``.
Each rank runs every CLI argv through ``run_app`` (stdout captured), then loads every model with
``vocablens.load(D, tp=True)`` and reads the lens, score, generation and lens evaluation (:func:`reads`), and calls one workflow
that does not run split (``argmax``: refused); it writes ``OUTDIR/rank<r>.json`` = ``{"cli": [[code, stdout], ...], "models": {name: {...}}}``,
a model's entry being its results' JSON and what the rank holds, or ``{"error": line}``.
"""

import contextlib
import io
import json
import sys

import torch
import torch.distributed as dist

import vocablens
from vocablens.cli import run_app
from vocablens.errors import VocabLensError

def _held(m) -> dict:
    """Elements of the blocks' parameters this rank holds and their whole count, all and outside the
    experts of a mixture (which a plan may leave whole on every rank), and its rows of W_U."""
    from vocablens.models.tensor_parallel import local

    n = {"local": 0, "whole": 0, "dense_local": 0, "dense_whole": 0,
         "blocks_split": sum(any(local(p).numel() < p.numel() for p in b.parameters()) for b in m.borders.blocks),
         "blocks": len(m.borders.blocks)}
    for name, p in m.borders.blocks.named_parameters():
        n["local"] += local(p).numel()
        n["whole"] += p.numel()
        if "expert" not in name:
            n["dense_local"] += local(p).numel()
            n["dense_whole"] += p.numel()
    return {**n, "W_U_rows": int(local(m.borders.unembedding.weight).shape[0])}


def reads(m, spec: dict, prompt: list[int]) -> dict:
    """The lens (a batch of 2 prompts, every position), score, greedy generation and lens evaluation of
    one loaded model, through ids (a tiny family's own tokenizer class may not read the test's
    vocabulary): JSON-ready. Under tp=True the head is split (VocabParallelModel follows the plan's)."""
    from vocablens.generate import generate
    from vocablens.lens.evaluate import evaluate
    from vocablens.lens.tuned import TunedLens
    from vocablens.models.tensor_parallel import is_tensor_parallel
    from vocablens.parallel.processes import VocabParallelModel

    ids = torch.tensor(prompt)
    head = VocabParallelModel(m.borders) if is_tensor_parallel(m.borders) else None
    rows = torch.tensor(prompt * 4).reshape(-1, 10)[:, :8] % V_TINY

    def gen():
        res = generate(m.borders, ids[:4], max_new_tokens=5, top_n=2, head=head)
        return [[t.id, t.logprob, [list(x) for x in t.top]] for t in res.tokens]

    return {"lens": _tried(lambda: m.lens([ids, ids[:5]], kind="logit", k=3, positions="all").to_json()),
            "score": _tried(lambda: m.score(ids, top_k=3).to_json()), "generate": _tried(gen),
            "eval": _tried(lambda: evaluate(m.borders, TunedLens.load(spec["lens"], m.borders), rows,
                                            n_bytes=100).to_dict())}


def _tried(read):
    """``read()``, or ``{"failed": the error's first line}`` (the same read may fail in one process too:
    a family's own limit, e.g. a cache of its own that generation cannot use)."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001  (compared with the one-process run's failure)
        return {"failed": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}


#: the tiny models' vocabulary
V_TINY = 96


def run_model(spec: dict, prompt: list[int]) -> dict:
    """:func:`reads` of one model loaded with tp=True, and what this rank holds; or ``{"error": line}``."""
    try:
        m = vocablens.load(spec["dir"], tp=True)
        refused = _tried(lambda: m.argmax())  # a workflow that does not run split: refused before it runs
        return {**reads(m, spec, prompt), "held": _held(m), "readout": m.provenance.readout, "refused": refused}
    except VocabLensError as e:  # a refusal: one line, the same on every rank
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001  (a failure the library should have refused: the test fails on it)
        return {"crash": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}


if __name__ == "__main__":
    torch.set_num_threads(1)
    jobs, outdir = json.loads(open(sys.argv[1]).read()), sys.argv[2]
    dist.init_process_group("gloo")
    runs = []
    for argv in jobs["cli"]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = run_app(argv)
        runs.append([code, buf.getvalue()])
    models = {name: run_model(spec, jobs["prompt"]) for name, spec in jobs["models"].items()}
    with open(f"{outdir}/rank{dist.get_rank()}.json", "w") as f:
        json.dump({"cli": runs, "models": models}, f)
    dist.barrier()  # no rank tears down its gloo pairs while another still uses them
    dist.destroy_process_group()
