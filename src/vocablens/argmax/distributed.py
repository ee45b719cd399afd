"""The exact argmax check over several processes (``torch.distributed``, launched by torchrun).

When a process group is initialised (gloo on CPU, NCCL on GPU) with more than one rank:

- stage ``prepare``: the whitening's row blocks are dealt round-robin; the mean, the covariance
  and the whitened rows are summed with ``all_reduce`` (:func:`~vocablens.argmax.preparation.whiten`);
  under more than one rank no budget check stops a rank alone before a collective;
- stage ``gemm``: rank k takes the query blocks k, k + W, k + 2W ... of the upper triangle; the
  per-row maxima are combined with one ``all_reduce(MAX)`` (exact integers, so the result equals
  one process's bit for bit), the near pairs scored exactly (:mod:`~vocablens.argmax.near`) with
  one ``all_gather_object``;
- stages ``reflect``, ``proof`` and ``bias``: the open rows are dealt round-robin; each rank decides
  its share, then every rank receives every rank's stage results (:func:`exchange`), so all ranks
  fold the same verdicts and rank 0 prints the one result. Every row is decided by the same code as in one
  process, so the verdicts are the same.

The time budget applies per rank to its own share (the all-pairs stage always runs to the end).
"""

from __future__ import annotations

import numpy as np
import torch

from vocablens.ops.vocab_parallel.comm import world


def allreduce_max(best: torch.Tensor) -> None:
    """In-place elementwise maximum of a tensor over all ranks (int32, or float32 holding exact
    integers and -inf: sent as float64, exact)."""
    import torch.distributed as dist

    t = best.double() if best.is_floating_point() else best.long()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    best.copy_(t.to(best.dtype))


def gather_near(near) -> None:
    """Every rank's stage-1 near pairs (:class:`~vocablens.argmax.near.NearPairs`) on every rank:
    the rows left open anywhere (``over``) by ``all_reduce(MAX)``, the pairs by ``all_gather_object``."""
    import torch.distributed as dist

    over = torch.from_numpy(near.over.astype(np.int32))
    dist.all_reduce(over, op=dist.ReduceOp.MAX)
    near.over[:] = over.numpy() > 0
    t, j = near.gathered()
    out: list = [None] * world()[1]
    dist.all_gather_object(out, (t, j))
    near.pairs = [[p] for p in out]


def exchange(mine: list) -> list[list]:
    """Every rank's stage results (:class:`~vocablens.argmax.decisions.StageResult`, frozen, for its
    share of the open rows) on every rank, by rank (``all_gather_object``): each rank folds the
    others' into its verdict book, so all ranks end with the same verdicts and certificates."""
    import torch.distributed as dist

    out: list = [None] * world()[1]
    dist.all_gather_object(out, mine)
    return out


__all__ = ["allreduce_max", "exchange", "gather_near"]
