"""KL(reference ‖ q) through the LM head with its gradient w.r.t. the hidden states: the tuned lens's loss.

:func:`linear_kl` reads S stacked layers of head inputs ``hidden [S, N, d]`` against one reference
distribution per token (its logits ``reference [N, V]``, or a target token: the cross-entropy), in
chunks of tokens: one GEMM writes a chunk's logits into a reused float32 buffer, the loss is read off
it (:func:`_chunk_loss`), and the analytic gradient d KL / d logits = q - p (Belrose et al. 2023,
§3) is pulled back through the softcap, the scale and W (:func:`_chunk_grad`). Autograd never sees a
[rows, V] tensor. The forward-only readout of the same KL is :func:`vocablens.ops.kl.kl_readout`.

Numerics: as :mod:`vocablens.ops.kl`: logits shifted by their row max, float32 sums, the
reference's log-probabilities never formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import transform_logits_backward
from vocablens.ops._checks import check_ids
from vocablens.ops.kl import check_reference, head_logits_into, pair_dot, stacked_inputs, tokens_per_chunk
from vocablens.ops.kl_block import reference_chunk


@dataclass(frozen=True)
class LinearKL:
    """Result of :func:`linear_kl`.

    Attributes:
        loss: [S] float64, KL(reference ‖ q) (or cross-entropy) summed over the counted tokens, nats.
        grad: [S, N, d] float32, ``grad_scale`` · d(Σ loss) / d hidden, or None.
    """

    loss: torch.Tensor
    grad: torch.Tensor | None


def _checked_targets(reference, targets, valid, N: int, V: int) -> torch.Tensor | None:
    """``targets`` as int64 [N] (None in KL mode), after the checks of :func:`linear_kl`'s reference,
    targets and valid. Raises BadInput / ShapeMismatch as :func:`linear_kl` says."""
    if (reference is None) == (targets is None):
        raise BadInput("linear_kl takes a reference [N, V] (KL) or targets [N] (cross-entropy), not both or neither")
    if reference is not None:
        check_reference(reference, N, V)
    else:
        check_ids("targets", targets, V)
        if tuple(targets.shape) != (N,):
            raise ShapeMismatch(f"targets must be [N]=({N},); got {tuple(targets.shape)}")
        targets = targets.to(torch.int64)
    if valid is not None and tuple(valid.shape) != (N,):
        raise ShapeMismatch(f"valid must be [N]=({N},); got {tuple(valid.shape)}")
    return targets


def _chunk_loss(z: torch.Tensor, e: torch.Tensor, ref: torch.Tensor | None, tgt: torch.Tensor | None,
                pbuf: torch.Tensor | None, n: int, S: int):
    """Per-(token, layer) loss [n, S] of one chunk of token-major logits ``z [n·S, V]`` (overwritten by
    z - m; ``e`` [n·S, V] receives exp(z - m)), against reference logits ``ref [n, V]`` (KL) or
    target ids ``tgt [n]`` (cross-entropy).

    Returns ``(loss, s, p, idx)``: s [n·S, 1] the exp-sums, p [n, V] the reference probabilities (KL
    mode) and idx [n, S, 1] the target indices (cross-entropy mode); the unused one is None."""
    V = z.shape[1]
    z.sub_(z.amax(1, keepdim=True))
    torch.exp(z, out=e)
    s = e.sum(1, keepdim=True)
    log_s = s.log().view(n, S)
    if ref is not None:  # KL = Σ p log p - Σ p (z - m) + log s
        p, plogp = reference_chunk(ref, pbuf)
        return plogp[:, None] - pair_dot(z, p, n, S) + log_s, s, p, None
    idx = tgt.view(n, 1, 1).expand(n, S, 1)
    return log_s - z.view(n, S, V).gather(2, idx).view(n, S), s, None, idx


def _chunk_grad(e: torch.Tensor, s: torch.Tensor, p: torch.Tensor | None, idx: torch.Tensor | None,
                scale, y: torch.Tensor | None, weight: torch.Tensor, logit_scale: float,
                softcap: float | None, n: int, S: int) -> torch.Tensor:
    """``scale`` · d loss / d head input, [n·S, d] float32, for one chunk: q - p (or q - onehot) from
    ``e`` (exp(z - m), overwritten) and ``s``, through the softcap and scale (``y``: the transformed
    logits, needed with a softcap) and W (one GEMM in W's dtype)."""
    e.div_(s)  # q
    q3 = e.view(n, S, -1)
    if p is not None:
        q3.sub_(p[:, None, :])
    else:
        q3.scatter_add_(2, idx, torch.full((n, S, 1), -1.0, dtype=torch.float32, device=e.device))
    q3.mul_(scale)
    g = transform_logits_backward(e, y, logit_scale, softcap, inplace=True)
    return (g.to(weight.dtype) @ weight).float()


@torch.no_grad()
def linear_kl(hidden: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor | None = None,
              targets: torch.Tensor | None = None, *, valid: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, logit_scale: float = 1.0, softcap: float | None = None,
              grad_scale: float = 1.0, want_grad: bool = True, chunk_bytes: int | None = None,
              chunk_rows: int | None = None) -> LinearKL:
    """KL(reference ‖ q) of S stacked layers, summed over tokens, with its gradient w.r.t. hidden.

    With ``reference=None`` and ``targets`` the reference is one-hot on the target: the loss is the
    cross-entropy -log q(target) and d/d logits = q - onehot. Cost: two GEMMs per (layer, token)
    row (logits, and the gradient's pull-back through W), 2·V·d FLOPs each.

    Args:
        hidden: [S, N, d] (or [N, d]) head inputs (already normed); the GEMMs run in ``weight``'s
            dtype (bfloat16 weights: bfloat16 GEMMs), everything else in float32.
        weight: [V, d] the unembedding W_U (no gradient is computed for it).
        reference: [N, V] reference logits, or None (then ``targets``).
        targets: [N] int token ids (cross-entropy mode).
        valid: [N] bool, tokens that count (None = all).
        bias: the head's bias [V] or None.
        logit_scale: the head's factor before the softcap.
        softcap: the head's final-logit softcap or None.
        grad_scale: factor on the returned gradient (e.g. 1 / counted tokens).
        want_grad: False = loss only.
        chunk_bytes: as :func:`~vocablens.ops.kl.kl_readout`.
        chunk_rows: as :func:`~vocablens.ops.kl.kl_readout`.

    Returns:
        :class:`LinearKL`.

    Raises:
        ShapeMismatch: shapes or dtypes disagree.
        BadInput: neither or both of reference and targets, targets outside [0, V), empty input, a bad
            scale or softcap.
    """
    H, two = stacked_inputs(hidden, weight, bias, logit_scale, softcap)
    S, N, d = H.shape
    V = int(weight.shape[0])
    targets = _checked_targets(reference, targets, valid, N, V)
    n_tok = min(N, tokens_per_chunk(S, V, chunk_bytes, chunk_rows))
    dev = H.device
    zbuf = torch.empty(n_tok * S * V, dtype=torch.float32, device=dev)
    ebuf = torch.empty_like(zbuf)
    pbuf = torch.empty(n_tok * V, dtype=torch.float32, device=dev) if reference is not None else None
    losses = torch.zeros(S, dtype=torch.float64, device=dev)
    G = torch.empty(S, N, d, dtype=torch.float32, device=dev) if want_grad else None
    for a in range(0, N, n_tok):
        b = min(N, a + n_tok)
        n, R = b - a, (b - a) * S
        z = head_logits_into(H[:, a:b].transpose(0, 1).reshape(R, -1), weight, bias, logit_scale, softcap, zbuf)
        y = z.clone() if (want_grad and softcap is not None) else None  # transformed logits, for the backward
        e = ebuf[: R * V].view(R, V)
        loss, s, p, idx = _chunk_loss(z, e, None if reference is None else reference[a:b],
                                      None if targets is None else targets[a:b], pbuf, n, S)
        w = None if valid is None else valid[a:b].to(torch.float32).view(n, 1)
        if w is not None:
            loss = loss * w
        losses += loss.double().sum(0)
        if want_grad:
            scale = grad_scale if w is None else w.view(n, 1, 1) * grad_scale
            gh = _chunk_grad(e, s, p, idx, scale, y, weight, logit_scale, softcap, n, S)
            G[:, a:b] = gh.view(n, S, d).transpose(0, 1)
    return LinearKL(loss=losses[0:1] if two else losses, grad=(G[0] if two and G is not None else G))


__all__ = ["LinearKL", "linear_kl"]
