"""The lens statistics of :func:`vocablens.ops.kl_readout` with the head's rows split over ranks.

Under tensor parallelism (``vocablens.load(spec, tp=True)``) every rank holds the rows
``[vocab_start, vocab_start + V_r)`` of W_U and reads the same hidden states. Each rank computes its
[rows, V_r] logits, and the statistics over the global V are combined from per-rank maxima and sums
(Megatron-LM's vocab-parallel cross-entropy, Shoeybi et al. 2019, arXiv 1909.08053 §3): the
logsumexp from an all-reduce MAX and SUM, KL(reference ‖ q) = Σ p (r - z) - lse_r + lse from a SUM,
the entropy lse - Σ q z from a SUM, the target's logit and rank from SUMs, the top-k merged across
ranks (:func:`~vocablens.ops.vocab_parallel.functional.vocab_parallel_topk`), max |q - p| from a MAX.
No rank ever holds [rows, V]; every rank returns the same :class:`~vocablens.ops.kl.KLReadout`,
equal to one process's up to float32 rounding. All ranks must call it together (collectives).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import transform_logits
from vocablens.ops.kl import KLReadout
from vocablens.ops.vocab_parallel.comm import all_reduce
from vocablens.ops.vocab_parallel.functional import check_shard, vocab_parallel_topk

#: float32 bytes of one chunk's local [rows, V_r] logits
CHUNK_BYTES = 96 * 2**20


def _max(t: torch.Tensor, group) -> torch.Tensor:
    return all_reduce(t.contiguous(), dist.ReduceOp.MAX, group)


def _lse(z: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(m, s, e)`` of local logits z [..., V_r]: the global row max m, the global Σ exp(z - m) s, and
    this rank's exp(z - m) e."""
    m = _max(z.amax(-1), group)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row of -inf everywhere: no NaN
    e = (z - m[..., None]).exp()
    return m, all_reduce(e.sum(-1), group=group), e


def _chunk(z: torch.Tensor, ref: torch.Tensor, start: int, V: int, cols: int, targets, rank: bool, top_k: int,
           entropy: bool, max_abs_dp: bool, group) -> dict:
    """Statistics of z [n, S, V_r] (lens logits) against ref [n, V_r] (reference logits): tensors [n, S]."""
    n, S, Vr = z.shape
    m, s, e = _lse(z, group)
    lse = m + s.log()
    mr, sr, er = _lse(ref, group)
    p = er / sr[:, None]
    cross = torch.where(p[:, None] > 0, p[:, None] * (ref[:, None] - z), torch.zeros((), device=z.device))
    out = {"lse": lse, "kl": (all_reduce(cross.sum(-1), group=group) - (mr + sr.log())[:, None] + lse).clamp_min(0.0)}
    if entropy:
        ez = torch.where(e > 0, e * (z - m[..., None]), torch.zeros((), device=z.device)).sum(-1)
        out["entropy"] = s.log() - all_reduce(ez, group=group) / s
    gid = start + torch.arange(Vr, device=z.device)
    if top_k:
        zc = z.masked_fill(gid >= cols, -torch.inf).reshape(n * S, Vr)
        v, i = vocab_parallel_topk(zc, top_k, start, V, group)
        out["topk_logprobs"], out["topk_ids"] = (v.view(n, S, -1) - lse[..., None]), i.view(n, S, -1)
    if targets is not None:
        t = targets.to(z.device)
        mine = (t >= start) & (t < start + Vr)
        zt = torch.where(mine[:, None], z.gather(2, (t - start).clamp(0, Vr - 1)[:, None, None].expand(n, S, 1))[..., 0],
                         torch.zeros((), device=z.device))
        zt = all_reduce(zt, group=group)
        out["target_logprob"] = zt - lse
        if rank:
            above = ((z > zt[..., None]) & (gid < cols)).sum(-1)
            out["target_rank"] = all_reduce(above.to(torch.int64), group=group)
    if max_abs_dp:
        out["max_abs_dp"] = _max((e / s[..., None] - p[:, None]).abs().amax(-1), group)
    return out


def _readout(logits_of, N: int, S: int, Vr: int, reference: torch.Tensor, start: int, V: int, *, targets,
             rank: bool, top_k: int, topk_cols, entropy: bool, max_abs_dp: bool, group) -> KLReadout:
    """The chunk loop over tokens: ``logits_of(a, b)`` -> local logits [b - a, S, V_r] float32."""
    cols = V if topk_cols is None else int(topk_cols)
    if not 1 <= cols <= V:
        raise BadInput(f"topk_cols must be in [1, {V}]; got {topk_cols}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= cols:
        raise BadInput(f"top_k must be an int in [0, {cols}]; got {top_k!r}")
    if rank and targets is None:
        raise BadInput("rank needs targets")
    if tuple(reference.shape) != (N, Vr):
        raise ShapeMismatch(f"reference logits must be this rank's [N, V_r]=({N}, {Vr}); got {tuple(reference.shape)}")
    step = max(1, CHUNK_BYTES // (4 * S * max(1, Vr)))
    parts: list[dict] = []
    for a in range(0, N, step):  # the same chunks on every rank: N, S and the budget agree
        b = min(N, a + step)
        parts.append(_chunk(logits_of(a, b), reference[a:b].float(), start, V, cols,
                            None if targets is None else targets[a:b].long(), rank, top_k, entropy, max_abs_dp, group))
    got = {k: torch.cat([p[k] for p in parts]).transpose(0, 1).contiguous() for k in parts[0]}  # [S, N, ...]
    return KLReadout(**got)


@torch.no_grad()
def vocab_parallel_kl_readout(hidden: torch.Tensor, W_shard: torch.Tensor, reference: torch.Tensor, vocab_start: int,
                              V: int, *, bias: torch.Tensor | None = None, logit_scale: float = 1.0,
                              softcap: float | None = None, targets: torch.Tensor | None = None, rank: bool = False,
                              top_k: int = 0, topk_cols: int | None = None, entropy: bool = False,
                              max_abs_dp: bool = False, group=None) -> KLReadout:
    """:func:`vocablens.ops.kl_readout` with W_U's rows split over the ranks of ``group`` (module docstring).

    Args:
        hidden: [S, N, d] (or [N, d]) head inputs, the same on every rank.
        W_shard: [V_r, d] this rank's rows of W_U, starting at global row ``vocab_start``; ``bias``
            its [V_r] bias. reference: [N, V_r] this rank's columns of the reference logits.
        V: the global vocabulary. Others: as :func:`~vocablens.ops.kl_readout` (``targets`` are global ids).

    Returns:
        :class:`~vocablens.ops.kl.KLReadout` [S, N] ([N] for a 2-D ``hidden``), the same on every rank.
        Memory per rank: one [rows, V_r] float32 chunk of :data:`CHUNK_BYTES`.

    Raises:
        ShapeMismatch: shapes disagree. BadInput: the shard outside [0, V), top_k / topk_cols out of
            range, rank without targets.
    """
    two = hidden.dim() == 2
    H = hidden[None] if two else hidden
    if H.dim() != 3 or H.shape[-1] != W_shard.shape[1]:
        raise ShapeMismatch(f"hidden must be [S, N, d] with d={W_shard.shape[1]}; got {tuple(hidden.shape)}")
    start, V = check_shard("W_shard", int(W_shard.shape[0]), vocab_start, V)
    S, N, _ = H.shape
    b = None if bias is None else bias.to(W_shard.dtype)

    def logits_of(a: int, c: int) -> torch.Tensor:
        z = torch.nn.functional.linear(H[:, a:c].transpose(0, 1).to(W_shard.dtype), W_shard, b).float()
        return transform_logits(z, logit_scale, softcap, inplace=True)

    r = _readout(logits_of, N, S, int(W_shard.shape[0]), reference, start, V, targets=targets, rank=rank,
                 top_k=top_k, topk_cols=topk_cols, entropy=entropy, max_abs_dp=max_abs_dp, group=group)
    return KLReadout(**{k: (None if v is None else v[0]) for k, v in r.__dict__.items()}) if two else r


@torch.no_grad()
def vocab_parallel_logits_readout(logits: torch.Tensor, reference: torch.Tensor, vocab_start: int, V: int, *,
                                  targets: torch.Tensor | None = None, rank: bool = False, top_k: int = 0,
                                  topk_cols: int | None = None, entropy: bool = False, max_abs_dp: bool = False,
                                  group=None) -> KLReadout:
    """:func:`vocablens.ops.logits_readout` of this rank's columns ``logits`` [N, V_r] (after the
    head's transform) against ``reference`` [N, V_r]: tensors [N], the same on every rank.

    Raises:
        ShapeMismatch, BadInput: as :func:`vocab_parallel_kl_readout`.
    """
    if logits.dim() != 2:
        raise ShapeMismatch(f"logits must be [N, V_r]; got {tuple(logits.shape)}")
    start, V = check_shard("logits", int(logits.shape[1]), vocab_start, V)
    N, Vr = (int(x) for x in logits.shape)
    r = _readout(lambda a, c: logits[a:c, None].float(), N, 1, Vr, reference, start, V, targets=targets,
                 rank=rank, top_k=top_k, topk_cols=topk_cols, entropy=entropy, max_abs_dp=max_abs_dp, group=group)
    return KLReadout(**{k: (None if v is None else v[0]) for k, v in r.__dict__.items()})


__all__ = ["CHUNK_BYTES", "vocab_parallel_kl_readout", "vocab_parallel_logits_readout"]
