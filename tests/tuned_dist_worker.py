"""Worker for test_tuned.py: trains a tiny tuned lens with torch.distributed (gloo), saves rank 0's result.

Run as ``python -m torch.distributed.run --nproc_per_node 2 tests/tuned_dist_worker.py OUT.pt``.
"""

import sys

import torch
import torch.distributed as dist

from test_tuned import SMALL, rows_for, tiny
from vocablens.lens.train import train

if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    b = tiny()
    res = train(b, rows_for(b, 8, 16), SMALL)
    if dist.get_rank() == 0:
        torch.save({"weight": res.lens.weight.detach(), "bias": res.lens.bias.detach()}, sys.argv[1])
    # Every rank reaches the end before any tears its group down: a rank that destroys (or exits) while
    # the other still has gloo pairs open can abort with "terminate called without an active exception".
    dist.barrier()
    dist.destroy_process_group()
