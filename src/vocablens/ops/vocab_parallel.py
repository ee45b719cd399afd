"""Vocabulary-parallel embedding and LM head on torch.distributed (gloo on CPU, NCCL on GPU).

Each rank holds a contiguous shard of rows ``[start, stop)`` of the [V, d] matrix. Shards may be
uneven: the first ``V % world`` ranks hold one row more (Cut Cross-Entropy's
``partition_n_into_range``), so there are no padding rows and none can leak into a softmax.

* Embedding (Megatron-LM ``VocabParallelEmbedding``, Shoeybi et al. 2019, arXiv 1909.08053 §3;
  vLLM): ids outside the shard look up a dummy row 0 whose output is zeroed, then an all-reduce
  sums the ranks' partial rows. Autograd: all-reduce forward, identity backward
  ("reduce from the tensor-parallel region").
* LM head: the hidden state enters through "copy to the tensor-parallel region" (identity forward,
  all-reduce of the hidden gradient backward — the fix of ml-cross-entropy PR #42 / ms-swift
  PR #9947); each rank computes its slice of the logits [N, V_r] in float32.
* Without gathering logits: logsumexp (all-reduce MAX of the row max, then all-reduce SUM of the
  exp-sums), log-softmax, cross-entropy with ignore_index and label smoothing over the *global* V
  (Megatron #737/#7464 used the local V), argmax and top-k that match ``torch.argmax`` and
  ``torch.topk`` values bit for bit (ties: lowest id first; NaN counts as the largest value, first
  NaN wins, as in torch), and a gather path for the full logits.

Gradient convention: replicated outputs (the loss, the logsumexp, the embedding output) are assumed
to be computed identically on every rank and receive the same upstream gradient there; sharded
outputs (local logits, local log-probabilities) receive each rank's own slice of the gradient.
Every collective runs on ``group`` (default: the world). Inputs are checked before any collective,
and the checks depend only on shapes every rank shares, so bad input raises on every rank at once.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import check_float, check_head, check_ids, check_softcap
from vocablens.ops.embedding import embedding_lookup

# ------------------------------------------------------------------------------------------ sharding


def shard_range(V: int, world_size: int, rank: int) -> tuple[int, int]:
    """Contiguous row range ``[start, stop)`` of rank ``rank`` for a vocabulary of V rows.

    The first ``V % world_size`` ranks hold ``V // world_size + 1`` rows, the others one fewer.

    Raises:
        BadInput: world_size < 1, rank outside [0, world_size), V < 1, or world_size > V (a rank
        would hold no row).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise BadInput(f"rank {rank} / world size {world_size}: need 0 <= rank < world_size")
    if V < 1:
        raise BadInput(f"vocabulary size must be positive; got V={V}")
    if world_size > V:
        raise BadInput(f"world size {world_size} is larger than the vocabulary V={V}: a rank would hold no row")
    base, extra = divmod(V, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_sizes(V: int, world_size: int) -> list[int]:
    """Rows per rank, ``[stop - start for each rank]`` (sums to V)."""
    return [b - a for a, b in (shard_range(V, world_size, r) for r in range(world_size))]


def _ws_rank(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _all_reduce(t: torch.Tensor, op=None, group=None) -> torch.Tensor:
    if _ws_rank(group)[0] > 1:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=group)
    return t


def _all_gather_rows(t: torch.Tensor, sizes: list[int], group=None) -> torch.Tensor:
    """Concatenate along the last dim the uneven local tensors of every rank ([..., sizes[r]])."""
    ws, rank = _ws_rank(group)
    if ws == 1:
        return t
    mx = max(sizes)
    pad = torch.zeros(*t.shape[:-1], mx, dtype=t.dtype, device=t.device)
    pad[..., : t.shape[-1]] = t
    parts = [torch.empty_like(pad) for _ in range(ws)]
    dist.all_gather(parts, pad.contiguous(), group=group)
    return torch.cat([p[..., :s] for p, s in zip(parts, sizes)], dim=-1)


# ---------------------------------------------------------------------- autograd-aware collectives


class _CopyToRegion(torch.autograd.Function):
    """Identity forward; all-reduce (sum) of the gradient backward. Apply to the LM head's input."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.contiguous().clone(), group=ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward. Apply after the vocab-parallel embedding."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.contiguous().clone(), group=group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromRegion(torch.autograd.Function):
    """All-gather of uneven shards along the last dim forward; own slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, sizes, start, group):
        ctx.start, ctx.stop = start, start + x.shape[-1]
        return _all_gather_rows(x, sizes, group)

    @staticmethod
    def backward(ctx, g):
        return g[..., ctx.start:ctx.stop].contiguous(), None, None, None


def copy_to_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """Identity whose backward all-reduces the gradient (Megatron's ``copy_to_tensor_model_parallel_region``)."""
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce (sum) whose backward is the identity (``reduce_from_tensor_model_parallel_region``)."""
    return _ReduceFromRegion.apply(x, group)


# ------------------------------------------------------------------------------------------ embedding


def vocab_parallel_embedding(ids: torch.Tensor, W_shard: torch.Tensor, vocab_start: int, V: int,
                             group=None, scale: float | None = None) -> torch.Tensor:
    """Embedding lookup with the rows split across ranks; every rank returns the full [..., d].

    Args:
        ids: [...] int ids in [0, V), the same on every rank.
        W_shard: [V_r, d] this rank's rows ``[vocab_start, vocab_start + V_r)``.
        vocab_start: first global id of the shard; V: global vocabulary size.
        group: process group (None = world). scale: optional input scale.

    Returns:
        [..., d] in W_shard's dtype, equal to ``W[ids] · scale``; gradients reach each rank's shard.

    Raises:
        ShapeMismatch: non-integer ids, W_shard not 2-D. BadInput: ids outside [0, V) (checked on
        the global V, so an id no rank holds is an error, not a zero row).
    """
    check_float("W_shard", W_shard)
    if W_shard.dim() != 2:
        raise ShapeMismatch(f"W_shard must be [V_r, d]; got {tuple(W_shard.shape)}")
    check_ids("ids", ids, V)
    stop = vocab_start + W_shard.shape[0]
    if not (0 <= vocab_start and stop <= V):
        raise BadInput(f"shard [{vocab_start}, {stop}) does not fit a vocabulary of V={V}")
    ids = ids.to(torch.int64)
    outside = (ids < vocab_start) | (ids >= stop)
    local = torch.where(outside, torch.zeros_like(ids), ids - vocab_start)
    out = embedding_lookup(W_shard, local, scale)
    out = out.masked_fill(outside[..., None], 0)
    return reduce_from_region(out, group)


# ------------------------------------------------------------------------------------------- LM head


def vocab_parallel_logits(hidden: torch.Tensor, W_shard: torch.Tensor, bias_shard: torch.Tensor | None = None,
                          group=None, *, softcap: float | None = None, logit_scale: float = 1.0) -> torch.Tensor:
    """This rank's float32 logits [..., V_r] = softcap(scale · (hidden W_shardᵀ + b_shard)).

    The hidden state passes through :func:`copy_to_region`, so its gradient is summed over ranks.

    Raises:
        ShapeMismatch: d or dtypes disagree. BadInput: bad softcap.
    """
    check_head(hidden, W_shard, bias_shard)
    check_softcap(softcap)
    x = copy_to_region(hidden, group)
    z = nn.functional.linear(x, W_shard, bias_shard).float()
    if logit_scale != 1.0:
        z = z * logit_scale
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z


def _max_allreduce(z: torch.Tensor, group) -> torch.Tensor:
    m = z.detach().amax(-1)
    return _all_reduce(m, dist.ReduceOp.MAX, group)


class _VPLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, group):
        m = _max_allreduce(z, group)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(z - m_safe[..., None])
        s = _all_reduce(e.sum(-1), group=group)
        lse = m_safe + torch.log(s)
        ctx.save_for_backward(e, s)
        return lse

    @staticmethod
    def backward(ctx, g):
        e, s = ctx.saved_tensors
        return g[..., None] * e / s[..., None], None


class _VPLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, group):
        lse = _VPLogSumExp.forward(ctx, z, group)
        ctx.group = group
        return z - lse[..., None]

    @staticmethod
    def backward(ctx, g):
        e, s = ctx.saved_tensors
        gsum = _all_reduce(g.sum(-1).contiguous(), group=ctx.group)
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
        stop = start + z.shape[-1]
        valid = targets != ignore_index
        owner = valid & (targets >= start) & (targets < stop)
        loc = torch.where(owner, targets - start, torch.zeros_like(targets))
        zt = torch.where(owner, z.gather(-1, loc[:, None]).squeeze(-1), z.new_zeros(()))
        m = _max_allreduce(z, group)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(z - m_safe[:, None])
        # one all-reduce for exp-sum, target logit and (label smoothing) the logit sum
        packed = torch.stack([e.sum(-1), zt] + ([z.sum(-1)] if ls > 0 else []))
        packed = _all_reduce(packed, group=group)
        s, zt = packed[0], packed[1]
        lse = m_safe + torch.log(s)
        loss = lse - (1.0 - ls) * zt
        if ls > 0:
            loss = loss - (ls / V) * packed[2]
        loss = torch.where(valid, loss, torch.zeros_like(loss))
        count = int(valid.sum())
        ctx.save_for_backward(e, s, loc, owner, valid)
        ctx.ls, ctx.V, ctx.reduction, ctx.count = ls, V, reduction, count
        if reduction == "none":
            return loss
        total = loss.sum(dtype=torch.float64).to(torch.float32)
        if reduction == "mean":
            total = total / count if count > 0 else z.new_zeros(())
        return total

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
    result equals the single-process ``F.cross_entropy(..., label_smoothing=a)`` on every rank.

    Args:
        local_logits: [N, V_r] this rank's logits (any float dtype; computed in float32).
        targets: [N] global ids in [0, V) or ignore_index, the same on every rank.
        vocab_start: first global id of this shard; V: global vocabulary size.
        reduction: mean (over non-ignored; 0 when all are ignored), sum or none.

    Returns:
        float32 scalar or [N]; the same on every rank. Differentiable in local_logits (no
        communication in backward: each shard's gradient is its softmax slice minus the one-hot
        on the owner rank).

    Raises:
        ShapeMismatch: shapes disagree. BadInput: targets outside [0, V), unknown reduction,
        label_smoothing outside [0, 1], shard outside [0, V).
    """
    check_float("local_logits", local_logits)
    if local_logits.dim() != 2:
        raise ShapeMismatch(f"local_logits must be [N, V_r]; got {tuple(local_logits.shape)}")
    if tuple(targets.shape) != (local_logits.shape[0],):
        raise ShapeMismatch(f"targets {tuple(targets.shape)} must be [N]=({local_logits.shape[0]},) "
                            f"for local_logits {tuple(local_logits.shape)}")
    if local_logits.shape[0] == 0:
        raise BadInput("local_logits has no rows: nothing to compute")
    if reduction not in ("mean", "sum", "none"):
        raise BadInput(f"reduction must be mean, sum or none; got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise BadInput(f"label_smoothing must be in [0, 1]; got {label_smoothing}")
    if not (0 <= vocab_start and vocab_start + local_logits.shape[1] <= V):
        raise BadInput(f"shard [{vocab_start}, {vocab_start + local_logits.shape[1]}) does not fit V={V}")
    check_ids("targets", targets, V, ignore_index=ignore_index)
    return _VPCrossEntropy.apply(local_logits.float(), targets.to(torch.int64), int(vocab_start), int(V),
                                 int(ignore_index), float(label_smoothing), reduction, group)


@torch.no_grad()
def vocab_parallel_argmax(local_logits: torch.Tensor, vocab_start: int, group=None) -> torch.Tensor:
    """Global argmax ids [...] int64 of logits split over ranks, equal to ``torch.argmax`` of the full logits.

    Each rank's local argmax (first max; NaN counts as the largest, first NaN wins) and its value are
    all-gathered; ``torch.argmax`` over the ranks' values (in rank = id order) picks the first
    maximal rank, so ties go to the lowest id, as in torch. Values travel exactly (float32/float64).
    """
    check_float("local_logits", local_logits)
    ws, _ = _ws_rank(group)
    i = torch.argmax(local_logits, dim=-1)  # first occurrence of the max; the first NaN wins
    v = local_logits.gather(-1, i[..., None]).squeeze(-1)
    i = i + vocab_start
    if ws == 1:
        return i
    v = v.to(torch.float64 if local_logits.dtype == torch.float64 else torch.float32).contiguous()
    vs = [torch.empty_like(v) for _ in range(ws)]
    ids = [torch.empty_like(i) for _ in range(ws)]
    dist.all_gather(vs, v, group=group)
    dist.all_gather(ids, i.contiguous(), group=group)
    V_ = torch.stack(vs)
    I_ = torch.stack(ids)
    r = torch.argmax(V_, dim=0)
    return I_.gather(0, r[None]).squeeze(0)


@torch.no_grad()
def vocab_parallel_topk(local_logits: torch.Tensor, k: int, vocab_start: int, V: int,
                        group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k of logits split over ranks: values bit-equal to ``torch.topk`` of the full logits.

    Ids follow the deterministic rule "lowest id first among equal values" (the order of
    ``torch.sort(descending=True, stable=True)``); where there is no tie they equal torch.topk's.

    Args:
        local_logits: [N, V_r]; k: in [1, V]; vocab_start, V: this shard's first id and the global V.

    Returns:
        ``(values [N, k] in the logits' dtype, ids [N, k] int64)``.

    Raises:
        BadInput: k outside [1, V].
    """
    from vocablens.ops.logprobs import _merge_topk, _topk_lowest_id

    check_float("local_logits", local_logits)
    if not 1 <= k <= V:
        raise BadInput(f"k must be in [1, V={V}]; got {k}")
    ws, _ = _ws_rank(group)
    z = local_logits
    kk = min(k, z.shape[-1])
    v, i = _topk_lowest_id(z, kk)
    i = i + vocab_start
    if ws == 1:
        return v, i
    wide = torch.float64 if z.dtype == torch.float64 else torch.float32
    N = z.shape[0]
    pv = torch.full((N, k), -math.inf, dtype=wide, device=z.device)
    pi = torch.full((N, k), V, dtype=torch.int64, device=z.device)  # padding ids sort after every real id
    pv[:, :kk] = v.to(wide)
    pi[:, :kk] = i
    vs = [torch.empty_like(pv) for _ in range(ws)]
    ids = [torch.empty_like(pi) for _ in range(ws)]
    dist.all_gather(vs, pv, group=group)
    dist.all_gather(ids, pi, group=group)
    tv, ti = vs[0], ids[0]
    for r in range(1, ws):
        tv, ti = _merge_topk(tv, ti, vs[r], ids[r], k)
    return tv.to(z.dtype), ti


def vocab_parallel_gather_logits(local_logits: torch.Tensor, V: int, group=None) -> torch.Tensor:
    """The full logits [..., V] on every rank (all-gather of the uneven shards; differentiable)."""
    check_float("local_logits", local_logits)
    ws, rank = _ws_rank(group)
    sizes = shard_sizes(V, ws)
    if local_logits.shape[-1] != sizes[rank]:
        raise ShapeMismatch(f"local_logits {tuple(local_logits.shape)} on rank {rank} must have "
                            f"{sizes[rank]} columns (V={V} over {ws} ranks)")
    start, _ = shard_range(V, ws, rank)
    return _GatherFromRegion.apply(local_logits, sizes, start, group)


# -------------------------------------------------------------------------------------------- modules


class VocabParallelEmbedding(nn.Module):
    """Embedding whose [V, d] rows are split over the ranks of ``group`` (see module docstring).

    Args:
        num_embeddings: global V. embedding_dim: d. group: process group (None = world).
        scale: optional input scale. dtype/device: of this rank's shard [V_r, d].

    Raises:
        BadInput: world size > V.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None, *, scale: float | None = None,
                 dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        ws, rank = _ws_rank(group)
        self.V, self.d, self.group, self.scale = num_embeddings, embedding_dim, group, scale
        self.vocab_start, self.vocab_stop = shard_range(num_embeddings, ws, rank)
        self.weight = nn.Parameter(torch.empty(self.vocab_stop - self.vocab_start, embedding_dim,
                                               dtype=dtype, device=device))
        nn.init.normal_(self.weight)

    @classmethod
    def from_full(cls, W: torch.Tensor, group=None, *, scale: float | None = None) -> "VocabParallelEmbedding":
        """This rank's shard copied from a full [V, d] matrix (the same on every rank)."""
        check_float("W", W)
        if W.dim() != 2:
            raise ShapeMismatch(f"W must be [V, d]; got {tuple(W.shape)}")
        mod = cls(W.shape[0], W.shape[1], group, scale=scale, dtype=W.dtype, device=W.device)
        with torch.no_grad():
            mod.weight.copy_(W[mod.vocab_start:mod.vocab_stop])
        return mod

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] in [0, V) -> [..., d] (the same on every rank)."""
        return vocab_parallel_embedding(ids, self.weight, self.vocab_start, self.V, self.group, self.scale)


class VocabParallelLMHead(nn.Module):
    """LM head whose [V, d] rows (and bias) are split over ranks; logits never gathered unless asked.

    Args:
        in_features: d. num_embeddings: global V. bias: add a [V] bias (sharded).
        softcap: final-logit softcap or None; logit_scale: factor before it. group: process group.

    Raises:
        BadInput: world size > V.
    """

    def __init__(self, in_features: int, num_embeddings: int, bias: bool = False, group=None, *,
                 softcap: float | None = None, logit_scale: float = 1.0,
                 dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        ws, rank = _ws_rank(group)
        self.V, self.d, self.group = num_embeddings, in_features, group
        self.softcap, self.logit_scale = softcap, logit_scale
        self.vocab_start, self.vocab_stop = shard_range(num_embeddings, ws, rank)
        n = self.vocab_stop - self.vocab_start
        self.weight = nn.Parameter(torch.empty(n, in_features, dtype=dtype, device=device))
        nn.init.normal_(self.weight, std=in_features ** -0.5)
        self.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_full(cls, W: torch.Tensor, b: torch.Tensor | None = None, group=None, *,
                  softcap: float | None = None, logit_scale: float = 1.0) -> "VocabParallelLMHead":
        """This rank's shard copied from a full head W [V, d] (+ b [V])."""
        check_head(W[:1], W, b, hname="W")
        mod = cls(W.shape[1], W.shape[0], b is not None, group, softcap=softcap, logit_scale=logit_scale,
                  dtype=W.dtype, device=W.device)
        with torch.no_grad():
            mod.weight.copy_(W[mod.vocab_start:mod.vocab_stop])
            if b is not None:
                mod.bias.copy_(b[mod.vocab_start:mod.vocab_stop])
        return mod

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> this rank's float32 logits [..., V_r]."""
        return vocab_parallel_logits(hidden, self.weight, self.bias, self.group,
                                     softcap=self.softcap, logit_scale=self.logit_scale)

    def logsumexp(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> global logsumexp [...] float32."""
        return vocab_parallel_logsumexp(self(hidden), self.group)

    def log_softmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> this rank's slice [..., V_r] of the global log-softmax."""
        return vocab_parallel_log_softmax(self(hidden), self.group)

    def cross_entropy(self, hidden: torch.Tensor, targets: torch.Tensor, **kw) -> torch.Tensor:
        """[N, d], [N] -> cross-entropy (see :func:`vocab_parallel_cross_entropy` for keywords)."""
        return vocab_parallel_cross_entropy(self(hidden), targets, self.vocab_start, self.V, self.group, **kw)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d] -> global argmax ids [N]."""
        return vocab_parallel_argmax(self(hidden), self.vocab_start, self.group)

    def topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, d] -> global top-k (values float32, ids)."""
        return vocab_parallel_topk(self(hidden), k, self.vocab_start, self.V, self.group)

    def gather_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> the full float32 logits [..., V] on every rank."""
        return vocab_parallel_gather_logits(self(hidden), self.V, self.group)
