"""The per-chunk passes of the chunked cross-entropy (:mod:`vocablens.ops.cross_entropy`).

* :func:`fused_chunk` — one pass, full vocabulary rows, loss and gradients together (Liger-Kernel's
  fused linear cross-entropy, Hsu et al. 2024, arXiv 2410.10989, §3.2).
* :func:`lse_pass` — the forward of the two-pass strategy: per vocabulary tile, the row max and
  log Σ exp(z - max) (merged tile by tile; Cut Cross-Entropy, Wijmans et al. 2024, arXiv 2411.09009, §4).
* :func:`grad_pass` — its backward: each tile recomputed once and turned into the gradient in place.

Exactness: the per-token loss is ``log s + (1-a)·(m - z_t) - (a/V)·Σ_j (z_j - m) + λ·lse²``, with m
the row max and ``log s = log Σ_j exp(z_j - m)`` read at the argmax (so it never underflows): it
depends only on logit differences (four equal logits offset by 1e8 give log 4, a target 104 nats
below the max gives 104), whether or not gradients are on. The softmax of the gradient is
exp((z - m) - log s), again from differences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.logit_transform import transform_logits_backward
from vocablens.ops.chunking import (
    ChunkBuffers, fused_inplace, logits_into, merge_row_stats, mm_low, safe_max, tile_row_stats,
)


@dataclass(frozen=True)
class CEConfig:
    """The settings of one :func:`~vocablens.ops.cross_entropy.linear_cross_entropy` call.

    ``count``: non-ignored targets (the divisor of "mean"); ``n_tok`` x ``n_voc``: one chunk; V: vocabulary rows.
    """

    reduction: str
    ignore_index: int
    label_smoothing: float
    z_loss: float
    softcap: float | None
    logit_scale: float
    n_tok: int
    n_voc: int
    count: int
    V: int


def token_loss(m: torch.Tensor, log_s: torch.Tensor, zt: torch.Tensor, zsum: torch.Tensor | None,
               valid: torch.Tensor, cfg: CEConfig) -> torch.Tensor:
    """Per-token loss [n] (float32; 0 on ignored rows) from the row max m, log s, the target logit
    and (label smoothing) Σ_j z_j in float64; see the module docstring for the formula."""
    a = cfg.label_smoothing
    ms = safe_max(m)
    loss = log_s
    if a < 1.0:
        loss = loss + (1.0 - a) * (ms - zt)
    if zsum is not None:
        loss = loss - (a / cfg.V) * (zsum - cfg.V * ms.double()).float()
    if cfg.z_loss:
        lse = ms + log_s
        loss = loss + cfg.z_loss * lse * lse
    return torch.where(valid, loss, torch.zeros_like(loss))


def _softmax_to_grad(p: torch.Tensor, y: torch.Tensor | None, col: torch.Tensor, hit: torch.Tensor,
                     coef: torch.Tensor | None, cfg: CEConfig) -> torch.Tensor:
    """Turn the softmax slice ``p [n, v]`` into d loss / d raw logits in place:
    G = c·p - (1-a)·onehot - a/V (c = 1 + 2λ·lse), times the softcap's derivative (from the
    transformed logits ``y``). ``col`` [n]: the target's column in this slice (any valid index
    where ``hit`` [n] bool is False). The logit scale is applied by the caller on the [n] side."""
    a = cfg.label_smoothing
    if coef is not None:
        p.mul_(coef[:, None])
    if a > 0:
        p.sub_(a / cfg.V)
    p.scatter_add_(1, col[:, None], (-(1.0 - a) * hit.to(torch.float32))[:, None])
    if y is not None:
        transform_logits_backward(p, y, 1.0, cfg.softcap, inplace=True)
    return p


def _keep_transformed(z: torch.Tensor, cfg: CEConfig, bufs: ChunkBuffers) -> torch.Tensor | None:
    """A copy of the transformed logits in ``bufs.aux`` when the softcap's derivative will need them."""
    if cfg.softcap is None:
        return None
    y = bufs.view(bufs.aux, *z.shape)
    y.copy_(z)
    return y


def _row_scale(rs: torch.Tensor, cfg: CEConfig) -> torch.Tensor:
    """The per-row factor of the weight/hidden GEMMs: ``rs`` times d logits / d (scaled) raw output,
    i.e. the logit scale's part of :func:`transform_logits_backward`, applied on the [n] side
    instead of the [n, v] tile."""
    return transform_logits_backward(rs.clone(), rs, cfg.logit_scale, None, inplace=True)


def fused_chunk(h_c, weight, bias, tc, valid, rs, cfg: CEConfig, bufs: ChunkBuffers, gh_c, gW32, gb32):
    """One-pass loss and gradients of one token chunk with full vocabulary rows (scalar reductions).

    One GEMM into the reused float32 [n, V] buffer, the row max and argmax, one fused in-place
    softmax, log s = -log p[argmax], the one-hot correction by a scatter, then the grad_hidden and
    grad_W GEMMs on the same buffer. ``rs`` [n] (1/count or 1; 0 on ignored rows) is applied on the
    [n, d] side. Returns the per-token losses [n] (float32); gradients are added into gh_c [n, d],
    gW32 [V, d] and gb32 [V] (float32 accumulators; any may be None).
    """
    z = logits_into(h_c, weight, bias, 0, cfg.V, cfg.logit_scale, cfg.softcap, bufs)
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    zt = z.gather(1, tsafe[:, None]).squeeze(1)
    zsum = z.sum(1, dtype=torch.float64) if cfg.label_smoothing > 0 else None
    y = _keep_transformed(z, cfg, bufs)
    m, am = torch.max(z, 1)
    fused_inplace(z, "softmax")
    log_s = -torch.log(z.gather(1, am[:, None]).squeeze(1))
    loss = token_loss(m, log_s, zt, zsum, valid, cfg)
    coef = (1.0 + 2.0 * cfg.z_loss * (safe_max(m) + log_s)) if cfg.z_loss else None
    _softmax_to_grad(z, y, tsafe, valid, coef, cfg)
    rs = _row_scale(rs, cfg)
    if gb32 is not None:
        gb32 += torch.mv(z.t(), rs)
    if gh_c is not None:
        gh_c.copy_(mm_low(z, weight, bufs).float().mul_(rs[:, None]))
    if gW32 is not None:
        gW32.addmm_(z.t(), h_c.float() * rs[:, None])
    return loss


def lse_pass(h_c, weight, bias, tc, valid, cfg: CEConfig, bufs: ChunkBuffers):
    """Pass 1 over the vocabulary tiles of one token chunk.

    Returns ``(m, log_s, zt, zsum)``: row max [n], log Σ exp(z - m) [n], the target logit [n]
    (float32) and Σ_j z_j [n] in float64 (label smoothing only, else None). Per tile: one GEMM into
    the reused buffer, the tile's (max, log s) from a fused in-place log-softmax, merged with
    :func:`~vocablens.ops.chunking.merge_row_stats`.
    """
    n, dev = h_c.shape[0], h_c.device
    m = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
    log_s = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
    zt = torch.zeros(n, dtype=torch.float32, device=dev)
    zsum = torch.zeros(n, dtype=torch.float64, device=dev) if cfg.label_smoothing > 0 else None
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    for v0 in range(0, cfg.V, cfg.n_voc):
        v1 = min(cfg.V, v0 + cfg.n_voc)
        z = logits_into(h_c, weight, bias, v0, v1, cfg.logit_scale, cfg.softcap, bufs)
        if zsum is not None:
            zsum += z.sum(1, dtype=torch.float64)
        inside = valid & (tsafe >= v0) & (tsafe < v1)
        zt = torch.where(inside, z.gather(1, (tsafe - v0).clamp(0, v1 - v0 - 1)[:, None]).squeeze(1), zt)
        m_t, ls_t = tile_row_stats(z)
        m, log_s = (m_t, ls_t) if v1 - v0 == cfg.V else merge_row_stats(m, log_s, m_t, ls_t)
    return m, log_s, zt, zsum


def grad_pass(h_c, weight, bias, tc, valid, m, log_s, rs, cfg: CEConfig, bufs: ChunkBuffers,
              gh_c, gW, gW_acc, gb32) -> None:
    """Pass 2 over the vocabulary tiles of one token chunk: gradients, given (m, log s) of pass 1.

    Per tile: recompute the logits, p = exp((z - m) - log s) in place, the gradient of
    :func:`_softmax_to_grad`, then grad_h += G W_tile, grad_W[tile] (+)= Gᵀ (rs·h), grad_b[tile] += Gᵀ rs.
    ``rs`` [n] is the per-row scale (1/count, upstream grads, 0 for ignored rows), applied on the
    small [n, d] side. Each weight-gradient tile is one GEMM over the whole token chunk (K = n),
    accumulated in float32 (``gW_acc``) or written straight into ``gW`` when there is one chunk.
    """
    rs = _row_scale(rs, cfg)
    hs = h_c.float() * rs[:, None]
    gh32 = None
    if gh_c is not None:
        gh32 = gh_c if gh_c.dtype == torch.float32 else torch.zeros(gh_c.shape, dtype=torch.float32, device=h_c.device)
    ms = safe_max(m)
    coef = (1.0 + 2.0 * cfg.z_loss * (ms + log_s)) if cfg.z_loss else None
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    for v0 in range(0, cfg.V, cfg.n_voc):
        v1 = min(cfg.V, v0 + cfg.n_voc)
        z = logits_into(h_c, weight, bias, v0, v1, cfg.logit_scale, cfg.softcap, bufs)
        y = _keep_transformed(z, cfg, bufs)
        z.sub_(ms[:, None]).sub_(log_s[:, None]).exp_()  # softmax slice p, from differences only
        inside = valid & (tsafe >= v0) & (tsafe < v1)
        _softmax_to_grad(z, y, (tsafe - v0).clamp(0, v1 - v0 - 1), inside, coef, cfg)
        if gh32 is not None:
            gh32.add_(mm_low(z, weight[v0:v1], bufs))
        if gW is not None:
            if gW_acc is not None:
                gW_acc[v0:v1].addmm_(z.t(), hs)
            elif gW.dtype == torch.float32:
                torch.mm(z.t(), hs, out=gW[v0:v1])
            else:
                gW[v0:v1].copy_(torch.mm(z.t(), hs))
        if gb32 is not None:
            gb32[v0:v1] += torch.mv(z.t(), rs)
    if gh32 is not None:
        gh32.mul_(rs[:, None])
        if gh32 is not gh_c:
            gh_c.copy_(gh32)


__all__ = ["CEConfig", "fused_chunk", "grad_pass", "lse_pass", "token_loss"]
