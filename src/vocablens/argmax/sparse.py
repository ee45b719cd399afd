"""The sparse interior proof: a few competitors, the centroid, and a shared polytope or a tilted
combination for the rest.

For row t with whitened ``z_t``: NNLS over the rows scoring highest at ``z_t`` and the centroid 0 (the
mean of all distinct rows) leaves a gap g inside the centroid's share ``w0``; the point
``p = -g / w0`` must be shown inside the hull. Two ways:

- the :class:`Ball` (the means of the rows on either side of each whitened axis, built once per run
  and only when a gap is within its reach ``Whitening.ball_reach``: 2 n r d float64 FLOPs) holds p:
  a certificate in O(r^2);
- otherwise (the Ball is thin along p, as for the planted rows of the trained-like benchmark
  head) a tilted uniform combination of all rows reproduces p
  (:func:`~vocablens.argmax.tilt.tilt_points`, p being near the centre), in batches.

A point between a few rows and the centre (a planted midpoint, a barely trained row) then gets a
certificate without an NNLS of support r + 1 (seconds per row at r = 896).
"""

from __future__ import annotations

import numpy as np

from vocablens.argmax.nnls import nnls_nearest, nnls_gram
from vocablens.argmax.blocks import U64, rows_per_block
from vocablens.argmax.decisions import Dominated, dominated
from vocablens.argmax.scan import Scan

#: competitors of the sparse first try (screen in the reflect stage, first round of a proof)
SPARSE_COLS = 32


class Ball:
    """A shared inner polytope of the hull: for each whitened axis k the mean of the distinct rows
    with ``Q[j, k] > 0`` (``q_k``) and the mean of the others (exactly ``-gamma_k q_k``, since the
    rows are centred). Any v with ``a = Q^{-1} v`` and ``sum_k beta_k <= 1`` (``beta_k = a_k``, or
    ``-a_k / gamma_k`` when negative) is ``sum beta_k (half-space mean) + (1 - sum beta) 0``: a point
    of the hull, with a certificate in O(r^2). Built once per run (2 n r d float64 FLOPs)."""

    def __init__(self, scan: Scan):
        n, r, d = scan.n, scan.r, scan.d
        pos_sum = np.zeros((r, d))
        self.size = np.zeros(r)
        step = rows_per_block(max(r, d))                               # float64 blocks
        for s in range(0, n, step):
            scan.check_time()
            B = (scan.q_rows(s, s + step) > 0).double().numpy()         # [c, r]
            pos_sum += B.T @ scan.source.rows[scan.distinct.ids[s:s + step]].astype(np.float64)
            scan.release(s, s + step)                                   # W's pages back (Z is resident)
            self.size += B.sum(0)
        self.ok = bool((self.size > 0).all() and (self.size < n).all())
        if not self.ok:
            return
        total = n * scan.white.center
        self.mean_pos = pos_sum / self.size[:, None]                      # [r, d] original coords
        self.mean_neg = (total - pos_sum) / (n - self.size)[:, None]
        self.gamma = self.size / (n - self.size)
        Qm = (self.mean_pos - scan.white.center) @ scan.white.whiten                               # [r(k), r]
        cond = np.linalg.cond(Qm)
        self.ok = bool(np.isfinite(cond) and cond < 1e8)
        if self.ok:
            self.Qinv = np.linalg.inv(Qm.T)                               # a = Q^{-1} v

    def weights(self, v: np.ndarray) -> np.ndarray | None:
        """Signed weights h [r] (h_k > 0: on the positive half's mean, < 0: on the other half's)
        with ``sum |h| <= 1`` that represent v, or None when v is outside the inner polytope."""
        a = self.Qinv @ v
        h = np.where(a >= 0, a, a / self.gamma)
        return h if float(np.abs(h).sum()) <= 1.0 - 1e-9 else None


class InteriorParts:
    """What the interior proofs of one scan without bias build once, on first use: the
    :class:`Ball` (stages reflect and proof) and the tilt's sums (:func:`~vocablens.argmax.tilt.sums`,
    stage proof). Made by the driver, filled only by its own methods."""

    def __init__(self):
        self._ball = None           # None: not built; False: not buildable (n <= r + 1)
        self._sums = None

    def ball(self, scan: Scan) -> Ball | None:
        """The scan's Ball (built now if not yet), or None where it is unusable."""
        if self._ball is None:
            self._ball = Ball(scan) if scan.n > scan.r + 1 else False
        return self._ball if self._ball and self._ball.ok else None

    def ball_unusable(self) -> bool:
        """Whether the Ball was built (or found unbuildable) and cannot be used."""
        return self._ball is False or (self._ball is not None and not self._ball.ok)

    def sums(self, scan: Scan):
        """The tilt's sums over the distinct rows (:func:`~vocablens.argmax.tilt.sums`), made once."""
        if self._sums is None:
            from vocablens.argmax.tilt import sums

            self._sums = sums(scan)
        return self._sums


def _ball_off(scan: Scan, parts: InteriorParts | None) -> bool:
    """Whether the sparse proof cannot run: a bias takes part, or the Ball was built and is unusable."""
    return scan.source.bias is not None or parts is None or parts.ball_unusable()


def sparse_hint(scan: Scan, parts: InteriorParts | None, k: int, Spos: np.ndarray) -> bool:
    """Whether :func:`sparse_certificate` can work for row k: the same NNLS and Ball test on the
    float32 whitened rows (no rows read from W), with room for their rounding. Only a filter: a
    False leaves the row to the proof stage's NNLS rounds, a True is followed by the float64 proof."""
    if _ball_off(scan, parts):
        return False
    Zn = scan.Z.numpy()
    zt = Zn[k].astype(np.float64)
    D = np.vstack([Zn[Spos].astype(np.float64) - zt, -zt[None, :]])
    om = 10.0 * float(np.median(np.linalg.norm(D, axis=1))) + 1e-30
    out = nnls_gram(D, om, 20 * (len(D) + scan.r))      # the Gram solve: its precision is enough here
    if out is None:
        return True                                     # undecided by the filter: try the proof
    w, g = out
    w0 = float(w[-1])
    # a gap within the Ball's reach: the Ball or, where it is thin, the tilt (gap_tilts) may hold it
    return w0 > 0 and float(np.linalg.norm(g)) <= w0 * scan.white.ball_reach * 1.001


def sparse_certificate(scan: Scan, parts: InteriorParts | None, k: int, Spos: np.ndarray, z64=None,
                       pending: list | None = None) -> Dominated | None:
    """Prove row k interior from a few competitors: NNLS over ``Spos`` and the centroid 0 (the mean
    of all distinct rows), then the :class:`Ball` absorbs the remaining gap inside the centroid's
    share. Returns the row's certificate (stage ``proof``), or None (no verdict).

    The combination includes row k itself (through the means) with weight ``omega < 1``; removing
    it and renormalising gives a combination of the other rows (``ArgmaxResult.combination``).
    ``z64``: optional ``positions -> float64 whitened rows`` (default :meth:`Scan.z64`; a batch
    of calls shares one computed from W at once). ``pending``: where the Ball does not hold the gap,
    ``(k, positions, weights, w0)`` is appended for :func:`gap_tilts` (one batch for many rows).
    """
    if _ball_off(scan, parts):
        return None
    z64 = z64 or scan.z64
    zt = z64([k])[0]
    D = np.vstack([z64(Spos) - zt, -zt[None, :]])
    out = nnls_nearest(D, maxiter=20 * (len(D) + scan.r))
    if out is None:
        return None
    w, g, _ = out
    w0 = float(w[-1])
    if w0 <= 0 or float(np.linalg.norm(g)) > w0 * scan.white.ball_reach:
        return None                     # the gap is beyond any point of the Ball: do not build it
    ball = parts.ball(scan)
    h = None if ball is None else ball.weights(-g / w0)
    keep = w[:-1] > 0
    pos, wj = Spos[keep], w[:-1][keep]
    if h is None:
        if pending is not None:
            pending.append((int(k), pos, wj, w0))
        return None
    t = int(scan.distinct.ids[k])
    h = w0 * h
    m_all = w0 - float(np.abs(h).sum())
    rn, omega = _structured_residual(scan, ball, t, pos, wj, m_all, h)
    if not rn <= scan.tol * scan.white.w_scale:
        return None
    return dominated(t, scan.distinct.ids[pos], wj, rn, 3, (m_all, h))


def gap_tilts(scan: Scan, parts: InteriorParts, pending: list) -> dict:
    """Certificates for the rows of ``pending`` (from :func:`sparse_certificate`) whose gap point
    ``p = (w_t - sum_S mu_j w_j) / w0`` a tilted combination of all rows reproduces
    (:func:`~vocablens.argmax.tilt.tilt_points`, the row itself excluded): ``w_t = sum_S mu_j w_j +
    w0 sum lambda_j w_j``, residual ``<= w0 rn`` plus the float64 error of p. Returns position ->
    :class:`~vocablens.argmax.decisions.Dominated` (the explicit part in ``ids``/``weights``, the tilt
    scaled by w0 in ``tilt``).
    """
    from vocablens.argmax.tilt import tilt_points

    if not pending or scan.source.bias is not None or scan.n <= scan.r + 2:
        return {}
    ks = np.array([p[0] for p in pending], dtype=np.int64)
    Wt = scan.rows64(scan.distinct.ids[ks])                                       # [m, d]
    Pw, err = np.empty_like(Wt), np.empty(len(ks))
    for i, (k, pos, wj, w0) in enumerate(pending):
        WS = scan.rows64(scan.distinct.ids[pos])
        Pw[i] = (Wt[i] - wj @ WS) / w0
        err[i] = 4 * (len(pos) + scan.d + 2) * U64 * (np.linalg.norm(Wt[i]) + wj @ np.linalg.norm(WS, axis=1))
    sol = tilt_points(scan, parts.sums(scan), (Pw - scan.white.center) @ scan.white.whiten, Pw, [np.array([k]) for k in ks])
    done = {}
    for (k, pos, wj, w0), e, got in zip(pending, err, sol):
        if got is None:
            continue
        a, u, E, rn = got
        rt = w0 * rn + e
        if rt <= scan.tol * scan.white.w_scale:
            t = int(scan.distinct.ids[k])
            done[int(k)] = dominated(t, scan.distinct.ids[pos], wj, rt, 3,
                                     tilt=(float(a * w0), u * w0, scan.distinct.ids[E]))
    return done


def _structured_residual(scan: Scan, ball: Ball, t: int, pos, wj, m_all: float, h: np.ndarray):
    """float64 residual ``||w_t - combination of the other rows||`` in the original coordinates."""
    x = scan.rows64(scan.distinct.ids[pos]).T @ wj + m_all * scan.white.center
    x += np.clip(h, 0, None) @ ball.mean_pos + np.clip(-h, 0, None) @ ball.mean_neg
    k = int(scan.distinct.position[t])
    qt = scan.q_rows(k, k + 1)[0].numpy() > 0
    sizes = np.where(h >= 0, ball.size, scan.n - ball.size)
    inside = np.where(h >= 0, qt, ~qt)
    omega = m_all / scan.n + float((np.abs(h) * inside / sizes).sum())
    wt = scan.rows64([t])[0]
    return float(np.linalg.norm(x - wt)) / (1.0 - omega), omega


def screen_interior(scan: Scan, parts: InteriorParts, cols: np.ndarray, top: np.ndarray):
    """Quick interior proofs inside the reflect stage (:func:`sparse_certificate` with the
    :data:`SPARSE_COLS` highest scoring rows).

    Args:
        cols: positions (into ``reps``) [m]; top: int64 [m, k], the rows scoring highest at
            ``y = z_t`` (best first, the row itself left out).

    Returns:
        ``(settled bool [m], certificates)``: the rows proved here and their
        :class:`~vocablens.argmax.decisions.Dominated`, in order.
    """
    ok = np.zeros(len(cols), dtype=bool)
    certs: list = []
    if scan.n < 3 or scan.n <= scan.r + 1 or _ball_off(scan, parts):
        return ok, certs
    top = np.asarray(top)[:, :SPARSE_COLS]
    cols = np.asarray(cols, dtype=np.int64)
    try_ = np.array([q for q in range(len(cols)) if scan.time_left() > 0 and sparse_hint(scan, parts, int(cols[q]), top[q])],
                    dtype=np.int64)
    if not len(try_):
        return ok, certs
    need = np.unique(np.concatenate([cols[try_], top[try_].ravel()]))
    Zb = scan.z64(need)                           # every row the float64 proofs read, one product

    def z64(pos):
        return Zb[np.searchsorted(need, np.asarray(pos, dtype=np.int64))]

    for q in try_:
        if scan.time_left() <= 0:
            break                               # the reflect stage records the cut
        cert = sparse_certificate(scan, parts, int(cols[q]), top[q], z64)
        if cert is not None:
            ok[q] = True
            certs.append(cert)
    return ok, certs


__all__ = ["SPARSE_COLS", "Ball", "InteriorParts", "gap_tilts", "screen_interior", "sparse_certificate", "sparse_hint"]
