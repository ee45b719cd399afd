"""The softmax bottleneck: the logit matrix over any set of contexts has rank <= d.

Yang, Dai, Salakhutdinov and Cohen (ICLR 2018), "Breaking the Softmax Bottleneck", §2: for N
contexts with LM-head inputs ``H [N, d]``, the logits ``H W^T + 1 b^T`` have rank <= d + 1 and the
log-probabilities ``A = H W^T + 1 b^T - lse 1^T`` have rank <= d + 2 in general and <= d + 1
without bias (the log-normaliser adds one rank-1 term). So when N > d + 1 the model cannot
represent an arbitrary N x V log-probability matrix. We report the singular spectrum and numerical
rank of ``W`` and of ``A`` over real contexts, and the share of variance in the top-k directions.

Numerical rank: the spectra come from float64 Gram matrices (``W^T W``, ``A A^T``), whose
eigenvalues are exact to about ``max(shape) * eps * lambda_max``; a singular value counts when
``sigma^2`` is above that (so sigma above ``sqrt(max(shape) * eps) * sigma_max``, eps = 2^-52). The
Grams are streamed over the vocabulary by :mod:`vocablens.ops.gram` (the one place that normalizes
over V here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops.gram import logprob_gram, weight_gram


@dataclass(frozen=True, eq=False)
class Bottleneck:
    """Spectra of the unembedding and of a log-probability matrix.

    Attributes:
        sigma_W: float64 [min(V, d)], singular values of W (descending).
        rank_W: numerical rank of W; tol_W: its threshold.
        stable_rank_W: ``||W||_F^2 / ||W||_2^2``; entropy_rank_W: ``exp(H(sigma / sum sigma))``.
        sigma_A: float64 [min(N, V)] singular values of the log-probability matrix, or empty.
        rank_A / tol_A: its numerical rank and threshold (-1 / nan when no contexts).
        bound_A: the theoretical bound on rank_A (d + 1 without bias, d + 2 with).
        n_contexts: N; d: width; V: rows.
        share_W / share_A: k -> share of ``sum sigma^2`` in the top-k directions.
        softcap: whether a logit softcap was applied (then the rank bound does not hold).
    """

    sigma_W: torch.Tensor
    rank_W: int
    tol_W: float
    stable_rank_W: float
    entropy_rank_W: float
    sigma_A: torch.Tensor
    rank_A: int
    tol_A: float
    bound_A: int
    n_contexts: int
    d: int
    V: int
    share_W: dict
    share_A: dict
    softcap: bool = False


def _share(sig: torch.Tensor, ks) -> dict[int, float]:
    e = sig.double() ** 2
    tot = float(e.sum()) or 1.0
    return {int(k): float(e[:k].sum()) / tot for k in ks if k <= len(e)}


#: bytes of one float64 block (rows of W, or columns of the [N, V] log-probabilities) of the scan
BLOCK_BYTES = 8 * 2**20


def _tell(progress, stage: str, done: int, total: int) -> None:
    """``progress(stage, done, total)`` when a callback was given."""
    if progress is not None:
        progress(stage, done, total)


def softmax_bottleneck(W: torch.Tensor, hidden: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       logit_scale: float = 1.0, softcap: float | None = None,
                       top_k: tuple[int, ...] = (1, 10, 64, 128, 256), block_bytes: int | None = None,
                       progress=None) -> Bottleneck:
    """Singular spectra and numerical ranks of ``W`` and of ``log_softmax(hidden W^T + b)``.

    Args:
        W: unembedding ``[V, d]``, any float dtype and device (read block by block).
        hidden: LM-head inputs ``[N, d]`` of N real contexts (after the final norm), or None.
        bias: ``[V]`` or None; logit_scale, softcap: applied as the model does.
        top_k: directions for the variance shares.
        block_bytes: size of one float64 block of the scan (default :data:`BLOCK_BYTES`, 8 MiB).
        progress: ``progress(stage, done, total)`` after each block (stages ``Gram of W`` over the V
            rows, then with ``hidden`` ``log-normaliser over V`` and ``Gram of the log-probabilities``),
            and around each eigendecomposition (``spectrum of W``: d, ``spectrum of the
            log-probabilities``: N; 0 when it starts).

    Returns:
        :class:`Bottleneck`. Cost: ``2 V d^2 + 4 N V d + 2 N^2 V`` float64 FLOPs (the logits are
        computed twice: once for the log-normaliser, once for the Gram). Memory: the two Gram matrices
        (d x d and N x N float64) and one block; neither W in float64 nor the [N, V] logits is ever
        whole. The Grams are sums over blocks, so they equal the whole-matrix products up to float64
        rounding.

    Raises:
        ShapeMismatch: hidden width differs from W's. BadInput: NaN/inf in W or hidden.
    """
    if W.dim() != 2 or W.shape[0] < 1 or W.shape[1] < 1:
        raise ShapeMismatch(f"W must be a non-empty matrix [V, d]; got {tuple(W.shape)}")
    block_bytes = int(block_bytes or BLOCK_BYTES)
    V, d = W.shape
    G = weight_gram(W, block_bytes, progress)
    _tell(progress, "spectrum of W", 0, d)             # threaded LAPACK: seconds on a busy machine
    ev = torch.linalg.eigvalsh(G).flip(0).clamp_min(0)
    _tell(progress, "spectrum of W", d, d)
    sig = ev.sqrt()
    eps = torch.finfo(torch.float64).eps
    # the Gram matrix squares the spectrum: threshold on sigma from the float64 rule on G
    tolW = float(max(V, d) * eps * float(ev[0])) ** 0.5 if float(ev[0]) > 0 else 0.0
    rankW = int((sig > tolW).sum())
    s2 = sig ** 2
    stable = float(s2.sum() / s2[0]) if float(s2[0]) > 0 else 0.0
    pn = sig / sig.sum() if float(sig.sum()) > 0 else sig
    ent = float(torch.exp(-(pn[pn > 0] * pn[pn > 0].log()).sum())) if float(sig.sum()) > 0 else 0.0
    sigA = torch.zeros(0, dtype=torch.float64)
    rankA, tolA, N = -1, float("nan"), 0
    if hidden is not None:
        if hidden.dim() != 2 or hidden.shape[1] != d:
            raise ShapeMismatch(f"hidden must be [N, {d}]; got {tuple(hidden.shape)}")
        H = hidden.detach().cpu().double()
        if not bool(torch.isfinite(H).all()):
            raise BadInput("hidden states have NaN or inf entries")
        N = H.shape[0]
        GA = logprob_gram(W, H, bias, logit_scale, softcap, block_bytes, progress)  # Gram, float64, streamed over V
        _tell(progress, "spectrum of the log-probabilities", 0, N)
        evA = torch.linalg.eigvalsh(GA).flip(0).clamp_min(0)
        _tell(progress, "spectrum of the log-probabilities", N, N)
        sigA = evA.sqrt()
        tolA = float(max(N, V) * eps * float(evA[0])) ** 0.5 if float(evA[0]) > 0 else 0.0
        rankA = int((sigA > tolA).sum())
    return Bottleneck(sigma_W=sig, rank_W=rankW, tol_W=tolW, stable_rank_W=stable, entropy_rank_W=ent,
                      sigma_A=sigA, rank_A=rankA, tol_A=tolA, bound_A=d + (2 if bias is not None else 1),
                      n_contexts=N, d=d, V=V, share_W=_share(sig, top_k), share_A=_share(sigA, top_k),
                      softcap=bool(softcap))


class _Stop(Exception):
    """Raised by the hook on the last block: the final norm and the head of the model are not run."""


def _last_block_output(borders, ids: torch.Tensor) -> torch.Tensor:
    """The last block's output [B, T, d_model] (residual-stream layer L, before the final norm): the
    model's forward stopped right after its last block, so neither the other layers' streams nor the
    [B, T, V] logits are kept."""
    store: dict[str, torch.Tensor] = {}

    def hook(_mod, _args, output):
        store["x"] = output[0] if isinstance(output, (tuple, list)) else output
        raise _Stop

    handle = borders.blocks[-1].register_forward_hook(hook)
    try:
        borders.model(input_ids=ids.to(borders.device), use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return store["x"]


def context_hidden(borders, ids: torch.Tensor, batch: int = 4, progress=None) -> torch.Tensor:
    """LM-head inputs (after the final norm) for every position of ``ids [B, T]``: [B*T, d_emb] float32.

    The same values as ``U.normed(borders.residual_stream(ids)[0][-1])``; each batch's forward stops
    after the last block (memory: one batch's activations, not L+1 streams and [batch, T, V] logits).
    ``progress(stage, done, total)``: 0 before the first batch, then after each (stage ``forward``,
    units: rows of ``ids``).

    Raises:
        BadInput: empty ids, or a token id outside the embedding's rows.
    """
    if ids.numel() == 0:
        raise BadInput("no contexts: the token batch is empty")
    V = borders.input_embedding.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= V:
        raise BadInput(f"token ids must lie in 0..{V - 1}")
    out = []
    U = borders.unembedding
    _tell(progress, "forward", 0, ids.shape[0])       # the stage starts before the first batch
    with torch.no_grad():
        for s in range(0, ids.shape[0], batch):
            x = _last_block_output(borders, ids[s:s + batch])
            out.append(U.normed(x).float().reshape(-1, U.d_emb))
            _tell(progress, "forward", min(s + batch, ids.shape[0]), ids.shape[0])
    return torch.cat(out)
