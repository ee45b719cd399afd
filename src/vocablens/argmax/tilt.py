"""Interior proofs for rows near the centre of the hull: the tilted uniform combination.

A row t near the centroid of the others is inside their hull, but a proof by NNLS needs a support
of up to r + 1 rows (seconds per row at r = 896). A dense combination does it at once: with the
distinct rows j outside a small set E (t itself and a few rows with extreme projections), the
weights

    lambda_j = a + q_j . u        (q_j: the row on the int8 grid, stored in the result)

sum to 1 and reproduce w_t for one (a, u) solved from an (r + 1) x (r + 1) system; t is proved
interior when every lambda_j >= 0. With uniform weights over all rows and the whitened rows'
identity covariance, ``lambda_j ~ (1 + z_j . z_t) / n``: every row t with ``z_j . z_t > -1`` for all
j qualifies; rows j that break this (long rows pointing away from z_t) join E and the system is
solved again (a rank-|E| update by Woodbury's identity). Measured on the trained-like synthetic
head (49,152 x 896, reserved rows at whitened norm 0.26): 200 reserved rows sampled, all proved
within two rounds, |E| 8-26 (uniform weights alone: 1.7% of them); at 151,936 x 896 all 5,000.

Soundness: ``lambda_j >= 0`` is checked on exact int8 products (u on a grid of its own; float32
products without the int8 path) with a rigorous rounding bound (a row whose weight is within the
bound joins E); the residual ``||sum lambda_j w_j - w_t||`` (weights
renormalised to sum 1) is evaluated in float64 in the original coordinates by linearity from exact
sums over all rows (``sum w_j``, ``sum w_j q_j^T``), plus a bound on their float64 summation error;
it must be within the run's tolerance like every other not-argmaxable certificate. The certificate
``(a, u, E)`` is stored in :attr:`~vocablens.argmax.result.ArgmaxResult.combo_tilt`;
:meth:`~vocablens.argmax.result.ArgmaxResult.combination` expands it.
"""

from __future__ import annotations

import numpy as np

from vocablens.argmax.blocks import U32, U64, rows_per_block
from vocablens.argmax.decisions import dominated
from vocablens.argmax.scan import Scan

#: rows tried: whitened norm at most this fraction of the median whitened norm (rows near the centre)
TILT_NORM = 0.05
#: solve / check rounds per row before it is left to the NNLS proofs
TILT_ROUNDS = 5
#: rows excluded from the base (E) at most
TILT_MAX_EXCLUDED = 256
#: candidates checked together (their weights [this, n] float32 per product)
TILT_BATCH = 128
#: memory for the cached columns ``B^-1 [1; z_j]`` of the rows excluded so far (:meth:`_Sums.binv_u`)
TILT_CACHE_BYTES = 256 << 20



class _Sums:
    """One pass over the distinct rows (worker threads, fixed blocks per worker): the exact float64
    sums in the original coordinates (``sum w_j``, ``sum w_j q_j^T``, ``sum q_j``) that give a
    combination's residual by linearity, the norms that bound their summation error, and the
    bordered system ``B = sum [1; z_j] [1; q_j]^T`` for solving (from float32 Z: the refinement
    against the exact residual removes what that rounding leaves); 2 n r (r + d) float64 FLOPs."""

    def __init__(self, scan: Scan):
        from vocablens.argmax.blocks import run_in_workers
        import torch

        n, r, d = scan.n, scan.r, scan.d
        step = rows_per_block(max(d, r))
        starts = list(range(0, n, step))
        workers = max(1, min(torch.get_num_threads(), len(starts)))
        acc = [[np.zeros(d), np.zeros((d, r)), np.zeros(r), np.zeros(r), 0.0, 0.0, np.zeros((r, r))] for _ in range(workers)]
        self.qn = np.zeros(n)                       # ||q_j||

        def block(s: int, w: int) -> None:
            scan.check_time()
            e = min(n, s + step)
            Q = scan.q_rows(s, e).double().numpy()                   # [k, r] exact integers
            Wb = scan.rows64(scan.distinct.ids[s:e])                           # [k, d]
            a = acc[w]
            a[0] += Wb.sum(0)
            a[1] += Wb.T @ Q
            a[2] += Q.sum(0)
            Zb = scan.Z[s:e].double().numpy()
            a[3] += Zb.sum(0)
            a[6] += Zb.T @ Q
            qn = np.linalg.norm(Q, axis=1)
            wn = np.linalg.norm(Wb, axis=1)
            self.qn[s:e] = qn
            a[4] += float(wn @ qn)
            a[5] += float(wn.sum())

        run_in_workers(starts, block, workers, static=True)
        self.SW, self.MWQ, self.SQ, SZ = (sum(a[i] for a in acc) for i in range(4))
        self.wq, self.w1 = sum(a[4] for a in acc), sum(a[5] for a in acc)   # sum ||w|| ||q||, sum ||w||
        B = np.zeros((r + 1, r + 1))
        B[0, 0], B[0, 1:], B[1:, 0] = n, self.SQ, SZ
        B[1:, 1:] = sum(a[6] for a in acc)                               # sum z_j q_j^T
        self.Binv = np.linalg.inv(B)
        self.gamma_n = n * U64 / (1 - n * U64) * 1.01
        self.qsum = float(self.qn.sum())
        self._pos = np.full(n, -1, dtype=np.int64)                      # row j -> its column in _bi
        self._bi = np.empty((0, r + 1))
        self._used = 0

    def binv_u(self, scan: Scan, rows: np.ndarray) -> np.ndarray:
        """``B^-1 [1; z_j]`` for the rows j (positions, repeats allowed): float64 [r + 1, len(rows)].

        Every excluded set of every round and batch asks for these columns, and the rows that break
        a tilt (long rows pointing away) recur across the centre rows: each column is computed once
        and kept (at most :data:`TILT_CACHE_BYTES`; when full the cache starts over), so a round
        costs ``(r + 1)^2`` FLOPs per new row instead of per member of every set (at 65,536 x 896:
        20,100 distinct rows of 189,504 members)."""
        uq = np.unique(rows)
        miss = uq[self._pos[uq] < 0]
        if len(miss):
            width = self._bi.shape[1]
            cap = max(len(uq), TILT_CACHE_BYTES // (8 * width))
            if self._used + len(miss) > cap:                              # full: start over
                self._pos[:] = -1
                self._used = 0
                miss = uq
            if self._used + len(miss) > len(self._bi):
                grown = np.empty((min(cap, max(2 * len(self._bi), self._used + len(miss))), width))
                grown[:self._used] = self._bi[:self._used]
                self._bi = grown
            U = np.vstack([np.ones(len(miss)), scan.Z[miss].double().numpy().T])   # [r + 1, k]
            self._bi[self._used:self._used + len(miss)] = (self.Binv @ U).T
            self._pos[miss] = np.arange(self._used, self._used + len(miss))
            self._used += len(miss)
        return self._bi[self._pos[rows]].T


class _Woodbury:
    """``B_{E_i}^-1`` for a batch of excluded sets ``Es`` (``B_E = B - sum_{j in E} [1; z_j] [1; q_j]^T``)
    by Woodbury's identity: ``B^-1 U`` (its columns ``B^-1 [1; z_j]`` from :meth:`_Sums.binv_u`)
    and each |E| x |E| capacitance matrix factored once, so every solve of a refinement reuses
    them; also each set's rows in float64 (``W_E``, ``Q_E``) for :func:`_exact`."""

    def __init__(self, S: _Sums, scan: Scan, Es: list):
        self.S, self.Es = S, Es
        allE = np.concatenate(Es)
        Vt = np.hstack([np.ones((len(allE), 1)), scan.q_rows_at(allE).double().numpy()])  # [sum |E|, r + 1]
        BiU = S.binv_u(scan, allE)                                                      # [r + 1, sum |E|]
        self.blocks, o = [], 0
        for E in Es:
            k = len(E)
            Bi, V = BiU[:, o:o + k], Vt[o:o + k]
            self.blocks.append((Bi, V, np.linalg.inv(np.eye(k) - V @ Bi)))
            o += k
        self.WE = [scan.rows64(scan.distinct.ids[E]) for E in Es]
        self.QE = [Vt[o - len(E):o, 1:] for o, E in zip(np.cumsum([len(E) for E in Es]), Es)]

    def solve(self, R: np.ndarray, cols) -> np.ndarray:
        """``X[:, i] = B_{E_c}^-1 R[:, i]`` for c = cols[i]; R float64 [r + 1, len(cols)]."""
        Y = self.S.Binv @ R
        out = Y.copy()
        for i, c in enumerate(cols):
            Bi, V, Ci = self.blocks[c]
            out[:, i] += Bi @ (Ci @ (V @ Y[:, i]))
        return out


def _exact(S: _Sums, scan: Scan, Wp: np.ndarray, X: np.ndarray, wood: _Woodbury, cols):
    """For the exact weights ``lambda_j = a + q_j . u`` (a column of X = [a; u]) on the distinct
    rows outside E: ``sum lambda - 1`` [m] and ``sum lambda_j w_j - w_t`` [d, m] in float64 by
    linearity, and bounds on their float64 summation errors ([m] each)."""
    A_, U_ = X[0], X[1:]
    rho0 = A_ * scan.n + S.SQ @ U_ - 1.0
    rhow = np.outer(S.SW, A_) + S.MWQ @ U_ - Wp.T
    for i, c in enumerate(cols):
        c_ = wood.QE[c] @ U_[:, i] + A_[i]                      # the weights the base leaves out
        rho0[i] -= c_.sum()
        rhow[:, i] -= wood.WE[c].T @ c_
    un = np.linalg.norm(U_, axis=0)
    return rho0, rhow, S.gamma_n * (np.abs(A_) * scan.n + un * S.qsum), S.gamma_n * (np.abs(A_) * S.w1 + un * S.wq)


def _refined(S: _Sums, scan: Scan, Zp: np.ndarray, Wp: np.ndarray, Es: list, steps: int = 6):
    """(X [r + 1, m], rn [m]): ``[a; u]`` for the target points (whitened ``Zp`` [m, r], original
    ``Wp`` [m, d], float64) with bases outside Es, refined against the exact residual, and the
    residual bound of each renormalised combination (inf when it does not get there)."""
    wood = _Woodbury(S, scan, Es)
    X = wood.solve(np.vstack([np.ones(len(Zp)), Zp.T]), range(len(Zp)))
    W_t = Wp                                                              # [m, d]
    wt_n = np.linalg.norm(W_t, axis=1)
    rn = np.full(len(Zp), np.inf)
    todo = np.arange(len(Zp))
    for _ in range(steps):
        rho0, rhow, e0, ew = _exact(S, scan, W_t[todo], X[:, todo], wood, todo)
        tot = 1.0 + rho0
        ok = tot > 2 * e0
        # sum lambda w / sum lambda - w_t = (rho_w - rho_0 w_t) / sum lambda
        r_ = np.linalg.norm(rhow - rho0[None, :] * W_t[todo].T, axis=0)
        rn[todo] = np.where(ok, (r_ + ew + e0 * wt_n[todo]) / np.maximum(tot - e0, 1e-300), np.inf)
        left = rn[todo] > 0.25 * scan.tol * scan.white.w_scale
        if not left.any():
            break
        todo_l = todo[left]
        rx = ((rhow[:, left] - np.outer(scan.white.center, rho0[left])).T @ scan.white.whiten).T    # whitened residuals [r, m']
        X[:, todo_l] -= wood.solve(np.vstack([rho0[left], rx]), todo_l)
        todo = todo_l
    return X, rn


def tilt_proofs(scan: Scan, parts, rows: np.ndarray, found: list) -> np.ndarray:
    """Prove the rows near the centre (whitened norm <= :data:`TILT_NORM` x the median) interior
    by tilted uniform combinations (``parts``: the scan's
    :class:`~vocablens.argmax.sparse.InteriorParts`, whose tilt sums are made here on first use);
    appends their :class:`~vocablens.argmax.decisions.Dominated` to ``found`` (in order) and returns
    the rows (positions into ``distinct.ids``) still open.

    No bias only (with a bias the lifted problem needs ``sum lambda_j b_j >= b_t``: the NNLS and LP
    proofs decide those). Cost: one pass for the sums (2 n r d float64 FLOPs, only when some row
    qualifies), then per round one float32 product ``[batch, n]`` for the weights and O(r^2 |E|)
    solves per row.

    Raises:
        OutOfTime: the run's budget ran out.
    """
    if scan.source.bias is not None or scan.n <= scan.r + 2 or not len(rows):
        return rows
    med = float(np.median(scan.white.z_norm))
    near = rows[scan.white.z_norm[rows] <= TILT_NORM * med]
    if not len(near):
        return rows
    scan.progress("proof: centre", 0, len(near))
    S = parts.sums(scan)
    done: set = set()
    for b0 in range(0, len(near), TILT_BATCH):
        scan.progress("proof: centre", b0, len(near))
        ks = near[b0:b0 + TILT_BATCH]
        sol = tilt_points(scan, S, scan.Z[ks].double().numpy(), scan.rows64(scan.distinct.ids[ks]), [np.array([int(k)]) for k in ks])
        for k, got in zip(ks, sol):
            if got is not None:
                a, u, E, rn = got
                found.append(dominated(int(scan.distinct.ids[k]), [], [], rn, 3, tilt=(a, u, scan.distinct.ids[E])))
                done.add(int(k))
    scan.progress("proof: centre", len(near), len(near))
    if not done:
        return rows
    return rows[~np.isin(rows, np.fromiter(done, dtype=np.int64))]


def sums(scan: Scan) -> _Sums:
    """The sums over the scan's distinct rows that every tilt reads (one pass over the rows; the
    scan's :class:`~vocablens.argmax.sparse.InteriorParts` keeps them)."""
    return _Sums(scan)


def tilt_points(scan: Scan, S: _Sums, Zp: np.ndarray, Wp: np.ndarray, E0: list) -> list:
    """Tilted uniform combinations of the distinct rows outside ``E0[i]`` (positions; grown by the
    rows whose weight is not provably positive) for target points (whitened ``Zp`` [m, r], original
    ``Wp`` [m, d], float64). Returns per point ``(a, u, E, rn)`` (weights ``a + q_j . u`` >= 0 on
    the rows outside E summing to 1, residual bound rn within the run's tolerance) or None.

    Raises:
        OutOfTime: the run's budget ran out.
    """
    m = len(Zp)
    E = [np.asarray(e, dtype=np.int64) for e in E0]
    out: list = [None] * m
    active = list(range(m))
    for _ in range(TILT_ROUNDS):
        scan.check_time()
        if not active:
            break
        X, rns = _refined(S, scan, Zp[active], Wp[active], [E[i] for i in active])
        sol = {i: (X[:, q], rns[q]) for q, i in enumerate(active)}
        active = [i for i in active if np.isfinite(sol[i][1])]
        if not active:
            break
        U = np.stack([sol[i][0][1:] for i in active])                         # [m', r]
        avec = np.array([float(sol[i][0][0]) for i in active])
        viol = _violators(scan, S, U, avec)                                     # rows j, weight <= 0
        nxt = []
        for q, i in enumerate(active):
            x, rn = sol[i]
            a, u = float(x[0]), x[1:]
            bad = viol[q][~np.isin(viol[q], E[i])]
            if len(bad) == 0:
                if rn <= scan.tol * scan.white.w_scale:
                    tot = a * (scan.n - len(E[i])) + float((S.SQ - scan.q_rows_at(E[i]).double().numpy().sum(0)) @ u)
                    out[i] = (a / tot, u / tot, E[i], rn)
                continue
            if len(E[i]) + len(bad) > TILT_MAX_EXCLUDED:
                continue
            E[i] = np.concatenate([E[i], bad])
            nxt.append(i)
        active = nxt
    return out


def _violators(scan: Scan, S: _Sums, U: np.ndarray, a: np.ndarray) -> list[np.ndarray]:
    """For each tilt ``(a_q, u_q)`` (U float64 [m, r], a [m]), the rows j (positions, sorted) whose
    weight ``a_q + q_j . u_q`` is not provably positive, by blocks of Q's rows on worker threads.

    On the int8 path (:func:`~vocablens.argmax.scoring.int8_ready`) ``u = s_u p_u + e_u`` on a grid
    of its own and ``q_j . p_u`` is an exact int32 product, so the error is ``|q_j . e_u| <=
    ||q_j|| ||e_u||``; otherwise a float32 GEMM with its rounding bound. Both add ``4 u64`` of the
    float64 sums. On the int8 path that float64 test runs only on the products at or below a
    per-direction int32 threshold (the test's bound taken at the block's largest ``||q_j||``): the
    rows flagged are the full test's."""
    import torch

    from vocablens.argmax.scoring import SCORE_BYTES, int8_ready
    from vocablens.argmax.blocks import run_in_workers

    m = len(U)
    use8 = int8_ready(scan)
    if use8:
        su = np.abs(U).max(1) / 127.0
        su[su == 0] = 1.0
        Pu = np.rint(U / su[:, None])
        eu = np.linalg.norm(U - su[:, None] * Pu, axis=1) * 1.01
        Pu_t = torch.from_numpy(Pu.astype(np.int8))
    else:
        Uf = U.astype(np.float32)
        coef = (scan.r * U32 / (1 - scan.r * U32) + 2 * U32) * 1.01
        eu = coef * np.linalg.norm(Uf.astype(np.float64), axis=1) + np.linalg.norm(U - Uf, axis=1) * 1.01
    step = rows_per_block(m, 8, SCORE_BYTES)
    px = scan.products if use8 else None                      # the exact int8 kernel, or None
    if px is not None and px.align > 1:
        step = max(px.align, step // px.align * px.align)
    starts = list(range(0, scan.n, step))
    found: list[list] = [[] for _ in starts]

    def block(s: int, _w: int) -> None:
        scan.check_time()
        e = min(scan.n, s + step)
        if use8:
            # The exact test below on the integer products that can pass it: with the block's
            # largest ||q_j|| and |I| <= 127 * 128 * r its bound is at most Bq, so a product above
            # (Bq - a_q) / s_q (rounded up, plus one) cannot fail; one int32 comparison per product.
            I = px.mm(Pu_t, s, e)                                          # [m, k] exact integers
            Bq = float(S.qn[s:e].max()) * eu + 4 * U64 * (su * 127.0 * 128.0 * scan.r + 2 * np.abs(a))
            tau = np.floor((Bq - a) / su + np.abs(Bq - a) / su * 1e-9) + 1           # generous
            tau = torch.from_numpy(np.clip(tau, -2**31 + 1, 2**31 - 1).astype(np.int32))
            qq, jj = (x.numpy() for x in torch.nonzero(I <= tau[:, None], as_tuple=True))
            val = I[torch.from_numpy(qq), torch.from_numpy(jj)].numpy().astype(np.float64) * su[qq] + a[qq]
            bound = S.qn[s + jj] * eu[qq] + 4 * U64 * (np.abs(val) + np.abs(a[qq]))
            hit = val <= bound
            qq, jj = qq[hit], jj[hit]                                      # sorted by qq
        else:
            val = (Uf @ scan.q_rows(s, e).float().numpy().T).astype(np.float64)
            val += a[:, None]                                              # the weights [m, k]
            bound = S.qn[None, s:e] * eu[:, None] + 4 * U64 * (np.abs(val) + np.abs(a)[:, None])
            qq, jj = np.nonzero(val <= bound)                              # sorted by qq
        first = np.searchsorted(qq, qq)
        keep = np.arange(len(qq)) - first <= TILT_MAX_EXCLUDED             # enough to rule a tilt out
        found[s // step] = [qq[keep], jj[keep] + s]

    run_in_workers(starts, block, max(1, min(torch.get_num_threads(), len(starts))))
    qq = np.concatenate([f[0] for f in found]) if found else np.zeros(0, dtype=np.int64)
    jj = np.concatenate([f[1] for f in found]) if found else np.zeros(0, dtype=np.int64)
    order = np.lexsort((jj, qq))
    qq, jj = qq[order], jj[order]
    cuts = np.searchsorted(qq, np.arange(m + 1))
    return [jj[cuts[q]:cuts[q + 1]] for q in range(m)]


__all__ = ["TILT_NORM", "tilt_proofs"]
