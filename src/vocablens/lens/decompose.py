"""A residual-stream vector written as a few nonnegative vocabulary directions of the Jacobian lens.

The Jacobian lens reads layer l as ``unembed(J_l h)``; to first order token t's logit moves with
``<J_lᵀ r_t, h>``, ``r_t = g ⊙ W_U[t]`` (the head's row with the final norm's gain folded in,
:meth:`vocablens.models.unembed.Unembedding.readout`). So ``d_t = J_lᵀ r_t`` [d] is token t's direction in
the stream at layer l, and a stream vector h is decomposed as ``h ≈ Σ_k c_k d_{t_k}``, ``c_k >= 0``, with
at most K tokens: nonnegative orthogonal matching pursuit (Pati et al. 1993, OMP; the nonnegative
variant of Bruckstein, Elad & Zibulevsky 2008), each step adding the token whose unit direction has the
largest positive inner product with the residual, then refitting all coefficients by nonnegative least
squares (Lawson & Hanson 1974; ``scipy.optimize.nnls``), as TransformerLens 4's ``JacobianLens.decompose``
and Gurnee et al. (2026) do. The result reports each token's coefficient, the residual and the fraction
of h's squared norm explained (1 - ||h - Σ c d||² / ||h||²; h is not centred).

Steering along a token's direction (:func:`token_direction`): the unit ``d_t / ||d_t||`` added to (or
projected out of) the stream at layer l, through the same machinery as value-vector steering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders

#: rows of the [V, d] direction matrix built at a time
BLOCK = 8192


@dataclass(frozen=True)
class Decomposition:
    """``h ≈ Σ_k coef[k] · d_{ids[k]}`` at one layer (module docstring).

    Attributes:
        layer: the stream layer. ids: [K'] int64 tokens chosen, in the order picked (K' <= K).
        coef: [K'] float64 nonnegative coefficients (NNLS on all chosen directions).
        unit_coef: [K'] coefficients of the unit directions (``coef · ||d_t||``): comparable across tokens.
        norm_h: ||h||. residual_norm: ||h - Σ coef d||. fve: 1 - residual_norm² / norm_h².
        fve_path: [K'] the fraction explained after each step.
    """

    layer: int
    ids: torch.Tensor
    coef: torch.Tensor
    unit_coef: torch.Tensor
    norm_h: float
    residual_norm: float
    fve: float
    fve_path: list[float]


def directions(borders: Borders, lens, layer: int, rows: slice | None = None) -> torch.Tensor:
    """``D = R J_l`` [V', d] float32 (row t = ``d_tᵀ = (J_lᵀ r_t)ᵀ``) for the real vocabulary (or ``rows``).

    Raises:
        BadInput: the lens has no matrix for ``layer``.
    """
    U = borders.unembedding
    J = lens.matrix(layer).float().to(U.device)
    rows = rows or slice(0, int(borders.real_vocab_size))
    out = []
    for a in range(rows.start, rows.stop, BLOCK):
        out.append(U.readout_rows(slice(a, min(rows.stop, a + BLOCK))) @ J)
    return torch.cat(out)


def token_direction(borders: Borders, lens, layer: int, token: int) -> torch.Tensor:
    """The unit stream direction [d] float32 of ``token`` at ``layer`` through the Jacobian lens."""
    d = directions(borders, lens, layer, slice(int(token), int(token) + 1))[0]
    return d / d.norm().clamp_min(1e-12)


def decompose(borders: Borders, lens, layer: int, h: torch.Tensor, k: int = 10, tol: float = 1e-6) -> Decomposition:
    """Nonnegative OMP of the stream vector ``h`` [d] at ``layer`` over the Jacobian-lens token directions.

    Args:
        borders: the model. lens: a :class:`~vocablens.lens.jacobian.JacobianLens` with a matrix at ``layer``.
        h: [d] the stream vector (e.g. one position's residual stream at ``layer``).
        k: at most this many tokens (stops earlier when no direction has a positive inner product
            with the residual, or the residual is below ``tol`` · ||h||).

    Returns:
        :class:`Decomposition`. Cost: one [V, d] x [d, d] product (the directions), then per step one
        [V, d] x [d] product and an NNLS of k columns.

    Raises:
        BadInput: k < 1, h not of width d, no matrix at ``layer``.
    """
    from scipy.optimize import nnls

    if k < 1:
        raise BadInput(f"`k` must be at least 1; got {k}")
    if h.dim() != 1 or h.shape[0] != borders.d_model:
        raise BadInput(f"decompose takes one stream vector [d={borders.d_model}]; got {tuple(h.shape)}")
    D = directions(borders, lens, layer)  # [V, d]
    norms = D.norm(dim=1).clamp_min(1e-12)
    target = h.detach().float().to(D.device)
    chosen: list[int] = []
    coef = torch.zeros(0, dtype=torch.float64)
    resid, path = target.clone(), []
    hh = float(target.double().norm() ** 2)
    for _ in range(k):
        if float(resid.double().norm()) <= tol * hh ** 0.5:
            break
        score = (D @ resid) / norms
        if chosen:
            score[chosen] = float("-inf")
        t = int(score.argmax())
        if not score[t] > 0:
            break
        chosen.append(t)
        A = D[chosen].double().T.cpu().numpy()  # cpu: scipy's NNLS
        c, _ = nnls(A, target.double().cpu().numpy())  # cpu: scipy's NNLS
        coef = torch.from_numpy(c)
        resid = target - (D[chosen].double().T @ coef.to(D.device)).float()
        path.append(1.0 - float(resid.double().norm() ** 2) / hh if hh > 0 else 0.0)
    keep = [i for i, c in enumerate(coef.tolist()) if c > 0] if chosen else []
    ids = torch.tensor([chosen[i] for i in keep], dtype=torch.int64)
    coef = coef[keep] if keep else coef
    unit = coef * norms[ids].double().cpu() if keep else coef  # cpu: the result
    rn = float(resid.double().norm())
    return Decomposition(int(layer), ids, coef, unit, hh ** 0.5, rn, 1.0 - rn * rn / hh if hh > 0 else 0.0, path)


__all__ = ["Decomposition", "decompose", "directions", "token_direction"]
