"""Sharding arithmetic and the collectives of vocablens's multi-process paths (vocablens's one set).

Each rank holds a contiguous shard of rows ``[start, stop)`` of a [V, d] matrix; the first
``V % world`` ranks hold one row more (Cut Cross-Entropy's ``partition_n_into_range``), so there are
no padding rows. The region functions are Megatron-LM's (Shoeybi et al. 2019, arXiv 1909.08053, §3):
``copy_to_region`` (identity forward, all-reduce of the gradient backward: the LM head's input) and
``reduce_from_region`` (all-reduce forward, identity backward: after the vocab-parallel embedding).
Without an initialized process group everything runs as a world of one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vocablens.errors import BadInput
from vocablens.ops._checks import check_int


def shard_range(V: int, world_size: int, rank: int) -> tuple[int, int]:
    """Contiguous row range ``[start, stop)`` of rank ``rank`` for a vocabulary of V rows.

    The first ``V % world_size`` ranks hold ``V // world_size + 1`` rows, the others one fewer.

    Raises:
        BadInput: an argument that is not an int, world_size < 1, rank outside [0, world_size),
            V < 1, or world_size > V (a rank would hold no row).
    """
    V, world_size, rank = check_int("V", V), check_int("world_size", world_size), check_int("rank", rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise BadInput(f"rank {rank} / world size {world_size}: need 0 <= rank < world_size")
    if V < 1:
        raise BadInput(f"vocabulary size must be positive; got V={V}")
    if world_size > V:
        raise BadInput(f"world size {world_size} is larger than the vocabulary V={V}: a rank would hold no row")
    return _split(V, world_size, rank)


def _split(n: int, size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank`` when ``n`` items are cut into ``size`` contiguous parts, the first
    ``n % size`` one item longer (parts beyond ``n`` are empty)."""
    base, extra = divmod(int(n), int(size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def share(n: int, rank: int | None = None, size: int | None = None) -> tuple[int, int]:
    """This rank's contiguous range ``[start, stop)`` of ``n`` items (rows, batches) for the
    data-parallel paths (``lens eval``, ``settle``): :func:`shard_range`'s split, with ``rank`` and
    ``size`` of the default group unless given, and empty ranges allowed (more ranks than items)."""
    r, s = world()
    return _split(n, s if size is None else size, r if rank is None else rank)


def shard_sizes(V: int, world_size: int) -> list[int]:
    """Rows per rank, ``[stop - start for each rank]`` (sums to V). Raises BadInput as :func:`shard_range`."""
    return [b - a for a, b in (shard_range(V, world_size, r) for r in range(check_int("world_size", world_size, 1)))]


def world(group=None) -> tuple[int, int]:
    """``(rank, world size)`` of ``group`` (default: the default process group), or ``(0, 1)``
    without an initialized process group: vocablens's one helper for where a process stands, in the
    order of :func:`vocablens.parallel.processes.init_from_env`."""
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def all_reduce(t: torch.Tensor, op=None, group=None) -> torch.Tensor:
    """In-place all-reduce (default SUM) of ``t`` over ``group``; a no-op in a world of one."""
    if world(group)[1] > 1:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=group)
    return t


def allreduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of ``t`` over all ranks, in float64 (a new tensor; ``t`` itself when the world is one):
    the data-parallel paths' means equal one process's up to float rounding."""
    if world(group)[1] == 1:
        return t
    return all_reduce(t.to(torch.float64).clone(), group=group)


def gather_columns(t: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's [..., n_r] along the last dim, in rank order (uneven n_r, zero allowed);
    with :func:`share` this puts per-position results back in the order one process makes them."""
    _, size = world(group)
    if size == 1:
        return t
    n = torch.tensor([t.shape[-1]], dtype=torch.int64)
    parts = [torch.zeros_like(n) for _ in range(size)]
    dist.all_gather(parts, n, group=group)
    sizes = [int(p) for p in parts]
    if max(sizes) == 0:
        return t
    return all_gather_cat(t, sizes, group)


def all_gather_cat(t: torch.Tensor, sizes: list[int], group=None) -> torch.Tensor:
    """Concatenate along the last dim the uneven local tensors ``[..., sizes[r]]`` of every rank."""
    _, ws = world(group)
    if ws == 1:
        return t
    pad = torch.zeros(*t.shape[:-1], max(sizes), dtype=t.dtype, device=t.device)
    pad[..., : t.shape[-1]] = t
    parts = [torch.empty_like(pad) for _ in range(ws)]
    dist.all_gather(parts, pad.contiguous(), group=group)
    return torch.cat([p[..., :s] for p, s in zip(parts, sizes)], dim=-1)


def all_gather_stack(t: torch.Tensor, group=None) -> torch.Tensor:
    """[world, ...]: every rank's ``t`` (same shape on every rank), stacked in rank order."""
    parts = [torch.empty_like(t) for _ in range(world(group)[1])]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts)


class _CopyToRegion(torch.autograd.Function):
    """Identity forward; all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous().clone(), group=ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.contiguous().clone(), group=group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherFromRegion(torch.autograd.Function):
    """All-gather of uneven shards along the last dim forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, sizes, start, group):
        ctx.start, ctx.stop = start, start + x.shape[-1]
        return all_gather_cat(x, sizes, group)

    @staticmethod
    def backward(ctx, g):
        return g[..., ctx.start:ctx.stop].contiguous(), None, None, None


def copy_to_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """Identity whose backward all-reduces the gradient (Megatron's ``copy_to_tensor_model_parallel_region``)."""
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce (sum) whose backward is the identity (``reduce_from_tensor_model_parallel_region``)."""
    return _ReduceFromRegion.apply(x, group)


__all__ = ["GatherFromRegion", "all_gather_cat", "all_gather_stack", "all_reduce", "allreduce_sum", "copy_to_region",
           "gather_columns", "reduce_from_region", "shard_range", "shard_sizes", "share", "world"]
