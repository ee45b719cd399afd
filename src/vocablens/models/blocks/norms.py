"""Norms read as affine maps: the elementwise gain of an RMS/Layer norm (by probing, no family
knowledge) and a norm linearized at its actual input (for direct logit attribution)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from vocablens.errors import UnsupportedArchitecture


@dataclass(frozen=True)
class NormLinearization:
    """A norm written at its actual input x as an affine map: ``norm(x) = scale ⊙ (x - centered·mean(x)) + bias``.

    ``scale = gain / sigma(x)`` holds the per-position scale the norm actually applied, so the map is
    exact at x and linear in x for that fixed scale (the approximation used by direct logit
    attribution: each part of x is read at the scale of the whole).

    Attributes:
        scale: [..., d] float32, gain divided by the actual RMS / standard deviation.
        gain: [d] float32, the norm's elementwise gain (gemma's ``1 + w`` included).
        bias: [d] float32 (zeros when the norm has none).
        centered: True for LayerNorm-style norms that subtract the mean.
        sigma: [..., 1] float32, the actual RMS / standard deviation (eps included; 1 without a norm).
        max_abs_error: max |affine map - norm(x)| at the actual input (a check).
    """

    scale: torch.Tensor
    gain: torch.Tensor
    bias: torch.Tensor
    centered: bool
    sigma: torch.Tensor
    max_abs_error: float

    def linear(self, u: torch.Tensor) -> torch.Tensor:
        """The linear part applied to a piece u [..., d] of the input (no bias)."""
        u = u.float()
        if self.centered:
            u = u - u.mean(-1, keepdim=True)
        return self.scale.to(u.device) * u

    def pull_back(self, r: torch.Tensor) -> torch.Tensor:
        """Pull a row vector r [..., d] on the output back to the input: ``r·linear(u) == pull_back(r)·u``."""
        r = self.scale.to(r.device) * r.float()
        if self.centered:
            r = r - r.mean(-1, keepdim=True)
        return r


def _norm_eps(norm: nn.Module) -> float:
    for n in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
        v = getattr(norm, n, None)
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0


def norm_gain(norm: nn.Module | None, d: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The elementwise gain [d], bias [d] (float32) and centering of an RMS or Layer norm, by probing it.

    The module is evaluated on three probe vectors (zeros, ones, alternating ±1); no family knowledge.
    ``None`` (no norm) gives gain 1, bias 0, not centered.
    """
    if norm is None:
        return torch.ones(d), torch.zeros(d), False
    from vocablens.models.files.offload import runs_on

    w = next((p for p in norm.parameters()), None)
    dtype = w.dtype if w is not None else torch.float32
    dev = runs_on(norm)  # an offloaded norm (device map): where its hook runs it
    eps = _norm_eps(norm)
    with torch.no_grad():
        zeros = torch.zeros(1, d, dtype=dtype, device=dev)
        ones = torch.ones(1, d, dtype=dtype, device=dev)
        alt = torch.ones(1, d, dtype=torch.float32)
        alt[:, 1::2] = -1.0
        b = norm(zeros).float().cpu()[0]
        f1 = norm(ones).float().cpu()[0] - b
        fa = norm(alt.to(dev, dtype)).float().cpu()[0] - b
        centered = bool(f1.abs().max() <= 1e-3 * max(float(fa.abs().max()), 1e-12))
        pc = alt[0] - (alt[0].mean() if centered else 0.0)
        sigma = math.sqrt(float((pc ** 2).mean()) + eps)
        gain = fa * sigma / pc
    return gain, b, centered


def linearize_norm(norm: nn.Module | None, x: torch.Tensor) -> NormLinearization:
    """Write ``norm`` at its actual input x [..., d] as an affine map (see :class:`NormLinearization`).

    Works for RMSNorm (llama, gemma's ``1 + w``), LayerNorm with or without bias (gpt2, cohere) and
    None (identity). Float32 throughout.

    Raises:
        UnsupportedArchitecture: the norm is not of the form gain ⊙ (x - c·mean) / sigma + bias (the
            affine map misses the module's output by more than 1e-3 relative).
    """
    d = x.shape[-1]
    gain, bias, centered = norm_gain(norm, d)
    xf = x.float().cpu()
    if norm is None:
        return NormLinearization(scale=torch.ones_like(xf), gain=gain, bias=bias, centered=False,
                                 sigma=torch.ones(*xf.shape[:-1], 1), max_abs_error=0.0)
    eps = _norm_eps(norm)
    xc = xf - xf.mean(-1, keepdim=True) if centered else xf
    sigma = torch.sqrt((xc ** 2).mean(-1, keepdim=True) + eps)
    lin = NormLinearization(scale=gain / sigma, gain=gain, bias=bias, centered=centered, sigma=sigma,
                            max_abs_error=0.0)
    w = next((q for q in norm.parameters()), None)
    with torch.no_grad():
        actual = norm(x.to(w.device) if w is not None else x).float().cpu()
    approx = lin.linear(xf) + bias
    err = float((approx - actual).abs().max())
    if err > 1e-3 * max(float(actual.abs().max()), 1.0):
        raise UnsupportedArchitecture(type(norm).__name__, [type(norm).__name__],
                                      f"the norm is not an RMS/Layer norm (affine fit misses by {err:.3g})")
    return NormLinearization(scale=lin.scale, gain=gain, bias=bias, centered=centered, sigma=sigma,
                             max_abs_error=err)
