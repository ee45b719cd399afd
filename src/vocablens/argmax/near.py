"""Stage 1's judgement: the certificate ``y = qs q_t`` with its own score exact and the few pairs
the int8 bound cannot clear scored exactly.

The all-pairs stage computes every exact integer product ``q_j . q_t``. With ``z = qs q + e``
(``||e_j|| <= enorm_j <= emax``) and ``y = qs q_t``:

- a competitor's score is at most ``qs^2 (q_j . q_t) + emax ||y||`` (plus a float64 rounding term);
- the row's own score ``z_t . y`` is computed in float64 from the float32 row (its error bounded by
  ``(2 u32 + 2 r u64) ||z_t|| ||y||``), and the old integer bound ``qs^2 q_t . q_t - enorm_t ||y||``
  is kept where it is higher, so every row certified before is certified now.

Rows whose bound fails were stage 1's failures; many are beaten only by the rounding slack of a
few close rows, not by a real competitor (most of SmolLM2's: docs/performance-argmax.md). So the all-pairs pass also records, for
each row, the competitors whose integer product reaches the row's threshold
:meth:`Bounds.thresholds` (at most :data:`NEAR_CAP` per worker; a row with
more, such as a row near the centre, is left to the later stages), and :func:`judge` scores those
pairs exactly in float64 (each within ``(2 u32 + 2 r u64) ||z_j|| ||y||``). A row is certified when
every exactly scored competitor and the bound on all the others fall below its own lower bound.
The reflect stage's first scoring did the same work with one pass over all rows per 256 rows.
"""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.blocks import U64, exact_slack, rows_per_block, run_in_workers
from vocablens.argmax.scan import Scan

#: competitors recorded per row and worker at most; a row with more stays open (its pairs dropped)
NEAR_CAP = 64


def far_up(scan: Scan, s: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Upper bound (float64) on a competitor's score from its exact product ``s = q_j . q_t``:
    ``qs^2 s`` (rounded up) plus the grid's ``slack`` [n] (:class:`Bounds`)."""
    f = scan.white.grid_step * scan.white.grid_step * s.astype(np.float64)
    return f + np.abs(f) * 4 * U64 + slack


class Bounds:
    """Per-row float64 [n] figures of the stage-1 direction ``y = qs q_t`` (the grid row), from one
    pass over Z and Q: ``dg = q_t . q_t`` (exact), ``yn = ||y||``, ``own_q`` a lower bound on the
    row's own score ``z_t . y`` and ``slack_q = emax ||y||`` (the bound on ``|e_j . y|``);
    ``q_dot_max = max_t dg`` (the int8 scores' bound, :mod:`~vocablens.argmax.scoring`)."""

    def __init__(self, scan: Scan):
        n, r = scan.n, scan.r
        self.dg, self.own_q, self.yn = np.empty(n), np.empty(n), np.empty(n)
        Zn, Q = scan.Z.numpy(), scan.Q.numpy()
        step = rows_per_block(r, 8)
        starts = list(range(0, n, step))
        sl = exact_slack(r) * 1.01

        def block(s: int, _w: int) -> None:
            e = min(n, s + step)
            q = Q[s:e].astype(np.float64)
            d2 = np.einsum("ij,ij->i", q, q)
            self.dg[s:e] = d2
            q *= scan.white.grid_step                                      # y = qs q_t, float64
            yn = np.sqrt(d2) * scan.white.grid_step
            self.yn[s:e] = yn
            ex = np.einsum("ij,ij->i", Zn[s:e].astype(np.float64), q) - sl * scan.white.z_norm[s:e] * yn
            old = scan.white.grid_step * scan.white.grid_step * d2 - scan.white.grid_error[s:e] * yn * 1.001
            self.own_q[s:e] = np.maximum(ex, old)

        run_in_workers(starts, block, max(1, min(torch.get_num_threads(), len(starts))))
        self.slack_q = scan.white.grid_error_max * self.yn * 1.001
        self.q_dot_max = float(self.dg.max()) if n else 0.0       # max_t q_t . q_t, exact (the int8 scores' bound)

    def thresholds(self, scan: Scan) -> np.ndarray:
        """int64 [n]: the smallest integer product :func:`far_up` cannot clear: a competitor with
        ``q_j . q_t < T_t`` scores provably below the row's own lower bound (checked on the
        computed values)."""
        own, slack = self.own_q, self.slack_q
        x = (own - slack) / (scan.white.grid_step * scan.white.grid_step)
        T = np.floor(np.clip(x - np.abs(x) * 1e-12, -2.0 ** 40, 2.0 ** 40)).astype(np.int64)
        for _ in range(4):                                         # enforce far_up(T) < own exactly
            bad = far_up(scan, T, slack) >= own
            if not bad.any():
                break
            T[bad] -= 1 + np.abs(T[bad]) // 10 ** 9
        return np.clip(T + 1, -2 ** 31 + 2, 2 ** 31 - 1)


class NearPairs:
    """Collects, during the all-pairs pass, the pairs ``(t, j)`` with ``q_j . q_t >= T_t``.

    ``take`` runs inside a worker on one block of products ``S [bi, bc]`` (rows ``i0..``, columns
    ``c0..``, the diagonal already masked), reading the row maxima and column maxima the pass
    computes anyway, so a block costs two vector comparisons unless a row reaches its threshold."""

    def __init__(self, T: np.ndarray, workers: int, dtype: torch.dtype, device):
        self.T_np = T
        # int32 range (float32 holds the products exactly; any threshold above them is as good)
        self.T = torch.from_numpy(np.clip(T, -2 ** 31 + 2, 2 ** 31 - 1)).to(device=device, dtype=dtype)
        self.over = np.zeros(len(T), dtype=bool)        # rows with too many pairs: left open
        self.counts = [np.zeros(len(T), dtype=np.int32) for _ in range(workers)]
        self.pairs: list[list] = [[] for _ in range(workers)]

    def _side(self, M: torch.Tensor, lines: np.ndarray, base: int, w: int) -> None:
        """``M`` bool [k, c]: line k's competitors (offset ``base``) at or above its threshold."""
        cnt = M.sum(1).cpu().numpy()
        loc = self.counts[w]
        ok = (loc[lines] + cnt <= NEAR_CAP) & ~self.over[lines]
        self.over[lines[~ok]] = True
        if not ok.any():
            return
        loc[lines[ok]] += cnt[ok].astype(np.int32)
        kk, jj = torch.nonzero(M[torch.from_numpy(np.nonzero(ok)[0]).to(M.device)], as_tuple=True)
        self.pairs[w].append((lines[ok][kk.cpu().numpy()], jj.cpu().numpy().astype(np.int64) + base))

    def take(self, S: torch.Tensor, rmax: torch.Tensor, cmax: torch.Tensor, i0: int, c0: int, w: int) -> None:
        bi, bc = S.shape
        TI, TJ = self.T[i0:i0 + bi], self.T[c0:c0 + bc]
        # the block's rows (competitors: its columns), then its columns (competitors: its rows)
        for mx, T, own0, other0, above in (
                (rmax, TI, i0, c0, lambda f: S[f] >= TI[f, None]),
                (cmax, TJ, c0, i0, lambda f: (S[:, f] >= TJ[f][None, :]).T)):
            f = torch.nonzero(mx >= T).flatten()
            if not len(f):
                continue
            lines = f.cpu().numpy() + own0
            keep = ~self.over[lines]
            if keep.any():
                f = f[torch.from_numpy(np.nonzero(keep)[0]).to(f.device)]
                self._side(above(f), lines[keep], other0, w)

    def gathered(self):
        """``(t, j)`` int64 arrays of every recorded pair of the rows not left open."""
        ps = [p for lst in self.pairs for p in lst]
        if not ps:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        t = np.concatenate([p[0] for p in ps]).astype(np.int64)
        j = np.concatenate([p[1] for p in ps])
        keep = ~self.over[t]
        return t[keep], j[keep]


def exact_near(scan: Scan, t: np.ndarray, j: np.ndarray, yn: np.ndarray) -> np.ndarray:
    """float64 [n]: the largest upper bound on ``z_j . y_t`` (``y_t = qs q_t``) over each row's
    pairs ``(t, j)``, scored from the float32 rows in float64 (``-inf`` for rows without pairs)."""
    best = np.full(scan.n, -np.inf)
    if not len(t):
        return best
    Zn, Q = scan.Z.numpy(), scan.Q.numpy()
    step = rows_per_block(scan.r, 16)
    slack = exact_slack(scan.r) * 1.01
    for s in range(0, len(t), step):
        tt, jj = t[s:s + step], j[s:s + step]
        y = Q[tt].astype(np.float64)
        y *= scan.white.grid_step
        ex = np.einsum("ij,ij->i", Zn[jj].astype(np.float64), y)
        ex += slack * scan.white.z_norm[jj] * yn[tt]
        np.maximum.at(best, tt, ex)
    return best


def judge(scan: Scan, best: np.ndarray, complete: np.ndarray, b: Bounds, near: NearPairs | None):
    """Which rows (complete maxima only) the certificate ``y = qs q_t`` settles: every competitor
    provably below the row's own score, by the integer bound or, for the recorded near pairs,
    exactly.

    Returns ``(ok bool [n], margin float64 [n], bound_ratio float64 [n])``: the rows settled, their
    certified margins (whitened, no bias) and each margin over its rounding slack (0 for the rows
    not settled; stage verify re-checks the smallest in float64)."""
    best = np.where(np.isfinite(best), best, -2.0 ** 40)           # no competitor: the dtype's lowest
    live = complete & (b.dg > 0)
    m1 = b.own_q - far_up(scan, best, b.slack_q)
    ok = (m1 > 0) & live
    if near is not None:
        t, j = near.gathered()
        cand = ~ok & live & ~near.over
        T = near.T_np
        m_q = b.own_q - np.maximum(far_up(scan, T - 1, b.slack_q), exact_near(scan, t, j, b.yn))
        hit = cand & (m_q > 0)
        m1, ok = np.where(hit, m_q, m1), ok | hit
    return ok, m1, np.where(ok, m1 / (2 * b.slack_q + 1e-300), 0.0)


__all__ = ["NEAR_CAP", "Bounds", "NearPairs", "far_up", "judge"]
