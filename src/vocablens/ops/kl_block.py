"""The statistics kernel of :func:`vocablens.ops.kl_readout`: one cache-sized block of lens logits.

A chunk's logits ``z [rows, V]`` (token-major: row j·S + s is token j at layer s) are read in blocks
of :data:`STATS_ROWS` rows; each block is one call of :func:`block_stats`, which writes that block's
per-row statistics (max, exp-sum, Σ p (z - m), Σ e (z - m), top-k, target, rank, max |q - p|) into a
:class:`ReadoutRows`. The passes over a [16, V] tile: block maxima, shift, exp, exp-sum, one GEMV per
token against its reference, the exp-weighted sum for the entropy; top-k and rank read only the few
64-column blocks that can hold an answer (when the target is near the top).

Numerics: every sum is float32 over shifted logits ``z - m`` (results depend on logit differences
only); exp(z - m) is computed as exp2((z - m) · log2 e) (:data:`LOG2_E`).
"""

from __future__ import annotations

import torch

from vocablens.ops.topk import topk_by_blocks

#: rows of logits whose statistics are read at a time: [16, V] float32 is 3 MiB at V = 49,152, so
#: the block stays in cache through its passes; read [rows, V]-at-a-time, each pass would stream the
#: whole chunk through memory again (measurement: docs/performance-ops.md).
STATS_ROWS = 16
#: tokens whose references [n, V] are normalized together: blocks of rows never straddle two such
#: groups.
PAIR_TOKENS = 8
#: exp(y) of shifted logits y <= 0 is computed as 2^max(y·log2 e, -126) (:func:`exp_shifted`):
#: torch's exp is much slower where its results are subnormal (y below -87; a layer-0 lens row has
#: two thirds of its logits there), and the clamp keeps far-tail rows on exp2's fast path
#: (measurement: docs/performance-ops.md). Accuracy: y·log2 e is rounded (relative 6e-8), so a term is off
#: by |y|·4e-8 relative; each clamped term is below 1.2e-38, far under the half-ulp of
#: s = Σ exp(y) >= 1. The reference side (:func:`reference_chunk`) uses the same function.
LOG2_E = 1.4426950408889634
EXP2_FLOOR = -126.0
#: width of the column blocks whose maxima drive the top-k and the rank.
COL_BLOCK = 64


class ReadoutRows:
    """Per-row outputs of :func:`vocablens.ops.kl_readout` over all N·S token-major rows, filled
    block by block: ``m`` (row max), ``s`` (Σ exp(z - m)), ``pz`` (Σ p (z - m)), and when asked ``ez``
    (Σ exp(z - m)(z - m)), ``dp`` (max |q - p|), ``tv``/``ti`` (top-k values and ids), ``zt``
    (z_target - m), ``rk`` (rank of the target)."""

    def __init__(self, R: int, top_k: int, target: bool, rank: bool, entropy: bool, dp: bool, dev) -> None:
        f32 = dict(dtype=torch.float32, device=dev)
        self.m, self.s, self.pz = torch.empty(R, 1, **f32), torch.empty(R, 1, **f32), torch.empty(R, **f32)
        self.ez = torch.empty(R, 1, **f32) if entropy else None
        self.dp = torch.empty(R, **f32) if dp else None
        self.tv = torch.empty(R, top_k, **f32) if top_k else None
        self.ti = torch.empty(R, top_k, dtype=torch.int64, device=dev) if top_k else None
        self.zt = torch.empty(R, 1, **f32) if target else None
        self.rk = torch.empty(R, **f32) if rank else None


def exp_shifted(y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """exp(y) of shifted logits ``y <= 0`` [r, V] into ``out``, as 2^max(y·log2 e, -126) (see :data:`LOG2_E`)."""
    return torch.exp2(torch.mul(y, LOG2_E, out=out).clamp_min_(EXP2_FLOOR), out=out)


def reference_chunk(ref: torch.Tensor, pbuf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference logits [n, V] -> (p [n, V] float32 in ``pbuf``, Σ_v p log p [n]).

    The same operations as the lens side of :func:`block_stats` (shift, exp2 of y·log2 e, sums of
    products): a lens row equal to its reference gives KL 0 up to float32 rounding."""
    n, V = ref.shape
    r = ref.float().clone() if ref.dtype == torch.float32 else ref.float()
    m = r.amax(1, keepdim=True)
    r.sub_(m).clamp_min_(torch.finfo(torch.float32).min)  # -inf (masked) columns: p = 0, p·r = 0
    p = pbuf[: n * V].view(n, V)
    torch.exp2(torch.mul(r, LOG2_E, out=p), out=p)  # unclamped: masked columns must give p = 0
    s = p.sum(1, keepdim=True)
    p.div_(s)
    plogp = r.mul_(p).sum(1) - s.log().view(n)  # Σ p r - log s, r = ref - max
    return p, plogp


def _rank(z: torch.Tensor, zt: torch.Tensor, bm: torch.Tensor | None, cols: int, e: torch.Tensor) -> torch.Tensor:
    """[r] float32 count of the first ``cols`` columns of ``z [r, V]`` above ``zt [r, 1]``.

    With the block maxima ``bm [r, V/64]`` (and ``cols == V``), only the 64-column blocks whose maximum
    exceeds the target are compared; else (or when many are) one compare pass into the scratch ``e``."""
    r = z.shape[0]
    if bm is not None:
        hot = bm > zt  # [r, nb]: blocks with at least one column above the target
        n_hot = int(hot.sum())
        if n_hot * 8 <= hot.numel():
            out = torch.zeros(r, dtype=torch.float32, device=z.device)
            if n_hot:
                row, blk = hot.nonzero(as_tuple=True)
                cand = z.view(r, -1, COL_BLOCK)[row, blk]  # [n_hot, 64]
                out.index_add_(0, row, (cand > zt[row]).sum(1, dtype=torch.float32))
            return out
    return torch.sum(torch.gt(z[:, :cols], zt, out=e[:, :cols]), 1)


def block_stats(z: torch.Tensor, p: torch.Tensor, tokens: list[tuple[int, int, int]], ebuf: torch.Tensor,
                o: ReadoutRows, g0: int, cols: int, tgt: torch.Tensor | None) -> None:
    """Statistics of one cache-sized block of logit rows ``z [r, V]`` (overwritten by z - m) into rows
    ``g0 .. g0+r`` of ``o``.

    Args:
        z: [r, V] float32 logits (after the head transform).
        p: [n, V] float32 reference probabilities of the block's pair group.
        tokens: ``(i0, i1, j)``: rows i0..i1 of the block belong to token j of ``p``.
        ebuf: scratch of >= r·V float32.
        o: the outputs; g0: the block's first global row.
        cols: top-k and rank read the first ``cols`` columns.
        tgt: [r] int64 target ids, or None.
    """
    r, V = z.shape
    sl = slice(g0, g0 + r)
    e = ebuf[: r * V].view(r, V)
    bm = z.view(r, V // COL_BLOCK, COL_BLOCK).amax(2) if V % COL_BLOCK == 0 else None
    torch.amax(z if bm is None else bm, 1, keepdim=True, out=o.m[sl])
    m = o.m[sl]
    if o.tv is not None:
        o.tv[sl], o.ti[sl] = topk_by_blocks(z[:, :cols], o.tv.shape[1], block_max=bm if cols == V else None)
    if o.zt is not None:
        zt = z.gather(1, tgt[:, None])
        if o.rk is not None:
            o.rk[sl] = _rank(z, zt, bm if cols == V else None, cols, e)
        torch.sub(zt, m, out=o.zt[sl])
    z.sub_(m)  # shifted logits z - m: every sum depends on logit differences only
    for i0, i1, j in tokens:  # Σ_v p (z - m): products with each token's own reference, then sums
        torch.mul(z[i0:i1], p[j], out=e[i0:i1])
    torch.sum(e, 1, out=o.pz[sl])
    exp_shifted(z, e)
    torch.sum(e, 1, keepdim=True, out=o.s[sl])
    if o.ez is not None:  # Σ_v e (z - m), for H(q) = log s - Σ e (z - m) / s (z is not needed after this)
        torch.sum(z.mul_(e), 1, keepdim=True, out=o.ez[sl])
    if o.dp is not None:
        e.div_(o.s[sl])
        rows = torch.cat([torch.full((i1 - i0,), j, dtype=torch.int64, device=z.device) for i0, i1, j in tokens])
        torch.amax(e.sub_(p.index_select(0, rows)).abs_(), 1, out=o.dp[sl])


__all__ = ["COL_BLOCK", "EXP2_FLOOR", "LOG2_E", "exp_shifted", "PAIR_TOKENS", "STATS_ROWS", "ReadoutRows", "block_stats", "reference_chunk"]
