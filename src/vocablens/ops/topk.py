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


__all__ = ["merge_topk", "topk_lowest_id"]
