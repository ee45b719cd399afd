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
from vocablens.argmax.blocks import rows_per_block, scores_against
from vocablens.argmax.decisions import GaveUp, StageResult, Stopped, argmaxable_at, dominated, still_open
from vocablens.argmax.scan import Scan
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

    def z_set(self, scan: Scan, room: list) -> np.ndarray:
        """``z64(S)`` [|S|, r] float64: the rows added since the last round computed, the rest kept
        while the batch's kept rows fit ``room[0]`` bytes (:data:`ROW_CACHE_BYTES`)."""
        have = 0 if self.Z is None else len(self.Z)
        new = scan.z64(self.S[have:])
        Z = new if not have else np.vstack([self.Z, new])
        grow = Z.nbytes - (0 if self.Z is None else self.Z.nbytes)
        if grow <= room[0]:
            room[0] -= grow
            self.Z = Z
        else:
            room[0] += 0 if self.Z is None else self.Z.nbytes
            self.Z = None
        return Z


class _Found:
    """What one run of stage proof has decided so far (kept by this module only): ``decided``, the
    certificates and give-ups in order; ``lifted``, with a bias, token -> ``(ids, weights)`` of the
    no-bias combinations (the bias stage decides them)."""

    __slots__ = ("decided", "lifted")

    def __init__(self):
        self.decided: list = []
        self.lifted: dict = {}


def stage_proof(scan: Scan, left: np.ndarray, max_rounds: int, row_budget_s: float | None,
                start_top: dict, parts) -> StageResult:
    """Prove every open row (``left``, int64 positions into ``distinct.ids``; deferred rows last).

    Args:
        start_top: stage reflect's top competitors per row (position -> int64 [k], best first):
            a row's first set when it has enough of them.
        parts: the scan's :class:`~vocablens.argmax.sparse.InteriorParts` (None with a bias).

    Returns:
        :class:`~vocablens.argmax.decisions.StageResult`: the rows decided (and given up on), those
        left open and, with a bias, ``lifted``: the no-bias failures (empty when the stage was
        cut short or interrupted).
    """
    found = _Found()
    with Stopped() as stop:
        _prove(scan, left, max_rounds, row_budget_s, start_top, parts, found)
    return StageResult(name="proof", decided=tuple(found.decided),
                       open=still_open(left, found.decided, scan.distinct.position), cut=stop.cut,
                       interrupted=stop.interrupted, lifted={} if stop.cut or stop.interrupted else found.lifted)


def _prove(scan: Scan, left: np.ndarray, max_rounds: int, row_budget_s, start_top: dict, parts,
           found: _Found) -> None:
    """The body of :func:`stage_proof`.

    Raises:
        OutOfTime: the run's budget ran out (rows not settled stay open).
    """
    n, r, Zt = scan.n, scan.r, scan.Z
    rows = left
    if scan.source.defer is not None and len(rows):
        rows = rows[np.argsort(scan.source.defer[scan.distinct.ids[rows]], kind="stable")]
    rows = tilt_proofs(scan, parts, rows, found.decided)    # rows near the centre: one dense combination each
    n0 = min(n - 1, max(START_COLS, SPARSE_COLS))
    per = rows_per_block(n, 4, most=BATCH)          # columns of one [n, per] float32 score block
    for b0 in range(0, len(rows), BATCH):
        scan.check_time()
        ks = rows[b0:b0 + BATCH]
        kept = {int(k): start_top[int(k)] for k in ks if int(k) in start_top and
                len(start_top[int(k)]) >= n0}         # the reflect stage's scores at z_t
        need = np.array([k for k in ks if int(k) not in kept], dtype=np.int64)
        fresh = np.concatenate([_start_sets(Zt, need[j:j + per], n0) for j in range(0, len(need), per)]) \
            if len(need) else np.zeros((0, n0), dtype=np.int64)
        got = dict(zip(need.tolist(), fresh))
        active, pending = [], []
        for k in ks:
            scan.check_time()
            top = kept.get(int(k), got.get(int(k)))
            top = np.asarray(top[:n0], dtype=np.int64)
            cert = (sparse_certificate(scan, parts, int(k), top[:SPARSE_COLS], pending=pending)
                    if sparse_hint(scan, parts, int(k), top[:SPARSE_COLS]) else None)
            if cert is None:
                active.append(_Row(int(k), top))
            else:
                found.decided.append(cert)
        tilted = gap_tilts(scan, parts, pending) if pending else {}   # the gaps the Ball does not hold, one batch
        found.decided.extend(tilted.values())
        active = [row for row in active if row.k not in tilted]
        while active:
            probe = []
            room = [ROW_CACHE_BYTES - sum(row.Z.nbytes for row in active if row.Z is not None)]
            for row in active:
                scan.check_time()                  # once per row and round
                t_row = time.perf_counter()
                if _round(scan, row, found, room):
                    probe.append(row)
                row.spent += time.perf_counter() - t_row
            active = _check_directions(scan, probe, max_rounds, row_budget_s, found)
        scan.progress("proof", min(b0 + BATCH, len(rows)), len(rows))


def _start_sets(Zt: torch.Tensor, ks: np.ndarray, n0: int) -> np.ndarray:
    """The ``n0`` rows scoring highest at ``z_k`` for each k in ks (k itself left out): int64 [len(ks), n0].
    Scores [B, n] by numpy's GEMM (faster than torch's for these shapes)."""
    Zn = Zt.numpy()
    S0 = scores_against(Zn[ks], Zn)                              # [B, n]
    S0[np.arange(len(ks)), ks] = -np.inf
    return torch.topk(torch.from_numpy(S0), n0, dim=1).indices.numpy()     # [B, n0], best first


def _round(scan: Scan, row: _Row, found: _Found, room: list) -> bool:
    """One float64 NNLS round; settles the row (False) or leaves a direction to check (True)."""
    k = row.k
    zt = scan.z64([k])[0]
    D = row.z_set(scan, room) - zt                 # [|S|, r] float64: the stage's largest arrays
    out = nnls_nearest(D)
    if out is None:
        _fallback(scan, row, "NNLS failed", found)
        return False
    w, g, med = out
    if np.linalg.norm(g) <= scan.tol * med:
        sup = w > 0
        _interior_found(scan, k, row.S[sup], w[sup], found)
        return False
    row.y = -g
    return True


def _interior_found(scan: Scan, k: int, pos: np.ndarray, w: np.ndarray, found: _Found) -> None:
    t = int(scan.distinct.ids[k])
    ids = scan.distinct.ids[pos]
    rvec = scan.rows64(ids).T @ w - scan.rows64([t])[0]
    rn = float(np.linalg.norm(rvec))
    if rn > scan.tol * scan.white.w_scale:
        found.decided.append(GaveUp(t, f"convex combination found but its residual {rn:.3g} exceeds the tolerance"))
    elif scan.source.bias is None:
        found.decided.append(dominated(t, ids, w, rn, 3))
    else:
        found.lifted[t] = (ids, w)


def _check_directions(scan: Scan, probe: list, max_rounds: int, row_budget_s, found: _Found) -> list:
    """``Z Y`` products for the batch's directions (as many columns at a time as fit one block):
    settle the separated rows, extend the rest; returns the rows still open."""
    nxt: list = []
    per = rows_per_block(scan.n, 4, most=BATCH)       # columns of one [n, per] float32 score block
    for j in range(0, len(probe), per):
        _check_some(scan, probe[j:j + per], max_rounds, row_budget_s, found, nxt)
    return nxt


def _check_some(scan: Scan, probe: list, max_rounds: int, row_budget_s, found: _Found, nxt: list) -> None:
    """One ``Y^T Z^T`` product [len(probe), n]; the rows to extend are appended to ``nxt``."""
    Y = torch.from_numpy(np.stack([row.y for row in probe], axis=1)).float()   # [r, m]
    sl = slack(scan, Y)
    SC = scores_against(Y.numpy().T, scan.Z.numpy())              # [m, n] (numpy's GEMM: faster here)
    for q, row in enumerate(probe):
        sc = SC[q].astype(np.float64)
        own = sc[row.k]
        sc[row.k] = -np.inf
        viol = np.nonzero(sc >= own - sl[q])[0]
        t = int(scan.distinct.ids[row.k])
        if len(viol) == 0:
            # report the certificate at the token's own whitened norm (margins comparable to stage 1)
            y = row.y                                            # float64; Y is its float32 copy
            f = float(np.linalg.norm(scan.z64([row.k])[0])) / float(np.linalg.norm(y))
            found.decided.append(argmaxable_at(scan, t, 3, f * y, f * float(own - sc.max())))
            continue
        lo, frac, hi = GROWTH
        grow = min(hi, max(lo, int(frac * len(row.S))))
        if len(viol) * INSIDE_HINT >= scan.n:
            # a direction most rows beat: the row looks inside (support up to r + 1) or sits just
            # outside. First r / 2 columns (still the Gram solve), then 2 (r + 1) at once: such rows
            # are mostly settled from the r / 2 set, far cheaper than a [r + 1, 2 (r + 1)]
            # solve (docs/performance-argmax.md)
            goal = scan.r // 2 if len(row.S) < scan.r // 2 else 2 * (scan.r + 1)
            grow = max(grow, goal - len(row.S))
        if len(viol) > grow + len(row.S):         # the most violated grow + |S| hold grow new ones
            viol = viol[np.argpartition(-sc[viol], grow + len(row.S))[:grow + len(row.S)]]
        new = [v for v in viol[np.argsort(-sc[viol], kind="stable")].tolist() if v not in row.Sset][:grow]
        row.rounds += 1
        if not new:
            _fallback(scan, row, "NNLS column generation stalled", found)
        elif row.rounds >= max_rounds:
            _fallback(scan, row, "NNLS did not converge", found)
        elif row_budget_s is not None and row.spent > row_budget_s:
            found.decided.append(GaveUp(t, f"row budget: not decided within {row_budget_s:g} s"))
        else:
            row.Sset.update(new)
            row.S = np.concatenate([row.S, np.array(new, dtype=np.int64)])
            nxt.append(row)


def _fallback(scan: Scan, row: _Row, why: str, found: _Found) -> None:
    """A HiGHS LP on the row's set; settles the row or records why not."""
    k, t = row.k, int(scan.distinct.ids[row.k])
    res = lp_proof(scan, None, k, row.S, max_rounds=40)
    if res[0] == "arg":
        zt = scan.z64([k])[0]
        f = float(np.linalg.norm(zt)) / float(np.linalg.norm(res[1]))
        found.decided.append(argmaxable_at(scan, t, 3, f * res[1], f * res[3]))
    elif res[0] == "int":
        _interior_found(scan, k, res[1], res[2], found)
    else:
        found.decided.append(GaveUp(t, f"{why}; LP: {res[1]}"))


__all__ = ["Ball", "screen_interior", "sparse_certificate", "stage_proof"]
