"""Rows and tensors of a model that no analysis should trust: never-trained rows (all zeros, or a
large group of bit-identical rows left from the initialization) and NaN/inf weights.

Scans go in chunks, so they never hold a [V, d] copy in float64 or a [numel] int64 temporary, and
their results are kept on the :class:`~vocablens.models.Borders` while the weights are unchanged.
"""

from __future__ import annotations

import torch

from vocablens.errors import NonFiniteWeights
from vocablens.models.files.pages import read_once
from vocablens.models.quantized_weights import stored_parts


def nonfinite(borders) -> dict[str, int]:
    """Parameters holding NaN or ±inf: ``{name: count}`` (empty for a healthy model). One pass over
    the weights, done once and kept while they are unchanged (in-place edits are noticed)."""
    from vocablens.models.tensor_parallel import is_dtensor, local, sum_sharded

    params = list(borders.model.named_parameters())
    key = ("nonfinite", tuple(p._version for _, p in params))
    if key not in borders._memo:
        counts = []
        with torch.no_grad():
            for name, p in params:
                # a quantized weight: its stored float parts (scales, zero points), where a NaN or inf
                # of its dequantized values comes from (models.quantized_weights); its integers are finite.
                # Tensor parallel: this rank's part (counts summed below)
                parts = [t for t in stored_parts(local(p)) if not t.is_meta and t.is_floating_point()]
                # chunks: no [numel] temporaries; a chunk whose sum is finite holds no NaN/inf (either
                # would make the sum NaN or ±inf), so only the others are counted: no per-chunk
                # temporary (a bool chunk per step stayed resident with the C allocator) and faster
                n = sum(0 if bool(torch.isfinite(c.sum())) else int(c.isfinite().logical_not().count_nonzero())
                        for t in parts for c in read_once(t.reshape(-1).split(2**22)))  # mapped pages go (models.files.pages)
                counts.append(n)
        sharded = [is_dtensor(p) for _, p in params]
        if any(sharded):  # the same on every rank: every rank takes this branch
            counts = sum_sharded(counts, sharded)
        bad = {name: n for (name, _), n in zip(params, counts) if n}
        for k in [k for k in borders._memo if isinstance(k, tuple) and k[0] == "nonfinite"]:
            del borders._memo[k]  # an older reading of weights edited since
        borders._memo[key] = bad
    return dict(borders._memo[key])

def _bad_rows(M: torch.Tensor) -> torch.Tensor:
    """Bool [V]: rows of ``M`` [V, d] (or entries of a [V] bias) holding NaN or ±inf, in chunks of rows;
    a chunk whose sum is finite holds neither (either would make the sum NaN or ±inf), so only the
    others are scanned. A tensor-parallel matrix: each rank scans its rows, the marks are combined."""
    from vocablens.models.tensor_parallel import is_dtensor, local_rows, rows_any

    if M.is_meta:  # a model built from its config holds no values, so none that is not finite
        return torch.zeros(M.shape[0], dtype=torch.bool)
    if is_dtensor(M):
        start, part = local_rows(M)
        return rows_any(_bad_rows(part), start, int(M.shape[0]))
    M = M if M.dim() == 2 else M[:, None]
    out = torch.zeros(M.shape[0], dtype=torch.bool)
    for a in range(0, M.shape[0], 8192):
        c = M[a:a + 8192].detach()
        if not bool(torch.isfinite(c.sum())):
            out[a:a + c.shape[0]] = (~torch.isfinite(c)).reshape(c.shape[0], -1).any(1).cpu()
    return out


def nonfinite_rows(borders) -> torch.Tensor:
    """int64 ids of vocabulary rows whose embedding or LM-head row (or head bias) holds NaN or ±inf (sorted).

    Reads the two matrices only (one chunked pass each; kept while they are unchanged), not the
    whole model: ``neighbors`` needs the rows, not the blocks (a whole-model scan would read every
    block)."""
    W_U, b_U = borders._head_tensors()  # not borders.unembedding: its real-token mask is built from these rows
    key = ("nonfinite_rows", borders.W_E._version, W_U._version, None if b_U is None else b_U._version)
    if key not in borders._memo:
        rows = _bad_rows(borders.W_E)
        if not borders.tied:
            rows |= _bad_rows(W_U)
        if b_U is not None:
            rows |= _bad_rows(b_U.detach())
        borders._memo[key] = rows.nonzero().flatten()
    return borders._memo[key].clone()


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

    One pass over W in chunks: each row's key is its dot with one fixed random float32 direction,
    computed elementwise then summed along the row (the same operations for every row, so bit-identical
    rows get bit-identical keys; a BLAS matrix-vector product gave the last row of an odd-sized
    block another rounding, measured). A zero row has key 0 exactly. Rows that share a key with >= ``min_group`` others, or whose key is 0,
    are then confirmed by exact comparison, so a key collision never marks a trained row. (It replaces
    float64 copies, a GEMM and ``unique(dim=0)`` over two keys, several times slower.)

    Args:
        W: [V, d] any float dtype.
    """
    V, d = W.shape
    out = torch.zeros(V, dtype=torch.bool)
    if V == 0:
        return out
    g = torch.Generator().manual_seed(0)
    p = (torch.rand(d, generator=g, dtype=torch.float64) + 0.5).to(torch.float32).to(W.device)  # no zero weight
    Wd = W.detach()
    keys = torch.empty(V, dtype=torch.float32, device=W.device)
    for i in range(0, V, 8192):
        keys[i:i + 8192] = (Wd[i:i + 8192].float() * p).sum(1)
    keys = keys.cpu()
    zero = (keys == 0).nonzero().flatten()
    if zero.numel():
        out[zero] = (Wd[zero.to(W.device)] == 0).all(dim=1).cpu()
    _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    big = counts[inverse] >= min_group
    if big.any():
        idx = big.nonzero().flatten()
        for grp in torch.unique(inverse[idx]):
            members = idx[inverse[idx] == grp]
            ref = Wd[members[0]]
            same = (Wd[members.to(W.device)] == ref).all(dim=1).cpu()
            if int(same.sum()) >= min_group:
                out[members[same]] = True
    return out
