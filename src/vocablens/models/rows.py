"""Rows and tensors of a model that no analysis should trust: never-trained rows (all zeros, or a
large group of bit-identical rows left from the initialization) and NaN/inf weights.

Scans go in chunks, so they never hold a [V, d] copy in float64 or a [numel] int64 temporary, and
their results are kept on the :class:`~vocablens.models.Borders` while the weights are unchanged.
"""

from __future__ import annotations

import torch

from vocablens.errors import NonFiniteWeights
from vocablens.models.pages import read_once


def nonfinite(borders) -> dict[str, int]:
    """Parameters holding NaN or ±inf: ``{name: count}`` (empty for a healthy model). One pass over
    the weights, done once and kept while they are unchanged (in-place edits are noticed)."""
    params = list(borders.model.named_parameters())
    key = ("nonfinite", tuple(p._version for _, p in params))
    if key not in borders._memo:
        bad = {}
        with torch.no_grad():
            for name, p in params:
                if p.is_meta or not p.is_floating_point():
                    continue
                flat = p.reshape(-1)
                # chunks: no [numel] temporaries; a chunk whose sum is finite holds no NaN/inf (either
                # would make the sum NaN or ±inf), so only the others are counted: no per-chunk
                # temporary (a bool chunk per step left ~40 MiB with the C allocator) and 5x faster
                n = sum(0 if bool(torch.isfinite(c.sum())) else int(c.isfinite().logical_not().count_nonzero())
                        for c in read_once(flat.split(2**22)))  # mapped pages go (models.pages)
                if n:
                    bad[name] = n
        for k in [k for k in borders._memo if isinstance(k, tuple) and k[0] == "nonfinite"]:
            del borders._memo[k]  # an older reading of weights edited since
        borders._memo[key] = bad
    return dict(borders._memo[key])

def nonfinite_rows(borders) -> torch.Tensor:
    """int64 ids of vocabulary rows whose embedding or LM-head row holds NaN or ±inf (sorted)."""
    if not nonfinite(borders):
        return torch.zeros(0, dtype=torch.int64)
    rows = (~torch.isfinite(borders.W_E.detach())).any(1)
    if not borders.tied:
        rows |= (~torch.isfinite(borders.W_U.detach())).any(1)
    if borders.b_U is not None:
        rows |= ~torch.isfinite(borders.b_U.detach())
    return rows.nonzero().flatten().cpu()

def check_finite(borders, ids: torch.Tensor | None = None) -> None:
    """Refuse a forward pass whose result a non-finite weight would poison.

    Every block, the final norm and the LM head must be finite (one bad LM-head row changes every
    position's normalization); embedding rows only matter for the tokens in ``ids``.

    Raises:
        NonFiniteWeights: naming the tensor, how many values, and the rows of the matrices.
    """
    bad = nonfinite(borders)
    if not bad:
        return
    emb = {n for n, p in borders.model.named_parameters() if p is borders.W_E}
    rows = nonfinite_rows(borders)
    if set(bad) <= emb and not borders.tied:
        if ids is None or not bool(torch.isin(ids.flatten().cpu(), rows).any()):
            return
    first = sorted(bad)[0]
    where = f"; vocabulary rows {rows.tolist()[:8]}{' ...' if rows.numel() > 8 else ''}" if rows.numel() else ""
    raise NonFiniteWeights(f"the weights hold NaN or inf: {first} has {bad[first]} non-finite values"
                           f"{f' (and {len(bad) - 1} more tensors)' if len(bad) > 1 else ''}{where}; "
                           "the checkpoint is damaged: download or convert it again")


def untrained_rows(W: torch.Tensor, min_group: int = 8) -> torch.Tensor:
    """Bool [V]: rows that look never trained — all zeros, or one of >= ``min_group`` identical rows.

    Args:
        W: [V, d] any float dtype.
    """
    V = W.shape[0]
    out = torch.cat([(W[i:i + 8192] == 0).all(dim=1) for i in range(0, V, 8192)]) if V else (W == 0).all(dim=1)
    # Identical rows: hash each row by two random projections (float64), then confirm exactly.
    g = torch.Generator().manual_seed(0)
    P = torch.randn(W.shape[1], 2, generator=g, dtype=torch.float64)
    Wd = W.detach()
    keys = torch.cat([Wd[i:i + 8192].to("cpu", torch.float64) @ P for i in range(0, V, 8192)])  # O(chunk·d) extra
    _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    big = counts[inverse] >= min_group
    if big.any():
        idx = big.nonzero().flatten()
        for grp in torch.unique(inverse[idx]):
            members = idx[inverse[idx] == grp]
            ref = W[members[0]]
            same = (W[members] == ref).all(dim=1).cpu()  # cpu: members is a host index
            if int(same.sum()) >= min_group:
                out[members[same]] = True
    assert out.shape == (V,)
    return out
