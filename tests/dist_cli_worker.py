"""Worker for test_distributed.py: runs CLI commands in one torchrun process group (gloo).

Run as ``python -m torch.distributed.run --nproc-per-node 2 tests/dist_cli_worker.py JOBS.json OUTDIR``:
each rank runs every command of JOBS.json (a list of argv lists) through ``run_app`` in order,
capturing stdout, then checks what its vocab-parallel model holds; it writes
``OUTDIR/rank<r>.json`` = ``{"runs": [[exit code, stdout], ...], "held": {...}}``.
"""

import contextlib
import io
import json
import sys

import torch
import torch.distributed as dist

from vocablens.cli import run_app
from vocablens.parallel.processes import VocabParallelModel
from vocablens.models import load

if __name__ == "__main__":
    torch.set_num_threads(1)
    jobs, outdir = json.loads(open(sys.argv[1]).read()), sys.argv[2]
    dist.init_process_group("gloo")
    runs = []
    for argv in jobs["commands"]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = run_app(argv)
        runs.append([code, buf.getvalue()])
    held = {}
    for spec in jobs["models"]:
        b = load(spec).borders
        V = b.vocab_size
        vp = VocabParallelModel(b)
        full = [n for n, p in b.model.named_parameters() if p.shape[:1] == (V,) and ("embed" in n or "head" in n)]
        held[spec] = {"rows": vp.held_rows(), "emb_rows": int(b.model.get_input_embeddings().weight.shape[0]),
                      "full_params": full, "V": V}
    with open(f"{outdir}/rank{dist.get_rank()}.json", "w") as f:
        json.dump({"runs": runs, "held": held}, f)
    dist.barrier()  # no rank tears down its gloo pairs while another still uses them
    dist.destroy_process_group()
