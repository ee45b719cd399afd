"""Deterministic top-k over the vocabulary, per tile and merged across tiles or ranks.

The values equal ``torch.topk``'s; among equal values the lowest id comes first (the order of
``torch.sort(descending=True, stable=True)``), so a result does not depend on how the vocabulary
was tiled or sharded. NaN counts as the largest value, as in torch.topk / torch.sort.
"""

from __future__ import annotations

import torch


def topk_lowest_id(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim of ``z [..., v]`` with ties broken by the lowest index.

    Returns:
        ``(values [..., k], ids [..., k] int64)``: the values of torch.topk, the ids of a stable
        descending sort. Only the candidates >= the k-th value are sorted unless ties are heavy.
    """
    vals, idx = torch.topk(z, k, dim=-1)
    thr = vals[..., -1:]
    cand = (z >= thr) | torch.isnan(z)
    if bool((cand.sum(-1) == k).all()):
        # no tie crosses the k-th value: the candidates are exactly torch.topk's k entries, so only
        # they are ordered (by id, then stably by value), never the whole [..., v] row
        order = torch.argsort(idx, dim=-1)
        v, i = vals.gather(-1, order), idx.gather(-1, order)
        sv, si = torch.sort(v, dim=-1, descending=True, stable=True)
        return sv, i.gather(-1, si)
    sv, si = torch.sort(z, dim=-1, descending=True, stable=True)
    return sv[..., :k].clone(), si[..., :k].clone()


def topk_by_blocks(z: torch.Tensor, k: int, block: int = 64,
                   block_max: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(z, k, dim=1)`` of float32 rows ``z [R, C]``, reading ``z`` once.

    The k blocks of ``block`` columns with the largest maxima hold every top-k value, so only those
    k·block candidates (plus the C mod block tail columns) are ranked. ``block_max`` [R, C // block]
    (the block maxima, when the caller already has them) saves that one pass. Small rows
    (k·block·4 > C) go straight to torch.topk.

    Returns:
        ``(values [R, k], ids [R, k] int64)``, the values of torch.topk.
    """
    R, C = z.shape
    nb = C // block
    if k * block * 4 > C:
        return torch.topk(z, k, dim=1)
    if block_max is None:
        block_max = z[:, : nb * block].reshape(R, nb, block).amax(2)
    bi = torch.topk(block_max, k, dim=1).indices  # [R, k]
    idx = (bi[:, :, None] * block + torch.arange(block, device=z.device)).view(R, k * block)
    if C > nb * block:  # the tail columns are always candidates
        idx = torch.cat([idx, torch.arange(nb * block, C, device=z.device).expand(R, -1)], 1)
    v, j = torch.topk(z.gather(1, idx), k, dim=1)
    return v, idx.gather(1, j)


def merge_topk(v1: torch.Tensor, i1: torch.Tensor, v2: torch.Tensor, i2: torch.Tensor,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two top-k lists ``(values [..., k1], ids [..., k1])`` and ``(.., k2)`` into the top-k of
    their union, lowest id first among equal values (ids may interleave)."""
    v = torch.cat([v1, v2], -1)
    i = torch.cat([i1, i2], -1)
    order = torch.argsort(i, dim=-1, stable=True)  # by id, so a stable sort keeps the lowest id first on ties
    v = v.gather(-1, order)
    i = i.gather(-1, order)
    sv, si = torch.sort(v, dim=-1, descending=True, stable=True)
    k = min(k, v.shape[-1])
    return sv[..., :k], i.gather(-1, si[..., :k])


__all__ = ["merge_topk", "topk_by_blocks", "topk_lowest_id"]
