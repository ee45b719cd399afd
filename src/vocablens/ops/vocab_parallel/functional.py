"""Vocab-parallel embedding, LM-head logits, gathered logits, argmax and top-k (functional form).

* Embedding (Megatron-LM ``VocabParallelEmbedding``, Shoeybi et al. 2019, arXiv 1909.08053 §3; vLLM):
  ids outside the shard look up a dummy row 0 whose output is zeroed, then an all-reduce sums the
  ranks' partial rows.
* LM head: the hidden state enters through :func:`~vocablens.ops.vocab_parallel.comm.copy_to_region`
  (its gradient is summed over ranks — the fix of ml-cross-entropy PR #42 / ms-swift PR #9947); each
  rank computes its slice of the logits [N, V_r] in float32 through
  :func:`vocablens.logit_transform.transform_logits`.
* argmax and top-k match ``torch.argmax`` / ``torch.topk`` of the full logits bit for bit (ties:
  lowest id first; NaN counts as the largest value, first NaN wins, as in torch).

Inputs are checked before any collective, on shapes every rank shares, so bad input raises on every
rank at once.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import transform_logits
from vocablens.ops._checks import check_float, check_head, check_head_transform, check_ids, check_int, check_real
from vocablens.ops.embedding import embedding_lookup
from vocablens.ops.topk import merge_topk, topk_lowest_id
from vocablens.ops.vocab_parallel.comm import (
    GatherFromRegion, all_gather_stack, copy_to_region, reduce_from_region, shard_range, shard_sizes, world,
)


def check_shard(name: str, n_local: int, vocab_start, V) -> tuple[int, int]:
    """``(vocab_start, V)`` as ints, checked: the shard ``[vocab_start, vocab_start + n_local)`` fits [0, V).

    Raises:
        BadInput: vocab_start or V not an int, or the shard outside [0, V).
    """
    vocab_start, V = check_int("vocab_start", vocab_start, 0), check_int("V", V, 1)
    if vocab_start + n_local > V:
        raise BadInput(f"{name}: shard [{vocab_start}, {vocab_start + n_local}) does not fit a vocabulary of V={V}")
    return vocab_start, V


def vocab_parallel_embedding(ids: torch.Tensor, W_shard: torch.Tensor, vocab_start: int, V: int,
                             group=None, scale: float | None = None) -> torch.Tensor:
    """Embedding lookup with the rows split across ranks; every rank returns the full [..., d].

    Args:
        ids: [...] int ids in [0, V), the same on every rank.
        W_shard: [V_r, d] this rank's rows ``[vocab_start, vocab_start + V_r)``.
        vocab_start: first global id of the shard; V: global vocabulary size (ints).
        group: process group (None = world). scale: optional input scale (a finite number).

    Returns:
        [..., d] in W_shard's dtype, equal to ``W[ids] · scale``; gradients reach each rank's shard
        (all-reduce forward, identity backward).

    Raises:
        ShapeMismatch: non-integer ids, W_shard not 2-D float.
        BadInput: ids outside [0, V) (checked on the global V, so an id no rank holds is an error, not
            a zero row), shard outside [0, V).
    """
    check_float("W_shard", W_shard)
    if W_shard.dim() != 2:
        raise ShapeMismatch(f"W_shard must be [V_r, d]; got {tuple(W_shard.shape)}")
    vocab_start, V = check_shard("W_shard", W_shard.shape[0], vocab_start, V)
    if scale is not None:
        scale = check_real("scale", scale)
    check_ids("ids", ids, V)
    stop = vocab_start + W_shard.shape[0]
    ids = ids.to(torch.int64)
    outside = (ids < vocab_start) | (ids >= stop)
    local = torch.where(outside, torch.zeros_like(ids), ids - vocab_start)
    out = embedding_lookup(W_shard, local, scale)
    return reduce_from_region(out.masked_fill(outside[..., None], 0), group)


def vocab_parallel_logits(hidden: torch.Tensor, W_shard: torch.Tensor, bias_shard: torch.Tensor | None = None,
                          group=None, *, softcap: float | None = None, logit_scale: float = 1.0) -> torch.Tensor:
    """This rank's float32 logits [..., V_r] = transform_logits(hidden W_shardᵀ + b_shard, logit_scale, softcap).

    The hidden state passes through :func:`copy_to_region`, so its gradient is summed over ranks.

    Raises:
        ShapeMismatch: d or dtypes disagree. BadInput: bad logit_scale / softcap.
    """
    check_head(hidden, W_shard, bias_shard)
    logit_scale, softcap = check_head_transform(logit_scale, softcap)
    z = nn.functional.linear(copy_to_region(hidden, group), W_shard, bias_shard).float()
    return transform_logits(z, logit_scale, softcap)


def vocab_parallel_gather_logits(local_logits: torch.Tensor, V: int, group=None) -> torch.Tensor:
    """The full logits [..., V] on every rank (all-gather of the uneven shards; differentiable).

    Raises:
        ShapeMismatch: local_logits' last dim is not this rank's shard size. BadInput: V not an int >= world size.
    """
    check_float("local_logits", local_logits)
    rank, ws = world(group)
    sizes = shard_sizes(V, ws)
    if local_logits.shape[-1] != sizes[rank]:
        raise ShapeMismatch(f"local_logits {tuple(local_logits.shape)} on rank {rank} must have "
                            f"{sizes[rank]} columns (V={V} over {ws} ranks)")
    start, _ = shard_range(V, ws, rank)
    return GatherFromRegion.apply(local_logits, sizes, start, group)


@torch.no_grad()
def vocab_parallel_argmax(local_logits: torch.Tensor, vocab_start: int, group=None) -> torch.Tensor:
    """Global argmax ids [...] int64 of logits split over ranks, equal to ``torch.argmax`` of the full logits.

    Each rank's local argmax (first max; NaN counts as the largest, first NaN wins) and its value are
    all-gathered; ``torch.argmax`` over the ranks' values (in rank = id order) picks the first
    maximal rank, so ties go to the lowest id, as in torch. Values travel exactly (float32/float64).

    Raises:
        ShapeMismatch: local_logits not float. BadInput: vocab_start not an int >= 0.
    """
    check_float("local_logits", local_logits)
    vocab_start = check_int("vocab_start", vocab_start, 0)
    i = torch.argmax(local_logits, dim=-1)
    v = local_logits.gather(-1, i[..., None]).squeeze(-1)
    i = i + vocab_start
    if world(group)[1] == 1:
        return i
    v = v.to(torch.float64 if local_logits.dtype == torch.float64 else torch.float32)
    r = torch.argmax(all_gather_stack(v, group), dim=0)
    return all_gather_stack(i, group).gather(0, r[None]).squeeze(0)


@torch.no_grad()
def vocab_parallel_topk(local_logits: torch.Tensor, k: int, vocab_start: int, V: int,
                        group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k of logits split over ranks: values bit-equal to ``torch.topk`` of the full logits.

    Ids follow the deterministic rule "lowest id first among equal values" (the order of
    ``torch.sort(descending=True, stable=True)``); where there is no tie they equal torch.topk's.

    Args:
        local_logits: [N, V_r]; k: int in [1, V]; vocab_start, V: this shard's first id and the global V.

    Returns:
        ``(values [N, k] in the logits' dtype, ids [N, k] int64)``.

    Raises:
        BadInput: k not an int in [1, V], shard outside [0, V).
    """
    check_float("local_logits", local_logits)
    vocab_start, V = check_shard("local_logits", local_logits.shape[-1], vocab_start, V)
    k = check_int("k", k, 1, V)
    z = local_logits
    kk = min(k, z.shape[-1])
    v, i = topk_lowest_id(z, kk)
    i = i + vocab_start
    _, ws = world(group)
    if ws == 1:
        return v, i
    wide = torch.float64 if z.dtype == torch.float64 else torch.float32
    pv = torch.full((z.shape[0], k), -math.inf, dtype=wide, device=z.device)
    pi = torch.full((z.shape[0], k), V, dtype=torch.int64, device=z.device)  # padding ids sort after every real id
    pv[:, :kk] = v.to(wide)
    pi[:, :kk] = i
    vs, ids = all_gather_stack(pv, group), all_gather_stack(pi, group)
    tv, ti = vs[0], ids[0]
    for r in range(1, ws):
        tv, ti = merge_topk(tv, ti, vs[r], ids[r], k)
    return tv.to(z.dtype), ti


__all__ = ["check_shard", "vocab_parallel_argmax", "vocab_parallel_embedding", "vocab_parallel_gather_logits",
           "vocab_parallel_logits", "vocab_parallel_topk"]
