"""The NNLS solves of the proofs: the nearest point of a few rows' hull to ``z_t`` in the NNLS
metric, on the Gram matrix while the set is small, the ``[r + 1, m]`` system otherwise."""

from __future__ import annotations

import numpy as np


def nnls_nearest(D: np.ndarray, maxiter: int | None = None):
    """Nearest point to z_t of the hull of the columns in the NNLS metric.

    Args:
        D: float64 [m, r] rows ``p_j - z_t`` for hull points p_j.

    Returns:
        ``(w [m], g [r], scale)``: normalised weights (sum 1), the gap ``g = sum w_j p_j - z_t``
        and the median column norm; None when NNLS fails.

    With few columns (m <= r / 2) the problem is solved on its Gram matrix first (an NNLS of size
    m x m after one O(m^2 r) product, cheaper than the [r + 1, m] system); squaring the condition number costs precision,
    so when that gap comes out small (the row may be inside) the [r + 1, m] system is solved as
    before, and an interior certificate always comes from it. A direction from the Gram solve only
    has to separate, and the next product checks that it does.
    """
    dn = np.linalg.norm(D, axis=1)
    med = float(np.median(dn)) + 1e-30
    om = 10.0 * med
    m, r = D.shape
    if m <= r // 2:
        out = nnls_gram(D, om, maxiter)
        if out is not None and float(np.linalg.norm(out[1])) > 1e-4 * med:
            return out[0], out[1], med
    return nnls_full(D, om, med, maxiter)


def nnls_full(D: np.ndarray, om: float, med: float, maxiter: int | None):
    from scipy.optimize import nnls

    M = np.vstack([D.T, np.full((1, len(D)), om)])
    rhs = np.zeros(M.shape[0])
    rhs[-1] = om
    try:
        mu, _ = nnls(M, rhs, maxiter=maxiter or 50 * (len(D) + M.shape[0]))
    except Exception:  # noqa: BLE001 — a solver failure is never a verdict
        return None
    tot = mu.sum()
    if tot <= 0:
        return None
    w = mu / tot
    return w, w @ D, med


def nnls_gram(D: np.ndarray, om: float, maxiter: int | None):
    """The same NNLS on ``G = D D^T + om^2 1 1^T = L L^T``: ``min ||L^T mu - L^-1 om^2 1||``
    (equal objectives up to a constant). None when G is not positive definite or NNLS fails."""
    from scipy.linalg import solve_triangular
    from scipy.optimize import nnls

    m = len(D)
    G = D @ D.T
    G += om * om
    try:
        L = np.linalg.cholesky(G)
        c = solve_triangular(L, np.full(m, om * om), lower=True)
        mu, _ = nnls(L.T, c, maxiter=maxiter or 50 * (2 * m + 1))
    except Exception:  # noqa: BLE001 — a solver failure is never a verdict
        return None
    tot = mu.sum()
    if not tot > 0:
        return None
    w = mu / tot
    return w, w @ D


__all__ = ["nnls_full", "nnls_gram", "nnls_nearest"]
