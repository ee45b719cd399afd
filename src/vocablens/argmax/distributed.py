"""The exact argmax check over several processes (``torch.distributed``, launched by torchrun).

When a process group is initialised (gloo on CPU, NCCL on GPU) with more than one rank:

- stage ``prepare``: the whitening's row blocks are dealt round-robin; the mean, the covariance
  and the whitened rows are summed with ``all_reduce`` (:func:`~vocablens.argmax.preparation.whiten`);
  under more than one rank no budget check stops a rank alone before a collective;
- stage ``gemm``: rank k takes the query blocks k, k + W, k + 2W ... of the upper triangle; the
  per-row maxima are combined with one ``all_reduce(MAX)`` (exact integers, so the result equals
  one process's bit for bit), the near pairs scored exactly (:mod:`~vocablens.argmax.near`) with
  one ``all_gather_object``;
- stages ``reflect``, ``proof`` and ``bias``: the open rows are dealt round-robin; each rank settles
  its share, then every rank receives every settlement (``all_gather_object``), so all ranks hold
  the same state and rank 0 prints the one result. Every row is decided by the same code as in one
  process, so the verdicts are the same.

The time budget applies per rank to its own share (the all-pairs stage always runs to the end).
"""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.state import ScanState
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


_FIELDS = ("verdict", "stage", "margin", "residual", "scale")


def deal_open_rows(st: ScanState) -> np.ndarray:
    """The open rows dealt round-robin over the ranks: this rank's (positions into ``reps``, every
    ``size``-th from ``rank``); the other ranks take the rest."""
    rank, size = world()
    return st.left[rank::size]


def gather(st: ScanState, mine: np.ndarray, still_open: np.ndarray, before: dict) -> None:
    """Exchange the settlements of every rank's share and the rows each left open.

    Args:
        mine: positions this rank worked on; still_open: those it left open; before: the settled
            counts before the stage (this rank's new settlements are the difference).
    """
    import torch.distributed as dist

    toks = [int(t) for t in st.distinct.ids[mine]]
    twins = {int(st.group[t]) for t in toks if int(st.group[t]) >= 0}
    rec = {
        "rows": {t: tuple(getattr(st, f)[t] for f in _FIELDS) for t in toks},
        "x": {t: st.x_extra[t] for t in toks if t in st.x_extra},
        "combos": {t: st.combos[t] for t in toks if t in st.combos},
        "means": {t: st.combo_mean[t] for t in toks if t in st.combo_mean},
        "tilts": {t: st.combo_tilt[t] for t in toks if t in st.combo_tilt},
        "reasons": {t: st.reasons[t] for t in toks if t in st.reasons},
        "tie": {g: st.group_can_tie[g] for g in twins if g in st.group_can_tie},
        "settled": {k: st.settled[k] - before[k] for k in st.settled},
        "ratio": {} if st.bound_ratio is None else {int(k): float(st.bound_ratio[k]) for k in mine},
        "open": still_open, "cut": list(st.cut_short),
    }
    out: list = [None] * world()[1]
    dist.all_gather_object(out, rec)
    opened = []
    for k, r in enumerate(out):
        for t, vals in r["rows"].items():
            for f, v in zip(_FIELDS, vals):
                getattr(st, f)[t] = v
        st.x_extra.update(r["x"])
        st.combos.update(r["combos"])
        st.combo_mean.update(r["means"])
        st.combo_tilt.update(r["tilts"])
        st.reasons.update(r["reasons"])
        st.group_can_tie.update(r["tie"])
        for k, v in r["ratio"].items():                 # the re-check picks the same certificates
            st.bound_ratio[k] = v
        opened.append(np.asarray(r["open"], dtype=np.int64))
        for c in r["cut"]:
            st.cut(c)
    for key in st.settled:
        st.settled[key] = before[key] + sum(r["settled"][key] for r in out)
    st.left = np.sort(np.concatenate(opened)) if opened else np.zeros(0, dtype=np.int64)
