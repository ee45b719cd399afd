"""Layer 0: the transform every LM head applies after its GEMM, z -> softcap(scale · z).

One pure tensor function, imported by both :mod:`vocablens.models` (the unembedding object) and
:mod:`vocablens.ops` (chunked log-probabilities, vocab-parallel head), so the logits of every path are
computed the same way. This module is the only place in ``src/`` that calls ``tanh``.

* ``scale``: a factor on the raw head output (Cohere's ``logit_scale``; Granite's 1/``logits_scaling``).
* ``softcap``: the final-logit soft cap c of Gemma 2/3 (Gemma Team 2024, "Gemma 2", §2):
  softcap(u) = c · tanh(u / c), which keeps every logit inside (-c, c).
"""

from __future__ import annotations

import math

import torch

from vocablens.errors import BadInput


def check_transform(scale: float = 1.0, softcap: float | None = None) -> None:
    """Validate the transform's parameters.

    Raises:
        BadInput: ``scale`` not a finite non-zero number, or ``softcap`` not None and not a finite
            positive number.
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
        raise BadInput(f"logit_scale must be a finite non-zero number; got {scale!r}")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise BadInput(f"softcap must be None or a finite positive number; got {softcap!r}")


def transform_logits(z: torch.Tensor, scale: float = 1.0, softcap: float | None = None, *,
                     inplace: bool = False) -> torch.Tensor:
    """softcap(scale · z), elementwise.

    Args:
        z: raw head output [..., V] (h W_Uᵀ + b), any float dtype; float32 is what every vocablens
            path passes.
        scale: factor before the cap (1.0: none).
        softcap: c of c·tanh(u / c), or None for no cap.
        inplace: overwrite ``z`` (chunked paths reuse one buffer).

    Returns:
        The transformed logits, same shape and dtype as ``z`` (``z`` itself when ``inplace``).
    """
    if not inplace:
        if scale != 1.0:
            z = z * scale
        if softcap is not None:
            z = torch.tanh(z / softcap) * softcap
        return z
    if scale != 1.0:
        z.mul_(scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def transform_logits_backward(grad: torch.Tensor, transformed: torch.Tensor, scale: float = 1.0,
                              softcap: float | None = None, *, inplace: bool = False) -> torch.Tensor:
    """d loss / d z from d loss / d logits, given the transformed logits of :func:`transform_logits`.

    d softcap(u)/du = 1 - tanh²(u/c) = 1 - (y/c)² where y = softcap(u) is the transformed logit, so
    the raw values need not be kept. Then times ``scale``.

    Args:
        grad: [..., V] gradient with respect to the transformed logits (float32).
        transformed: [..., V] the transformed logits y (same shape), only read when ``softcap`` is set.
        inplace: overwrite ``grad``.

    Returns:
        [..., V] gradient with respect to the raw head output z.
    """
    if softcap is not None:
        d = (transformed / softcap).square_().neg_().add_(1.0)
        grad = grad.mul_(d) if inplace else grad * d
    if scale != 1.0:
        grad = grad.mul_(scale) if inplace else grad * scale
    return grad


__all__ = ["check_transform", "transform_logits", "transform_logits_backward"]
