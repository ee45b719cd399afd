"""Float64 Gram matrices through the LM head, streamed over the vocabulary: ``W^T W`` and the Gram of
the log-probabilities ``A = log_softmax(H W^T + b)``, never holding W in float64 or [N, V] whole.

The softmax bottleneck (:mod:`vocablens.argmax.bottleneck`) reads the singular spectra of W and of A
off these Grams. Everything is float64 on the CPU (eigenvalues of a Gram are exact to about
``max(shape) · eps · lambda_max``, eps = 2^-52), in blocks of ``block_bytes``; the Grams are sums over
blocks, so they equal the whole-matrix products up to float64 rounding.
"""

from __future__ import annotations

import torch

from vocablens.errors import BadInput
from vocablens.logit_transform import transform_logits
from vocablens.ops.rows import row_logprobs


def finite64(W: torch.Tensor, what: str = "W") -> torch.Tensor:
    """W (a small matrix) as float64 on the CPU.

    Raises:
        BadInput: NaN or inf entries (then no spectrum is defined).
    """
    Wd = W.detach().cpu().double()  # cpu: float64 on the host (the Gram is [d, d] or a small W)
    if not bool(torch.isfinite(Wd).all()):
        raise BadInput(f"{what} has NaN or inf entries: its spectrum is undefined")
    return Wd


def float64_row_blocks(W: torch.Tensor, rows: int):
    """``(start, W[start:start + rows] as float64 on the CPU)`` for every block of rows of W [V, d].

    Every block is written into one reused buffer and nothing else of block size is allocated (fresh
    blocks and temporaries per step let the C allocator keep them, raising the resident set;
    docs/performance-ops.md), so a block is only valid until the next one is read."""
    V, d = W.shape
    buf = torch.empty(min(rows, V) * d, dtype=torch.float64)
    for a in range(0, V, rows):
        Wb = buf[: min(rows, V - a) * d].view(-1, d)
        Wb.copy_(W[a:a + rows].detach())
        yield a, Wb


def _tell(progress, stage: str, done: int, total: int) -> None:
    """``progress(stage, done, total)`` when a callback was given."""
    if progress is not None:
        progress(stage, done, total)


def weight_gram(W: torch.Tensor, block_bytes: int, progress=None) -> torch.Tensor:
    """float64 Gram of W [V, d]: ``W^T W`` [d, d] summed over row blocks of ``block_bytes`` when
    V >= d, else ``W W^T`` [V, V]. ``progress(stage, rows_done, V)`` after each block, if given.

    Raises:
        BadInput: W holds NaN or inf (seen on the Gram's diagonal, the columns' sums of squares).
    """
    V, d = W.shape
    if V < d:  # fewer rows than columns: W itself is smaller than the [d, d] Gram
        Wd = finite64(W)
        return Wd @ Wd.T
    G = torch.zeros(d, d, dtype=torch.float64)
    for a, Wb in float64_row_blocks(W, max(1, block_bytes // (8 * d))):
        G.addmm_(Wb.T, Wb)
        _tell(progress, "Gram of W", a + len(Wb), V)
    if not bool(torch.isfinite(G.diagonal()).all()):
        raise BadInput("W has NaN or inf entries: its spectrum is undefined")
    return G


def _logits64_into(out: torch.Tensor, H: torch.Tensor, Wb: torch.Tensor, bb: torch.Tensor | None,
                   logit_scale: float, softcap: float | None) -> torch.Tensor:
    """float64 logits [N, n] of one block of rows of W written into ``out`` (flat buffer): bias, scale
    and softcap as the head applies them (:func:`vocablens.logit_transform.transform_logits`)."""
    L = out[: H.shape[0] * Wb.shape[0]].view(H.shape[0], Wb.shape[0])
    torch.mm(H, Wb.T, out=L)
    if bb is not None:
        L += bb
    return transform_logits(L, logit_scale, softcap or None, inplace=True)


def logprob_gram(W: torch.Tensor, H: torch.Tensor, bias: torch.Tensor | None = None, logit_scale: float = 1.0,
                 softcap: float | None = None, block_bytes: int = 8 * 2**20, progress=None) -> torch.Tensor:
    """float64 Gram of the log-probabilities ``A = L - lse 1^T``, ``L = softcap(scale · (H W^T + b))``.

    Args:
        W: [V, d] the unembedding, any float dtype and device (read block by block into float64).
        H: [N, d] float64 CPU head inputs (finite; the caller checks).
        bias: [V] or None. logit_scale, softcap: the head's transform.
        block_bytes: bytes of one float64 block (rows of W, or [N, cols] / [n, V] slices of L).
        progress: ``progress(stage, done, total)`` after each block, if given.

    Returns:
        ``A A^T`` [N, N] when N <= V, else ``A^T A`` [V, V], float64 (log-probabilities in nats).

    N <= V: a first pass over column blocks of V gets each row's log-sum-exp, streamed in float64
    (lse = logaddexp(lse, m_b + log Σ exp(L_b - m_b)), m_b the block's row max); a second pass
    recomputes each block's logits and adds ``A_b A_b^T``. N > V (then V is small): blocks of rows
    of A are complete rows (:func:`vocablens.ops.row_logprobs`), and ``A^T A`` is summed over them.
    Cost: 4 N V d + 2 N^2 V FLOPs (N <= V: the logits are computed twice). Memory: the Gram and one
    block; neither [N, V] nor W in float64 is ever whole.
    """
    N, V = H.shape[0], W.shape[0]
    b64 = None if bias is None else bias.detach().cpu().double()  # cpu: float64 bias beside the host blocks
    if N > V:
        Wd = finite64(W)
        GA = torch.zeros(V, V, dtype=torch.float64)
        n = max(1, block_bytes // (8 * V))
        buf = torch.empty(min(n, N) * V, dtype=torch.float64)
        for i in range(0, N, n):
            L = _logits64_into(buf, H[i:i + n], Wd, b64, logit_scale, softcap)
            row_logprobs(L, 1, inplace=True)  # [n, V] log-probs, nats, in place
            GA.addmm_(L.T, L)
            _tell(progress, "Gram of the log-probabilities", min(i + n, N), N)
        return GA
    cols = max(1, block_bytes // (8 * max(N, W.shape[1])))  # [N, cols] logits and [cols, d] rows of W
    buf = torch.empty(N * min(cols, V), dtype=torch.float64)
    lse = torch.full((N,), -float("inf"), dtype=torch.float64)
    for a, Wb in float64_row_blocks(W, cols):
        L = _logits64_into(buf, H, Wb, None if b64 is None else b64[a:a + len(Wb)], logit_scale, softcap)
        m = L.amax(1)
        lse = torch.logaddexp(lse, m + L.sub_(m[:, None]).exp_().sum(1).log())
        _tell(progress, "log-normaliser over V", a + len(Wb), V)
    GA = torch.zeros(N, N, dtype=torch.float64)
    for a, Wb in float64_row_blocks(W, cols):
        A = _logits64_into(buf, H, Wb, None if b64 is None else b64[a:a + len(Wb)], logit_scale, softcap)
        A -= lse[:, None]  # [N, cols] log-probs, nats
        GA.addmm_(A, A.T)
        _tell(progress, "Gram of the log-probabilities", a + len(Wb), V)
    return GA


__all__ = ["finite64", "float64_row_blocks", "logprob_gram", "weight_gram"]
