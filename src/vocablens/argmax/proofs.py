"""Exact proofs for the rows the certificate stages left open: stage ``proof`` (no bias).

No bias (stage ``proof``), for row t with whitened ``z_t`` (the rows are centred: their mean is 0):

1. Sparse first try (:func:`sparse_certificate`, also run inside the reflect stage): NNLS over the
   32 rows that score highest at ``z_t`` and the centroid 0, then a shared inner polytope
   (:class:`Ball`: the means of the rows on either side of each whitened axis, built once per run,
   and only when a gap is within its reach ``ScanState.ball_reach``: 2 n r d float64 FLOPs that a
   head with no interior row, like SmolLM2's, never needs)
   absorbs the remaining gap inside the centroid's share. A point that sits between a few rows and
   the centre (a planted midpoint, a barely trained row) gets a certificate in O(k r^2) instead of
   an NNLS with support r + 1.
2. Column generation: NNLS over a set S of competitors (first the :data:`START_COLS` highest scoring),
   minimising ``||sum_j mu_j (z_j - z_t)||^2 + omega^2 (sum mu - 1)^2``. Either the normalised
   weights reach ``z_t`` (residual <= ``tol``: not argmaxable, the convex combination is the
   certificate) or ``y = z_t - (nearest hull point)`` separates t from S; one product with all rows
   tells whether it separates t from every row (argmaxable, ``y`` is the certificate) or which rows
   to add (the most violated: the set grows by :data:`GROWTH`). HiGHS LP as the fallback.

Work is shared across rows: rows are proved in batches of 64; their first competitors come from one
``Z Z_B^T`` product and each round checks the whole batch's directions with one ``Z Y`` product.
Every not-argmaxable certificate is re-checked in float64 in the original coordinates. A solver
failure never becomes a verdict; a row over its own time budget is ``undecided``. The LPs (the
fallback here, and stage ``bias``) are in :mod:`~vocablens.argmax.lp`.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vocablens.argmax.lp import lp_proof, slack
from vocablens.argmax.state import ScanState, rows_per_block, scores_against
from vocablens.argmax.tilt import tilt_proofs

#: rows proved together (one product for their start sets, one per round for their directions)
BATCH = 64
#: competitors of the sparse first try (screen in the reflect stage, first round of a proof)
SPARSE_COLS = 32
#: competitors a proof starts from (the highest scoring at ``y = z_t``): most rows the certificate
#: stages leave are argmaxable, and the nearest point of a few dozen competitors already separates
#: them; a row inside the hull needs up to r + 1, reached by growing the set (:data:`GROWTH`)
START_COLS = 32
#: rows added to a proof's set per round: the most violated, at least 32 and at most half the set
#: (so an interior row's support of r + 1 is reached in O(log r) rounds), never more than 500
GROWTH = (32, 0.5, 500)
#: a proof's direction that at least 1 / INSIDE_HINT of all rows beat marks a row that is probably
#: inside the hull: its set then grows to 2 (r + 1) at once instead of by :data:`GROWTH`
INSIDE_HINT = 8


# ----------------------------------------------------------------------------------------- NNLS
def _nnls(D: np.ndarray, maxiter: int | None = None):
    """Nearest point to z_t of the hull of the columns in the NNLS metric.

    Args:
        D: float64 [m, r] rows ``p_j - z_t`` for hull points p_j.

    Returns:
        ``(w [m], g [r], scale)``: normalised weights (sum 1), the gap ``g = sum w_j p_j - z_t``
        and the median column norm; None when NNLS fails.

    With few columns (m <= r / 2) the problem is solved on its Gram matrix first (an NNLS of size
    m x m after one O(m^2 r) product; measured: 0.5 against 1.6 ms at m = 64, r = 896, the same
    as the [r + 1, m] system at m ~ 32); squaring the condition number costs precision,
    so when that gap comes out small (the row may be inside) the [r + 1, m] system is solved as
    before, and an interior certificate always comes from it. A direction from the Gram solve only
    has to separate, and the next product checks that it does.
    """
    dn = np.linalg.norm(D, axis=1)
    med = float(np.median(dn)) + 1e-30
    om = 10.0 * med
    m, r = D.shape
    if m <= r // 2:
        out = _nnls_gram(D, om, maxiter)
        if out is not None and float(np.linalg.norm(out[1])) > 1e-4 * med:
            return out[0], out[1], med
    return _nnls_full(D, om, med, maxiter)


def _nnls_full(D: np.ndarray, om: float, med: float, maxiter: int | None):
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


def _nnls_gram(D: np.ndarray, om: float, maxiter: int | None):
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


class Ball:
    """A shared inner polytope of the hull: for each whitened axis k the mean of the distinct rows
    with ``Q[j, k] > 0`` (``q_k``) and the mean of the others (exactly ``-gamma_k q_k``, since the
    rows are centred). Any v with ``a = Q^{-1} v`` and ``sum_k beta_k <= 1`` (``beta_k = a_k``, or
    ``-a_k / gamma_k`` when negative) is ``sum beta_k (half-space mean) + (1 - sum beta) 0``: a point
    of the hull, with a certificate in O(r^2). Built once per run (2 n r d float64 FLOPs)."""

    def __init__(self, st: ScanState):
        n, r, d = st.n, st.r, st.d
        pos_sum = np.zeros((r, d))
        self.size = np.zeros(r)
        step = rows_per_block(max(r, d))                               # float64 blocks
        for s in range(0, n, step):
            st.check_time()
            B = (st.q_rows(s, s + step) > 0).double().numpy()         # [c, r]
            pos_sum += B.T @ st.Wn[st.reps[s:s + step]].astype(np.float64)
            st.release(s, s + step)                                   # W's pages back (Z is resident)
            self.size += B.sum(0)
        self.ok = bool((self.size > 0).all() and (self.size < n).all())
        if not self.ok:
            return
        total = n * st.mu
        self.mean_pos = pos_sum / self.size[:, None]                      # [r, d] original coords
        self.mean_neg = (total - pos_sum) / (n - self.size)[:, None]
        self.gamma = self.size / (n - self.size)
        Qm = (self.mean_pos - st.mu) @ st.A                               # [r(k), r]
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


def _ball(st: ScanState) -> Ball | None:
    if st.ball is None:
        st.ball = Ball(st) if st.n > st.r + 1 else False
    return st.ball if st.ball and st.ball.ok else None


def sparse_hint(st: ScanState, k: int, Spos: np.ndarray) -> bool:
    """Whether :func:`sparse_certificate` can work for row k: the same NNLS and Ball test on the
    float32 whitened rows (no rows read from W), with room for their rounding. Only a filter: a
    False leaves the row to the proof stage's NNLS rounds, a True is followed by the float64 proof."""
    if st.bn is not None or st.ball is False or (st.ball is not None and not st.ball.ok):
        return False
    Zn = st.Zt.numpy()
    zt = Zn[k].astype(np.float64)
    D = np.vstack([Zn[Spos].astype(np.float64) - zt, -zt[None, :]])
    om = 10.0 * float(np.median(np.linalg.norm(D, axis=1))) + 1e-30
    out = _nnls_gram(D, om, 20 * (len(D) + st.r))      # the Gram solve: its precision is enough here
    if out is None:
        return True                                     # undecided by the filter: try the proof
    w, g = out
    w0 = float(w[-1])
    if w0 <= 0 or float(np.linalg.norm(g)) > w0 * st.ball_reach * 1.001:
        return False
    ball = _ball(st)
    return ball is not None and ball.weights(-g / w0 * (1 - 1e-3)) is not None


def sparse_certificate(st: ScanState, k: int, Spos: np.ndarray, z64=None) -> bool:
    """Prove row k interior from a few competitors: NNLS over ``Spos`` and the centroid 0 (the mean
    of all distinct rows), then the :class:`Ball` absorbs the remaining gap inside the centroid's
    share. Settles the row (stage ``proof``) and returns True, or returns False (no verdict).

    The combination includes row k itself (through the means) with weight ``omega < 1``; removing
    it and renormalising gives a combination of the other rows (``ArgmaxResult.combination``).
    ``z64``: optional ``positions -> float64 whitened rows`` (default :meth:`ScanState.z64`; a batch
    of calls shares one computed from W at once).
    """
    if st.bn is not None or st.ball is False or (st.ball is not None and not st.ball.ok):
        return False
    z64 = z64 or st.z64
    zt = z64([k])[0]
    D = np.vstack([z64(Spos) - zt, -zt[None, :]])
    out = _nnls(D, maxiter=20 * (len(D) + st.r))
    if out is None:
        return False
    w, g, _ = out
    w0 = float(w[-1])
    if w0 <= 0 or float(np.linalg.norm(g)) > w0 * st.ball_reach:
        return False                    # the gap is beyond any point of the Ball: do not build it
    ball = _ball(st)
    if ball is None:
        return False
    h = ball.weights(-g / w0)
    if h is None:
        return False
    t = int(st.reps[k])
    keep = w[:-1] > 0
    pos, wj = Spos[keep], w[:-1][keep]
    h = w0 * h
    m_all = w0 - float(np.abs(h).sum())
    rn, omega = _structured_residual(st, ball, t, pos, wj, m_all, h)
    if not rn <= st.tol * st.wscale:
        return False
    st.settle_unarg(t, st.reps[pos], wj, rn, 3, (m_all, h))
    return True


def _structured_residual(st: ScanState, ball: Ball, t: int, pos, wj, m_all: float, h: np.ndarray):
    """float64 residual ``||w_t - combination of the other rows||`` in the original coordinates."""
    x = st.rows64(st.reps[pos]).T @ wj + m_all * st.mu
    x += np.clip(h, 0, None) @ ball.mean_pos + np.clip(-h, 0, None) @ ball.mean_neg
    k = int(st.row_of[t])
    qt = st.q_rows(k, k + 1)[0].numpy() > 0
    sizes = np.where(h >= 0, ball.size, st.n - ball.size)
    inside = np.where(h >= 0, qt, ~qt)
    omega = m_all / st.n + float((np.abs(h) * inside / sizes).sum())
    wt = st.rows64([t])[0]
    return float(np.linalg.norm(x - wt)) / (1.0 - omega), omega


def screen_interior(st: ScanState, cols: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Quick interior proofs inside the reflect stage (:func:`sparse_certificate` with the
    :data:`SPARSE_COLS` highest scoring rows).

    Args:
        cols: positions (into ``reps``) [m]; top: int64 [m, k], the rows scoring highest at
            ``y = z_t`` (best first, the row itself left out).

    Returns:
        bool [m], the rows settled here.
    """
    ok = np.zeros(len(cols), dtype=bool)
    if st.n < 3 or st.n <= st.r + 1 or st.ball is False or (st.ball is not None and not st.ball.ok):
        return ok
    top = np.asarray(top)[:, :SPARSE_COLS]
    cols = np.asarray(cols, dtype=np.int64)
    try_ = np.array([q for q in range(len(cols)) if st.time_left() > 0 and sparse_hint(st, int(cols[q]), top[q])],
                    dtype=np.int64)
    if not len(try_):
        return ok
    need = np.unique(np.concatenate([cols[try_], top[try_].ravel()]))
    Zb = st.z64(need)                           # every row the float64 proofs read, one product

    def z64(pos):
        return Zb[np.searchsorted(need, np.asarray(pos, dtype=np.int64))]

    for q in try_:
        if st.time_left() <= 0:
            break                               # the reflect stage records the cut
        ok[q] = sparse_certificate(st, int(cols[q]), top[q], z64)
    return ok


# ----------------------------------------------------------------------------------------- stage proof
class _Row:
    """Column-generation state of one row."""

    __slots__ = ("k", "S", "Sset", "spent", "rounds", "y")

    def __init__(self, k: int, S: np.ndarray):
        self.k, self.S, self.Sset = k, S, set(S.tolist())
        self.spent, self.rounds, self.y = 0.0, 0, None        # spent: seconds of its own NNLS rounds


def stage_proof(st: ScanState, max_rounds: int, row_budget_s: float | None) -> dict:
    """Prove every row in ``st.left`` (deferred rows last). Returns the no-bias failures
    ``token -> (ids, weights)`` when a bias takes part (the bias stage decides them).

    Raises:
        OutOfTime: the run's budget ran out (rows not settled stay open).
    """
    n, r, Zt = st.n, st.r, st.Zt
    rows = st.left
    if st.defer is not None and len(rows):
        rows = rows[np.argsort(st.defer[st.reps[rows]], kind="stable")]
    fails: dict = {}
    rows = tilt_proofs(st, rows)            # rows near the centre: one dense combination each
    n0 = min(n - 1, max(START_COLS, SPARSE_COLS))
    per = rows_per_block(n, 4, most=BATCH)          # columns of one [n, per] float32 score block
    for b0 in range(0, len(rows), BATCH):
        st.check_time()
        ks = rows[b0:b0 + BATCH]
        kept = {int(k): st.start_top.pop(int(k)) for k in ks if int(k) in st.start_top and
                len(st.start_top[int(k)][0]) >= n0}         # the reflect stage's scores at z_t
        need = np.array([k for k in ks if int(k) not in kept], dtype=np.int64)
        fresh = np.concatenate([_start_sets(Zt, need[j:j + per], n0) for j in range(0, len(need), per)]) \
            if len(need) else np.zeros((0, n0), dtype=np.int64)
        got = dict(zip(need.tolist(), fresh))
        active = []
        for k in ks:
            st.check_time()
            top, screened = kept.get(int(k), (got.get(int(k)), False))
            top = np.asarray(top[:n0], dtype=np.int64)
            if screened or not (sparse_hint(st, int(k), top[:SPARSE_COLS]) and
                                sparse_certificate(st, int(k), top[:SPARSE_COLS])):
                active.append(_Row(int(k), top))
        while active:
            probe = []
            for row in active:
                st.check_time()                  # once per row and round
                t_row = time.perf_counter()
                if _round(st, row, fails):
                    probe.append(row)
                row.spent += time.perf_counter() - t_row
            active = _check_directions(st, probe, max_rounds, row_budget_s, fails)
        st.progress("proof", min(b0 + BATCH, len(rows)), len(rows))
    return fails


def _start_sets(Zt: torch.Tensor, ks: np.ndarray, n0: int) -> np.ndarray:
    """The ``n0`` rows scoring highest at ``z_k`` for each k in ks (k itself left out): int64 [len(ks), n0].
    Scores [B, n] by numpy's GEMM (faster here than torch's for these shapes, measured)."""
    Zn = Zt.numpy()
    S0 = scores_against(Zn[ks], Zn)                              # [B, n]
    S0[np.arange(len(ks)), ks] = -np.inf
    return torch.topk(torch.from_numpy(S0), n0, dim=1).indices.numpy()     # [B, n0], best first


def _round(st: ScanState, row: _Row, fails: dict) -> bool:
    """One float64 NNLS round; settles the row (False) or leaves a direction to check (True)."""
    k = row.k
    zt = st.z64([k])[0]
    D = st.z64(row.S)
    D -= zt                                      # in place: [|S|, r] float64 is the stage's largest array
    out = _nnls(D)
    if out is None:
        _fallback(st, row, "NNLS failed", fails)
        return False
    w, g, med = out
    if np.linalg.norm(g) <= st.tol * med:
        sup = w > 0
        _interior_found(st, k, row.S[sup], w[sup], fails)
        return False
    row.y = -g
    return True


def _interior_found(st: ScanState, k: int, pos: np.ndarray, w: np.ndarray, fails: dict) -> None:
    t = int(st.reps[k])
    ids = st.reps[pos]
    rvec = st.rows64(ids).T @ w - st.rows64([t])[0]
    rn = float(np.linalg.norm(rvec))
    if rn > st.tol * st.wscale:
        st.reasons[t] = f"convex combination found but its residual {rn:.3g} exceeds the tolerance"
    elif st.bn is None:
        st.settle_unarg(t, ids, w, rn, 3)
    else:
        fails[t] = (ids, w)


def _check_directions(st: ScanState, probe: list, max_rounds: int, row_budget_s, fails: dict) -> list:
    """``Z Y`` products for the batch's directions (as many columns at a time as fit one block):
    settle the separated rows, extend the rest; returns the rows still open."""
    nxt: list = []
    per = rows_per_block(st.n, 4, most=BATCH)       # columns of one [n, per] float32 score block
    for j in range(0, len(probe), per):
        _check_some(st, probe[j:j + per], max_rounds, row_budget_s, fails, nxt)
    return nxt


def _check_some(st: ScanState, probe: list, max_rounds: int, row_budget_s, fails: dict, nxt: list) -> None:
    """One ``Y^T Z^T`` product [len(probe), n]; the rows to extend are appended to ``nxt``."""
    Y = torch.from_numpy(np.stack([row.y for row in probe], axis=1)).float()   # [r, m]
    sl = slack(st, Y)
    SC = scores_against(Y.numpy().T, st.Zt.numpy())              # [m, n] (numpy's GEMM: faster here)
    for q, row in enumerate(probe):
        sc = SC[q].astype(np.float64)
        own = sc[row.k]
        sc[row.k] = -np.inf
        viol = np.nonzero(sc >= own - sl[q])[0]
        t = int(st.reps[row.k])
        if len(viol) == 0:
            # report the certificate at the token's own whitened norm (margins comparable to stage 1)
            y = row.y                                            # float64; Y is its float32 copy
            f = float(np.linalg.norm(st.z64([row.k])[0])) / float(np.linalg.norm(y))
            st.settle_arg_y(t, 3, f * y, f * float(own - sc.max()))
            continue
        lo, frac, hi = GROWTH
        grow = min(hi, max(lo, int(frac * len(row.S))))
        if len(viol) * INSIDE_HINT >= st.n:          # a direction most rows beat: the row looks inside,
            grow = max(grow, 2 * (st.r + 1) - len(row.S))   # whose support is up to r + 1: go there at once
        if len(viol) > grow + len(row.S):         # the most violated grow + |S| hold grow new ones
            viol = viol[np.argpartition(-sc[viol], grow + len(row.S))[:grow + len(row.S)]]
        new = [v for v in viol[np.argsort(-sc[viol], kind="stable")].tolist() if v not in row.Sset][:grow]
        row.rounds += 1
        if not new:
            _fallback(st, row, "NNLS column generation stalled", fails)
        elif row.rounds >= max_rounds:
            _fallback(st, row, "NNLS did not converge", fails)
        elif row_budget_s is not None and row.spent > row_budget_s:
            st.reasons[t] = f"row budget: not decided within {row_budget_s:g} s"
        else:
            row.Sset.update(new)
            row.S = np.concatenate([row.S, np.array(new, dtype=np.int64)])
            nxt.append(row)


def _fallback(st: ScanState, row: _Row, why: str, fails: dict) -> None:
    """A HiGHS LP on the row's set; settles the row or records why not."""
    k, t = row.k, int(st.reps[row.k])
    res = lp_proof(st, None, k, row.S, max_rounds=40)
    if res[0] == "arg":
        zt = st.z64([k])[0]
        f = float(np.linalg.norm(zt)) / float(np.linalg.norm(res[1]))
        st.settle_arg_y(t, 3, f * res[1], f * res[3])
    elif res[0] == "int":
        _interior_found(st, k, res[1], res[2], fails)
    else:
        st.reasons[t] = f"{why}; LP: {res[1]}"


__all__ = ["Ball", "screen_interior", "sparse_certificate", "stage_proof"]
