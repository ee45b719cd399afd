"""Log-probabilities of logit rows already in memory: the one place outside ``ops`` / ``models``
code normalizes scores over the vocabulary.

Callers that hold a block of complete logit rows (a few generated positions, one streamed block of
the head) read them through :func:`row_logprobs` / :func:`row_top1_prob`. Callers holding a model's
[T, V] output logits that need float64 statistics of them (the surgery verifications: changes of
1e-7 nats, below float32's resolution) use :func:`row_logsumexp`, :func:`row_logprobs_at`,
:func:`row_kl` and :func:`row_max_abs_logprob_diff`, which widen one block of rows at a time and
never form a [T, V] float64 copy. Callers with hidden states use :func:`vocablens.ops.token_logprobs`
/ :func:`vocablens.ops.kl_readout`, which never form [N, V] logits at all.
"""

from __future__ import annotations

import torch

from vocablens.errors import ShapeMismatch
from vocablens.ops._checks import check_float


def row_logprobs(z: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None,
                 inplace: bool = False) -> torch.Tensor:
    """Logits z [..., V, ...] -> log-probabilities (nats) over ``dim``: ``z - logsumexp(z, dim)``.

    Args:
        z: logits, any float dtype; -inf entries (masked rows) stay -inf.
        dim: the vocabulary dimension.
        dtype: compute and return in this dtype (e.g. torch.float64 where changes below float32's
            resolution are measured); None keeps z's dtype.
        inplace: overwrite z (only when no dtype change is asked; saves one [..., V] buffer).

    Returns:
        log-probs, z's shape, ``dtype`` (or z's).
    """
    if dtype is not None and z.dtype != dtype:
        z, inplace = z.to(dtype), True
    lse = torch.logsumexp(z, dim, keepdim=True)
    return z.sub_(lse) if inplace else z - lse


def row_softmax(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Logits z [..., n, ...] -> probabilities over ``dim`` (torch's fused softmax, z's dtype), for a
    block of rows already in memory (the candidate rows of an optimizer's working set)."""
    return torch.softmax(z, dim)


def row_top1_prob(z: torch.Tensor) -> torch.Tensor:
    """Logits z [..., V] -> probability of each row's most likely entry [...], z's dtype:
    ``exp(max z - logsumexp z)`` (no [..., V] probabilities formed)."""
    return torch.exp(z.amax(-1) - torch.logsumexp(z, -1))


#: bytes of one block of rows widened to the accumulation dtype by the row statistics below (8 MiB:
#: 21 rows of V = 49,152 in float64), so a [T, V] float64 copy of the logits never exists
ROW_BLOCK_BYTES = 8 * 2**20


def _check_rows(name: str, z: torch.Tensor) -> None:
    check_float(name, z)
    if z.dim() != 2 or 0 in z.shape:
        raise ShapeMismatch(f"{name} must be non-empty logits [T, C]; got {tuple(z.shape)}")


def _blocks(z: torch.Tensor, dtype: torch.dtype | None, block_bytes: int | None):
    """``(a, b)`` row ranges of z [T, C] whose widened copy fits ``block_bytes``."""
    item = torch.empty((), dtype=dtype or z.dtype).element_size()
    n = max(1, int(block_bytes or ROW_BLOCK_BYTES) // (item * z.shape[1]))
    return [(a, min(z.shape[0], a + n)) for a in range(0, z.shape[0], n)]


def _columns(zb: torch.Tensor, cols) -> torch.Tensor:
    """The columns ``cols`` of a block: None (all), an int n (the first n), or 1-D ids (gathered)."""
    if cols is None:
        return zb
    if isinstance(cols, int):
        return zb[:, :cols]
    return zb.index_select(1, cols.to(zb.device))


def row_logsumexp(z: torch.Tensor, cols: int | torch.Tensor | None = None, *, dtype: torch.dtype | None = None,
                  block_bytes: int | None = None) -> torch.Tensor:
    """Per-row log-normalizer of logits z [T, C] over chosen columns, block of rows by block of rows.

    Args:
        z: logits, any float dtype.
        cols: None (every column), an int n (the first n: the real vocabulary, padding rows beyond it
            left out as if they were -inf), or 1-D int64 ids [K] (a subset, e.g. the tokens a trimmed
            vocabulary keeps).
        dtype: accumulate (and return) in this dtype, e.g. torch.float64; None keeps z's.
        block_bytes: bytes of one widened block of rows (default :data:`ROW_BLOCK_BYTES`).

    Returns:
        lse [T] (nats), ``dtype``. Memory: one [rows, C] block in ``dtype``, never a [T, C] copy.

    Raises:
        ShapeMismatch / BadInput: z not a non-empty float [T, C].
    """
    _check_rows("z", z)
    out = torch.empty(z.shape[0], dtype=dtype or z.dtype, device=z.device)
    for a, b in _blocks(z, dtype, block_bytes):
        out[a:b] = torch.logsumexp(_columns(z[a:b], cols).to(out.dtype), 1)
    return out


def row_logprobs_at(z: torch.Tensor, index: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of chosen entries: ``z.gather(1, index) - lse[:, None]`` in lse's dtype.

    Args:
        z: logits [T, C]; index: int64 [T, K] column ids per row (targets: ``t[:, None]``; one set of
            columns for every row: ``ids.expand(T, -1)``); lse: [T] from :func:`row_logsumexp`.

    Returns:
        [T, K] log-probabilities (nats), lse's dtype; [T, K] work only.
    """
    return z.gather(1, index.to(z.device)).to(lse.dtype) - lse[:, None]


def row_kl(ref: torch.Tensor, z: torch.Tensor, *, ref_lse: torch.Tensor | None = None,
           lse: torch.Tensor | None = None, dtype: torch.dtype | None = None,
           block_bytes: int | None = None) -> torch.Tensor:
    """Per-row KL(p ‖ q) = Σ_c p_c (log p_c - log q_c) of p = softmax(ref), q = softmax(z), streamed
    block of rows by block of rows.

    Args:
        ref, z: logits [T, C] on the same C columns (slice both to the columns p lives on).
        ref_lse, lse: their log-normalizers [T] (default: :func:`row_logsumexp` over the C columns);
            pass a wider one where q is normalized over more columns than the C summed (an expanded
            vocabulary read on the old one's tokens).
        dtype: accumulate in this dtype (e.g. torch.float64 for changes below float32's resolution).
        block_bytes: bytes of one widened block of rows.

    Returns:
        [T] nats, ``dtype`` (or the logits'). Columns with p = 0 add 0, as long as log q is finite there.

    Raises:
        ShapeMismatch: ref and z differ in shape.
    """
    _check_rows("ref", ref)
    _check_rows("z", z)
    if ref.shape != z.shape:
        raise ShapeMismatch(f"ref {tuple(ref.shape)} and z {tuple(z.shape)} must have the same [T, C]")
    dt = dtype or torch.promote_types(ref.dtype, z.dtype)
    ref_lse = row_logsumexp(ref, dtype=dt, block_bytes=block_bytes) if ref_lse is None else ref_lse.to(dt)
    lse = row_logsumexp(z, dtype=dt, block_bytes=block_bytes) if lse is None else lse.to(dt)
    out = torch.empty(ref.shape[0], dtype=dt, device=ref.device)
    for a, b in _blocks(ref, dt, block_bytes):
        lp = ref[a:b].to(dt) - ref_lse[a:b, None]
        lq = z[a:b].to(dt) - lse[a:b, None]
        out[a:b] = (lp.exp() * (lp - lq)).sum(-1)
    return out


def row_max_abs_logprob_diff(a: torch.Tensor, b: torch.Tensor, *, a_lse: torch.Tensor, b_lse: torch.Tensor,
                             b_cols: torch.Tensor | None = None, block_bytes: int | None = None) -> torch.Tensor:
    """Per-row max_c |log p_c - log q_c| of p = softmax over a's normalizer ``a_lse``, q over ``b_lse``.

    Args:
        a: logits [T, C]; b: logits [T, C] or, with ``b_cols`` (int64 ids [C]), [T, C'] read at those
            columns (gathered block by block: the kept tokens of a trimmed vocabulary).
        a_lse, b_lse: the log-normalizers [T] (:func:`row_logsumexp`); their dtype is the accumulation's.
        block_bytes: bytes of one widened block of rows.

    Returns:
        [T] nats, a_lse's dtype.
    """
    _check_rows("a", a)
    _check_rows("b", b)
    dt = a_lse.dtype
    out = torch.empty(a.shape[0], dtype=dt, device=a.device)
    for r0, r1 in _blocks(a, dt, block_bytes):
        lp = a[r0:r1].to(dt) - a_lse[r0:r1, None]
        lq = _columns(b[r0:r1], b_cols).to(dt) - b_lse[r0:r1, None].to(dt)
        out[r0:r1] = (lp - lq).abs().amax(-1)
    return out


__all__ = ["ROW_BLOCK_BYTES", "row_kl", "row_logprobs", "row_logprobs_at", "row_logsumexp",
           "row_max_abs_logprob_diff", "row_softmax", "row_top1_prob"]
