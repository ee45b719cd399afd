"""Exact proofs for the rows the certificate stages left open: stage ``proof`` (no bias).

No bias (stage ``proof``), for row t with whitened ``z_t`` (the rows are centred: their mean is 0):

1. Sparse first try (:mod:`~vocablens.argmax.sparse`, also run inside the reflect stage): NNLS
   over the 32 rows that score highest at ``z_t`` and the centroid 0; the gap left inside the
   centroid's share is held by a shared inner polytope (the Ball) or, where the Ball is thin, by a
   tilted combination of all rows (:func:`~vocablens.argmax.sparse.gap_tilts`, one batch per proof
   batch). A point that sits between a few rows and the centre (a planted midpoint, a barely
   trained row) gets a certificate without an NNLS of support r + 1.
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
from vocablens.argmax.nnls import nnls_nearest
from vocablens.argmax.sparse import SPARSE_COLS, Ball, gap_tilts, screen_interior, sparse_certificate, sparse_hint  # noqa: F401
from vocablens.argmax.tilt import tilt_proofs

#: rows proved together (one product for their start sets, one per round for their directions)
BATCH = 64
#: competitors a proof starts from (the highest scoring at ``y = z_t``): most rows the certificate
#: stages leave are argmaxable, and the nearest point of a few dozen competitors already separates
#: them; a row inside the hull needs up to r + 1, reached by growing the set (:data:`GROWTH`)
START_COLS = 32
#: rows added to a proof's set per round: the most violated, at least 32 and at most half the set
#: (so an interior row's support of r + 1 is reached in O(log r) rounds), never more than 500
GROWTH = (32, 0.5, 500)
#: a proof's direction that at least 1 / INSIDE_HINT of all rows beat marks a row that is probably
#: inside the hull (or just outside): its set then grows to r / 2 at once, and from there to
#: 2 (r + 1), instead of by :data:`GROWTH`
INSIDE_HINT = 8
#: memory for the float64 whitened rows of the batch's proof sets kept between rounds (a set only
#: grows, so a round computes ``z64`` of its new rows only; an interior row's set reaches 2 (r + 1))
ROW_CACHE_BYTES = 512 << 20


# ----------------------------------------------------------------------------------------- stage proof
class _Row:
    """Column-generation state of one row."""

    __slots__ = ("k", "S", "Sset", "spent", "rounds", "y", "Z")

    def __init__(self, k: int, S: np.ndarray):
        self.k, self.S, self.Sset = k, S, set(S.tolist())
        self.spent, self.rounds, self.y = 0.0, 0, None        # spent: seconds of its own NNLS rounds
        self.Z = None                       # float64 whitened rows of S[:len(Z)] (S only grows)

    def z_set(self, st: ScanState, room: list) -> np.ndarray:
        """``z64(S)`` [|S|, r] float64: the rows added since the last round computed, the rest kept
        while the batch's kept rows fit ``room[0]`` bytes (:data:`ROW_CACHE_BYTES`)."""
        have = 0 if self.Z is None else len(self.Z)
        new = st.z64(self.S[have:])
        Z = new if not have else np.vstack([self.Z, new])
        grow = Z.nbytes - (0 if self.Z is None else self.Z.nbytes)
        if grow <= room[0]:
            room[0] -= grow
            self.Z = Z
        else:
            room[0] += 0 if self.Z is None else self.Z.nbytes
            self.Z = None
        return Z


def stage_proof(st: ScanState, max_rounds: int, row_budget_s: float | None) -> dict:
    """Prove every row in ``st.left`` (deferred rows last). Returns the no-bias failures
    ``token -> (ids, weights)`` when a bias takes part (the bias stage decides them).

    Raises:
        OutOfTime: the run's budget ran out (rows not settled stay open).
    """
    n, r, Zt = st.n, st.r, st.Z
    rows = st.left
    if st.src.defer is not None and len(rows):
        rows = rows[np.argsort(st.src.defer[st.distinct.ids[rows]], kind="stable")]
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
        active, pending = [], []
        for k in ks:
            st.check_time()
            top, _ = kept.get(int(k), (got.get(int(k)), False))
            top = np.asarray(top[:n0], dtype=np.int64)
            if not (sparse_hint(st, int(k), top[:SPARSE_COLS]) and
                    sparse_certificate(st, int(k), top[:SPARSE_COLS], pending=pending)):
                active.append(_Row(int(k), top))
        tilted = gap_tilts(st, pending)             # the gaps the Ball does not hold, one batch
        active = [row for row in active if row.k not in tilted]
        while active:
            probe = []
            room = [ROW_CACHE_BYTES - sum(row.Z.nbytes for row in active if row.Z is not None)]
            for row in active:
                st.check_time()                  # once per row and round
                t_row = time.perf_counter()
                if _round(st, row, fails, room):
                    probe.append(row)
                row.spent += time.perf_counter() - t_row
            active = _check_directions(st, probe, max_rounds, row_budget_s, fails)
        st.progress("proof", min(b0 + BATCH, len(rows)), len(rows))
    return fails


def _start_sets(Zt: torch.Tensor, ks: np.ndarray, n0: int) -> np.ndarray:
    """The ``n0`` rows scoring highest at ``z_k`` for each k in ks (k itself left out): int64 [len(ks), n0].
    Scores [B, n] by numpy's GEMM (faster than torch's for these shapes)."""
    Zn = Zt.numpy()
    S0 = scores_against(Zn[ks], Zn)                              # [B, n]
    S0[np.arange(len(ks)), ks] = -np.inf
    return torch.topk(torch.from_numpy(S0), n0, dim=1).indices.numpy()     # [B, n0], best first


def _round(st: ScanState, row: _Row, fails: dict, room: list) -> bool:
    """One float64 NNLS round; settles the row (False) or leaves a direction to check (True)."""
    k = row.k
    zt = st.z64([k])[0]
    D = row.z_set(st, room) - zt                 # [|S|, r] float64: the stage's largest arrays
    out = nnls_nearest(D)
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
    t = int(st.distinct.ids[k])
    ids = st.distinct.ids[pos]
    rvec = st.rows64(ids).T @ w - st.rows64([t])[0]
    rn = float(np.linalg.norm(rvec))
    if rn > st.tol * st.white.w_scale:
        st.reasons[t] = f"convex combination found but its residual {rn:.3g} exceeds the tolerance"
    elif st.src.bias is None:
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
    SC = scores_against(Y.numpy().T, st.Z.numpy())              # [m, n] (numpy's GEMM: faster here)
    for q, row in enumerate(probe):
        sc = SC[q].astype(np.float64)
        own = sc[row.k]
        sc[row.k] = -np.inf
        viol = np.nonzero(sc >= own - sl[q])[0]
        t = int(st.distinct.ids[row.k])
        if len(viol) == 0:
            # report the certificate at the token's own whitened norm (margins comparable to stage 1)
            y = row.y                                            # float64; Y is its float32 copy
            f = float(np.linalg.norm(st.z64([row.k])[0])) / float(np.linalg.norm(y))
            st.settle_arg_y(t, 3, f * y, f * float(own - sc.max()))
            continue
        lo, frac, hi = GROWTH
        grow = min(hi, max(lo, int(frac * len(row.S))))
        if len(viol) * INSIDE_HINT >= st.n:
            # a direction most rows beat: the row looks inside (support up to r + 1) or sits just
            # outside. First r / 2 columns (still the Gram solve), then 2 (r + 1) at once: such rows
            # are mostly settled from the r / 2 set, a few ms against ~100 ms per [r + 1, 2 (r + 1)]
            # solve (docs/performance-argmax.md)
            goal = st.r // 2 if len(row.S) < st.r // 2 else 2 * (st.r + 1)
            grow = max(grow, goal - len(row.S))
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
    k, t = row.k, int(st.distinct.ids[row.k])
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
