"""Scores of many certificate directions against all rows on the int8 grid, the near calls exact.

The reflect stage scores each open row's direction ``y`` against every row: ``z_j . y`` for all j,
``m`` directions at a time. In float32 that is one ``[m, r] x [r, n]`` GEMM per pass; here the
directions go on int8 grids of their own (``y = s_y q_y + e_y``) and the product ``Q q_y`` runs in
exact integer arithmetic (:func:`~vocablens.argmax.kernels.exact_products`: oneDNN or
``torch._int_mm`` where they are exact and faster, float32 GEMMs on the grid values elsewhere), with the rigorous bound

    |z_j . y - qs s_y (q_j . q_y)| <= qs ||q_j|| ||e_y|| + ||e_j|| ||y||      (z_j = qs q_j + e_j)

taken at its largest over j (``||q_j|| <= max``, ``||e_j|| <= enorm``). A direction is certified
when every other row's upper bound is below the row's own score (computed in float64 with a bound
on the float32 storage of Z); rows whose upper bound reaches it (a near-duplicate twin, a cluster
mate) are scored exactly from Z in float64, at most :data:`NEAR_MAX` of them per direction.
Every certificate from this stage is re-checked in float64 in the original coordinates by stage
``verify`` as before.
"""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.kernels import exact_products
from vocablens.argmax.state import U64, ScanState, exact_slack, rows_per_block, run_in_workers

#: rows scored exactly per direction at most (their int8 upper bound reaches the row's own score)
NEAR_MAX = 64
#: bytes of one block of products [m, rows] int32: small enough that its reductions read cache
#: (the all-pairs stage's :data:`~vocablens.argmax.certificates.GEMM_BYTES`)
SCORE_BYTES = 2 * 2 ** 20


def int8_ready(st: ScanState) -> bool:
    """Whether the int8 path can run: Q resident and an exact product kernel for it
    (:func:`~vocablens.argmax.kernels.exact_products`; checked once per scan)."""
    if getattr(st, "_int8_ok", None) is None:
        ok = exact_products(st) is not None
        st._int8_ok = bool(ok)
        if ok:
            qq = getattr(st, "q_dot_max", None)         # from stage gemm's Bounds, else one pass
            if qq is None:
                qq = max(float((st.Qt[s:s + 4096].to(torch.int32) ** 2).sum(1).max())
                         for s in range(0, st.n, 4096))
            st._qn_max = float(np.sqrt(qq))
    return st._int8_ok


def int8_pass(st: ScanState, cols: np.ndarray, Y: np.ndarray, k_top: int = 0, top_rows=None):
    """Judge directions ``Y`` float32 [m, r] for the rows at positions ``cols`` [m] against every
    row, on the int8 grid, streaming over blocks of Q's rows (scores ``[m, block]`` of about
    :data:`~vocablens.argmax.state.BLOCK_BYTES`, blocks on worker threads).

    ``top_rows``: the directions (indices into ``cols``) whose ``k_top`` best rows are wanted (all
    by default; the other rows of ``top`` are 0).

    Returns ``(done bool [m], gap float64 [m], jstar int64 [m], top int64 [m, k_top] or None,
    lead float64 [m], slack float64 [m])``:
    whether y certifies its row (every other row's score provably below the row's own), a lower
    bound on that margin (whitened units), the best competitor (exact where the near rows were
    scored exactly, else by the int8 scores) and the ``k_top`` rows scoring highest (best first, by
    the int8 scores; for the interior screen and the proof stage's start sets), and the best
    competitor's upper bound over the row's own score, and the rounding slack of the bounds
    (``beta`` plus the own score's; ``gap / slack`` ranks the certificates for stage verify).
    """
    m, r = Y.shape
    n = st.n
    Y64 = Y.astype(np.float64)
    sy = np.abs(Y64).max(1) / 127.0
    sy[sy == 0] = 1.0
    Qy = np.rint(Y64 / sy[:, None])
    ey = np.linalg.norm(Y64 - sy[:, None] * Qy, axis=1)
    Qy_t = torch.from_numpy(Qy.astype(np.int8))
    yn = np.linalg.norm(Y64, axis=1)
    scale = st.qs * sy                                    # float64 [m]: score = scale x product
    # |z_j . y - scale p_j| <= beta for every j (p_j = q_j . q_y, exact int32): the two grid roundings
    beta = (st.qs * st._qn_max * ey + (float(st.enorm.max()) + st.emax) * yn) * 1.01
    Zn = st.Zt.numpy()
    zt = Zn[cols].astype(np.float64)
    own_lo = (zt * Y64).sum(1) - exact_slack(r) * np.linalg.norm(zt, axis=1) * yn
    # "near": S_j + beta >= own_lo, i.e. the integer product p_j >= ceil((own_lo - beta) / scale):
    # thresholds in exact integers, so every reduction below runs on the int32 products themselves
    x = (own_lo - beta) / scale
    thr = np.clip(np.floor(x - np.abs(x) * 1e-12) - 1, -2 ** 31 + 2, 2 ** 31 - 1).astype(np.int32)
    low = np.iinfo(np.int32).min
    step = rows_per_block(m, 4, SCORE_BYTES)
    px = exact_products(st)                               # the exact int8 kernel (int8_ready)
    if px.align > 1:
        step = max(px.align, step // px.align * px.align)
    starts = list(range(0, n, step))
    workers = max(1, min(torch.get_num_threads(), len(starts)))
    thr_t = torch.from_numpy(thr)
    low64 = np.int64(np.iinfo(np.int32).min)
    if not k_top:
        want = None
    else:
        want = np.arange(m) if top_rows is None else np.asarray(top_rows, dtype=np.int64)
    state = [{"bv": np.full(m, low, dtype=np.int64), "bj": np.zeros(m, dtype=np.int64),
              "far": np.full(m, low, dtype=np.int64), "near": [], "cnt": np.zeros(m, dtype=np.int64),
              "tv": None, "ti": None} for _ in range(workers)]

    def work(a: int, w: int) -> None:
        st.check_time()
        b = min(n, a + step)
        g = state[w]
        # exact integers [m, c] (int32, or float32 from the packed Q: below 2^24, exact)
        Pt = px.mm(Qy_t, a, b)
        mine = np.nonzero((cols >= a) & (cols < b))[0]
        if len(mine):
            Pt[torch.from_numpy(mine), torch.from_numpy(cols[mine] - a)] = low   # own entries
        vt, jt = Pt.max(1)                                                 # scale > 0 per row: same order
        vb, jb = vt.numpy().astype(np.int64), jt.numpy()
        up = vb > g["bv"]
        g["bv"][up], g["bj"][up] = vb[up], jb[up] + a
        fb = vb                                        # the largest product below the near threshold
        nr_np = np.nonzero((vb >= thr) & (g["cnt"] <= NEAR_MAX))[0]    # near rows here, not yet too many
        nr = torch.from_numpy(nr_np)
        if len(nr):
            sub = Pt[nr]
            mask = sub >= thr_t[nr, None]
            qq, jj = torch.nonzero(mask, as_tuple=True)
            qq, jj = nr.numpy()[qq.numpy()], jj.numpy()
            fb = vb.copy()
            fb[nr.numpy()] = sub.masked_fill(mask, low).amax(1).numpy()
            keep = g["cnt"][qq] + np.bincount(qq, minlength=m)[qq] <= NEAR_MAX + 1
            g["near"].append((qq[keep], jj[keep] + a))
            np.add.at(g["cnt"], qq, 1)
        g["far"] = np.maximum(g["far"], fb)
        if want is not None and len(want):
            # the k_top best per wanted direction: only the directions whose block maximum beats
            # their current k-th best need a top-k of this block
            if g["tv"] is None:
                g["tv"] = np.full((len(want), k_top), low64, dtype=np.int64)
                g["ti"] = np.zeros((len(want), k_top), dtype=np.int64)
            sel = np.nonzero(vb[want] > g["tv"][:, -1])[0]
            if len(sel):
                k = min(k_top, b - a)
                tv, ti = torch.topk(Pt[torch.from_numpy(want[sel])], k, dim=1)
                tv = np.concatenate([g["tv"][sel], tv.numpy().astype(np.int64)], 1)
                ti = np.concatenate([g["ti"][sel], ti.numpy() + a], 1)
                o = np.argsort(-tv, axis=1, kind="stable")[:, :k_top]
                g["tv"][sel], g["ti"][sel] = np.take_along_axis(tv, o, 1), np.take_along_axis(ti, o, 1)

    run_in_workers(starts, work, workers)
    bv, bj = state[0]["bv"], state[0]["bj"]
    far, cnt = state[0]["far"], state[0]["cnt"]
    for g in state[1:]:
        up = g["bv"] > bv
        bv[up], bj[up] = g["bv"][up], g["bj"][up]
        far = np.maximum(far, g["far"])
        cnt = cnt + g["cnt"]
    def up(v, q=slice(None)):                                 # scale x product, rounded up, + beta
        f = v.astype(np.float64) * scale[q]
        return f + np.abs(f) * 8 * U64 + beta[q]

    best_up = up(bv)
    best_up[bv == low] = -np.inf
    done = best_up < own_lo
    gap = np.where(done, own_lo - best_up, 0.0)
    jstar = bj.copy()
    pairs = [p for g in state for p in g["near"]]
    nq = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
    nj = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
    order = np.argsort(nq, kind="stable")
    nq, nj = nq[order], nj[order]
    for q in np.nonzero(~done & (cnt <= NEAR_MAX))[0]:
        near = np.unique(nj[np.searchsorted(nq, q):np.searchsorted(nq, q, side="right")])
        far_up = -np.inf if far[q] == low else float(up(far[q:q + 1], slice(q, q + 1))[0])
        top_up = far_up                                        # near rows exact, the others bounded
        if len(near):
            zn = Zn[near].astype(np.float64)
            ex = zn @ Y64[q] + exact_slack(r) * np.linalg.norm(zn, axis=1) * yn[q]
            k = int(np.argmax(ex))
            jstar[q] = near[k]
            top_up = max(float(ex[k]), far_up)
        if top_up < own_lo[q]:
            done[q], gap[q] = True, own_lo[q] - top_up
    top = None
    if want is not None:
        kk = min(k_top, n)
        top = np.zeros((m, kk), dtype=np.int64)
        tis = [g["ti"] for g in state if g["ti"] is not None]
        tvs = [g["tv"] for g in state if g["tv"] is not None]
        if tis and len(want):
            tv, ti = np.concatenate(tvs, 1), np.concatenate(tis, 1)
            o = np.argsort(-tv, axis=1, kind="stable")[:, :kk]
            top[want] = np.take_along_axis(ti, o, 1)
    lead = best_up / np.maximum(np.abs(own_lo), 1e-300)          # best competitor / own score
    slack = beta + exact_slack(r) * np.linalg.norm(zt, axis=1) * yn
    return done, gap, jstar, top, lead, slack


__all__ = ["NEAR_MAX", "int8_pass", "int8_ready"]
