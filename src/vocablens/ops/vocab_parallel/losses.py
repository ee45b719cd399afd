"""Vocab-parallel logsumexp, log-softmax and cross-entropy, without gathering the logits.

Two all-reduces of [N] per row statistic: MAX of the row max m, then SUM of the exp-sums
s = Σ exp(z - m) (packed with the target logit and, for label smoothing, Σ (z - m)). Every result is
formed from logit differences — log p = (z - m) - log s, loss = log s + (1-a)(m - z_t) - (a/V)Σ(z - m)
— so it does not move when all logits are offset by 1e8. Cross-entropy uses the *global* V for label
smoothing (Megatron #737/#7464 used the local V). Replicated outputs (the loss, the logsumexp) get
the same upstream gradient on every rank; sharded outputs (local log-probabilities) each rank's own slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import REDUCTIONS, check_choice, check_float, check_ids, check_int, check_real
from vocablens.ops.chunking import safe_max
from vocablens.ops.vocab_parallel.comm import all_reduce
from vocablens.ops.vocab_parallel.functional import check_shard


def _row_stats(z: torch.Tensor, group):
    """Global row max m (safe: 0 for all -inf rows) and this rank's e = exp(z - m) [..., V_r]."""
    m = safe_max(all_reduce(z.detach().amax(-1), dist.ReduceOp.MAX, group))
    return m, torch.exp(z - m[..., None])


def _normalizer(ctx, z: torch.Tensor, group):
    """Global (m, s = Σ exp(z - m)) of the row; saves (e, s) for backward."""
    m, e = _row_stats(z, group)
    s = all_reduce(e.sum(-1), group=group)
    ctx.save_for_backward(e, s)
    return m, s


class _VPLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, group):
        m, s = _normalizer(ctx, z, group)
        return m + torch.log(s)

    @staticmethod
    def backward(ctx, g):
        e, s = ctx.saved_tensors
        return g[..., None] * e / s[..., None], None


class _VPLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, group):
        m, s = _normalizer(ctx, z, group)
        ctx.group = group
        return (z - m[..., None]) - torch.log(s)[..., None]

    @staticmethod
    def backward(ctx, g):
        e, s = ctx.saved_tensors
        gsum = all_reduce(g.sum(-1).contiguous(), group=ctx.group)
        return g - (e / s[..., None]) * gsum[..., None], None


def vocab_parallel_logsumexp(local_logits: torch.Tensor, group=None) -> torch.Tensor:
    """Global logsumexp [...] float32 of logits split over ranks along the last dim, without gathering.

    Two all-reduces of [...] (MAX, then SUM of exp(z - max)). Differentiable (no communication in backward).
    """
    check_float("local_logits", local_logits)
    return _VPLogSumExp.apply(local_logits.float(), group)


def vocab_parallel_log_softmax(local_logits: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's slice [..., V_r] of the global log-softmax (float32), without gathering logits.

    Differentiable: backward all-reduces the row sums of the upstream gradient.
    """
    check_float("local_logits", local_logits)
    return _VPLogSoftmax.apply(local_logits.float(), group)


class _VPCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, targets, start, V, ignore_index, ls, reduction, group):
        valid = targets != ignore_index
        owner = valid & (targets >= start) & (targets < start + z.shape[-1])
        loc = torch.where(owner, targets - start, torch.zeros_like(targets))
        m, e = _row_stats(z, group)
        gap = torch.where(owner, m - z.gather(-1, loc[:, None]).squeeze(-1), z.new_zeros(()))
        # one all-reduce for the exp-sum, m - z_target (owner rank only) and Σ (z - m) (label smoothing)
        packed = all_reduce(torch.stack([e.sum(-1), gap] + ([(z - m[:, None]).sum(-1)] if ls > 0 else [])),
                            group=group)
        s = packed[0]
        loss = torch.log(s) + (1.0 - ls) * packed[1]
        if ls > 0:
            loss = loss - (ls / V) * packed[2]
        loss = torch.where(valid, loss, torch.zeros_like(loss))
        count = int(valid.sum())
        ctx.save_for_backward(e, s, loc, owner, valid)
        ctx.ls, ctx.V, ctx.reduction, ctx.count = ls, V, reduction, count
        if reduction == "none":
            return loss
        scale = 1.0 / count if (reduction == "mean" and count > 0) else 1.0
        return (loss.sum(dtype=torch.float64) * scale).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        e, s, loc, owner, valid = ctx.saved_tensors
        N = e.shape[0]
        if ctx.reduction == "none":
            row = g.to(torch.float32).reshape(N)
        else:
            sc = (1.0 / ctx.count) if (ctx.reduction == "mean" and ctx.count > 0) else 1.0
            row = e.new_ones(N) * (g.to(torch.float32) * sc)
        row = row * valid.to(torch.float32)
        grad = e * (row / s)[:, None]
        if ctx.ls > 0:
            grad = grad - (ctx.ls / ctx.V) * row[:, None]
        own = (-(1.0 - ctx.ls) * row) * owner.to(torch.float32)
        grad.scatter_add_(1, loc[:, None], own[:, None])
        return grad, None, None, None, None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, V: int,
                                 group=None, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                                 reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits split over ranks, without gathering them (Megatron-LM's vocab-parallel CE).

    ``loss_i = lse_i - (1-a)·z_{i,y_i} - (a/V)·Σ_j z_ij`` with the *global* V and global sums, so the
    result equals the single-process ``F.cross_entropy(..., label_smoothing=a)`` on every rank
    (computed from logit differences, see the module docstring).

    Args:
        local_logits: [N, V_r] this rank's logits (any float dtype; computed in float32).
        targets: [N] global ids in [0, V) or ignore_index, the same on every rank.
        vocab_start: first global id of this shard; V: global vocabulary size (ints).
        reduction: mean (over non-ignored; 0 when all are ignored), sum or none.

    Returns:
        float32 scalar or [N]; the same on every rank. Differentiable in local_logits (no
        communication in backward: each shard's gradient is its softmax slice minus the one-hot
        on the owner rank).

    Raises:
        ShapeMismatch: shapes disagree.
        BadInput: targets outside [0, V), reduction not in (mean, sum, none), label_smoothing outside
            [0, 1], ignore_index not an int, shard outside [0, V).
    """
    check_float("local_logits", local_logits)
    if local_logits.dim() != 2:
        raise ShapeMismatch(f"local_logits must be [N, V_r]; got {tuple(local_logits.shape)}")
    if not isinstance(targets, torch.Tensor) or tuple(targets.shape) != (local_logits.shape[0],):
        got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ShapeMismatch(f"targets {got} must be [N]=({local_logits.shape[0]},) "
                            f"for local_logits {tuple(local_logits.shape)}")
    if local_logits.shape[0] == 0:
        raise BadInput("local_logits has no rows: nothing to compute")
    check_choice("reduction", reduction, REDUCTIONS)
    label_smoothing = check_real("label_smoothing", label_smoothing, 0.0, 1.0)
    ignore_index = check_int("ignore_index", ignore_index)
    vocab_start, V = check_shard("local_logits", local_logits.shape[1], vocab_start, V)
    check_ids("targets", targets, V, ignore_index=ignore_index)
    return _VPCrossEntropy.apply(local_logits.float(), targets.to(torch.int64), vocab_start, V,
                                 ignore_index, label_smoothing, reduction, group)


@torch.no_grad()
def vocab_parallel_token_logprobs(local_logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, V: int,
                                  top_k: int = 0, group=None):
    """Per-position log p(target), entropy and top-k of logits split over ranks, without gathering them.

    Args:
        local_logits: [N, V_r] this rank's logits (float32); targets: [N] int64 global ids in [0, V),
            the same on every rank; vocab_start, V: this shard's first id and the global V; top_k: 0..V.

    Returns:
        ``(logprob [N], entropy [N], topk_ids [N, k] int64, topk_logprobs [N, k])``, float32 nats, the
        same on every rank (k = 0: empty [N, 0] tensors). Cost: the logsumexp's two all-reduces of [N],
        one SUM of [2, N] float64 (the target logit and -Σ p log p, accumulated in float64: no
        cancellation), and :func:`vocab_parallel_topk`'s gathers when ``top_k``.

    Raises:
        ShapeMismatch / BadInput: as :func:`vocab_parallel_cross_entropy` and :func:`vocab_parallel_topk`.
    """
    import math

    from vocablens.ops.vocab_parallel.functional import vocab_parallel_topk

    check_float("local_logits", local_logits)
    if local_logits.dim() != 2:
        raise ShapeMismatch(f"local_logits must be [N, V_r]; got {tuple(local_logits.shape)}")
    vocab_start, V = check_shard("local_logits", local_logits.shape[1], vocab_start, V)
    check_ids("targets", targets, V)
    z = local_logits.float()
    lse = vocab_parallel_logsumexp(z, group)  # [N]
    t = targets.to(z.device).long()
    mine = (t >= vocab_start) & (t < vocab_start + z.shape[1])
    zt = torch.where(mine, z.gather(1, (t - vocab_start).clamp(0, z.shape[1] - 1)[:, None])[:, 0],
                     torch.zeros((), dtype=z.dtype, device=z.device))
    lp = z - lse[:, None]
    plp = torch.where(lp > -math.inf, lp.exp() * lp, torch.zeros((), dtype=z.dtype, device=z.device))
    both = all_reduce(torch.stack([zt.double(), plp.sum(1, dtype=torch.float64)]), group=group)
    logprob, entropy = both[0].float() - lse, (-both[1]).float()
    if top_k:
        vals, ids = vocab_parallel_topk(z, top_k, vocab_start, V, group)
        return logprob, entropy, ids, vals - lse[:, None]
    return logprob, entropy, torch.zeros(len(t), 0, dtype=torch.int64), torch.zeros(len(t), 0)


__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_log_softmax", "vocab_parallel_logsumexp",
           "vocab_parallel_token_logprobs"]
