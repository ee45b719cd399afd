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

from dataclasses import dataclass

import numpy as np
import torch

from vocablens.argmax.blocks import U64, exact_slack, rows_per_block, run_in_workers
from vocablens.argmax.scan import Scan

#: rows scored exactly per direction at most (their int8 upper bound reaches the row's own score)
NEAR_MAX = 64
#: bytes of one block of products [m, rows] int32: small enough that its reductions read cache
#: (the all-pairs stage's :data:`~vocablens.argmax.certificates.GEMM_BYTES`)
SCORE_BYTES = 2 * 2 ** 20


def int8_ready(scan: Scan) -> bool:
    """Whether the int8 path can run: an exact product kernel for Q (picked by stage gemm,
    :func:`~vocablens.argmax.kernels.exact_products`: ``scan.products``)."""
    return scan.products is not None


@dataclass(frozen=True, eq=False)
class GridDirections:
    """Directions ``Y`` float32 [m, r] put on int8 grids of their own, with what their scores need.

    Attributes:
        Y64: float64 [m, r] the directions; ``yn`` [m] their norms.
        Qy: int8 [m, r] their grid rows (``y = sy qy + ey``, step ``sy`` per direction).
        scale: float64 [m] ``qs sy``: a row's score is ``scale`` x its integer product.
        beta: float64 [m] the bound ``|z_j . y - scale p_j| <= beta`` for every row j (both grids'
            rounding, taken at its largest over j).
        own_lo: float64 [m] a lower bound on each direction's own row's score ``z_t . y``.
        thr: int32 [m] the integer product at which a row's upper bound reaches ``own_lo`` ("near").
        zt: float64 [m, r] the own rows ``z_t``.
    """

    Y64: np.ndarray
    yn: np.ndarray
    Qy: torch.Tensor
    scale: np.ndarray
    beta: np.ndarray
    own_lo: np.ndarray
    thr: np.ndarray
    zt: np.ndarray


def grid_directions(scan: Scan, cols: np.ndarray, Y: np.ndarray) -> GridDirections:
    """:class:`GridDirections` of ``Y`` float32 [m, r] for the rows at positions ``cols`` [m]."""
    r = Y.shape[1]
    Y64 = Y.astype(np.float64)
    sy = np.abs(Y64).max(1) / 127.0
    sy[sy == 0] = 1.0
    Qy = np.rint(Y64 / sy[:, None])
    ey = np.linalg.norm(Y64 - sy[:, None] * Qy, axis=1)
    yn = np.linalg.norm(Y64, axis=1)
    scale = scan.white.grid_step * sy                                    # float64 [m]: score = scale x product
    # |z_j . y - scale p_j| <= beta for every j (p_j = q_j . q_y, exact int32): the two grid roundings
    beta = (scan.white.grid_step * scan.q_norm_max * ey + (float(scan.white.grid_error.max()) + scan.white.grid_error_max) * yn) * 1.01
    zt = scan.Z.numpy()[cols].astype(np.float64)
    own_lo = (zt * Y64).sum(1) - exact_slack(r) * np.linalg.norm(zt, axis=1) * yn
    # "near": S_j + beta >= own_lo, i.e. the integer product p_j >= ceil((own_lo - beta) / scale):
    # thresholds in exact integers, so every reduction below runs on the int32 products themselves
    x = (own_lo - beta) / scale
    thr = np.clip(np.floor(x - np.abs(x) * 1e-12) - 1, -2 ** 31 + 2, 2 ** 31 - 1).astype(np.int32)
    return GridDirections(Y64=Y64, yn=yn, Qy=torch.from_numpy(Qy.astype(np.int8)), scale=scale, beta=beta,
                          own_lo=own_lo, thr=thr, zt=zt)


def int8_pass(scan: Scan, cols: np.ndarray, Y: np.ndarray, k_top: int = 0, top_rows=None):
    """Judge directions ``Y`` float32 [m, r] for the rows at positions ``cols`` [m] against every
    row, on the int8 grid, streaming over blocks of Q's rows (scores ``[m, block]`` of about
    :data:`~vocablens.argmax.blocks.BLOCK_BYTES`, blocks on worker threads).

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
    g = grid_directions(scan, cols, Y)
    if not k_top:
        want = None
    else:
        want = np.arange(m) if top_rows is None else np.asarray(top_rows, dtype=np.int64)
    state = _block_maxima(scan, cols, g, want, k_top)
    bv, bj = state[0]["bv"], state[0]["bj"]
    far, cnt = state[0]["far"], state[0]["cnt"]
    for w in state[1:]:
        up = w["bv"] > bv
        bv[up], bj[up] = w["bv"][up], w["bj"][up]
        far = np.maximum(far, w["far"])
        cnt = cnt + w["cnt"]
    best_up = _upper(g, bv)
    best_up[bv == _LOW] = -np.inf
    done = best_up < g.own_lo
    gap = np.where(done, g.own_lo - best_up, 0.0)
    jstar = bj.copy()
    _judge_near_rows(scan, g, state, far, cnt, done, gap, jstar)
    top = None if want is None else _merged_top(state, want, m, min(k_top, scan.n))
    lead = best_up / np.maximum(np.abs(g.own_lo), 1e-300)          # best competitor / own score
    slack = g.beta + exact_slack(r) * np.linalg.norm(g.zt, axis=1) * g.yn
    return done, gap, jstar, top, lead, slack


_LOW = np.iinfo(np.int32).min


def _upper(g: GridDirections, v: np.ndarray, q=slice(None)) -> np.ndarray:
    """Upper bounds on scores from integer products ``v``: ``scale x v`` rounded up, plus ``beta``."""
    f = v.astype(np.float64) * g.scale[q]
    return f + np.abs(f) * 8 * U64 + g.beta[q]


def _block_maxima(scan: Scan, cols: np.ndarray, g: GridDirections, want, k_top: int) -> list[dict]:
    """One pass over Q's row blocks on worker threads: per worker, each direction's best product
    ``bv`` and its row ``bj``, the largest product below the near threshold ``far``, the near pairs
    ``near`` (at most :data:`NEAR_MAX` + 1 per direction, counted in ``cnt``) and the ``k_top``
    best rows of the wanted directions (``tv``, ``ti``)."""
    m, n = len(cols), scan.n
    step = rows_per_block(m, 4, SCORE_BYTES)
    px = scan.products                                    # the exact int8 kernel (int8_ready)
    if px.align > 1:
        step = max(px.align, step // px.align * px.align)
    starts = list(range(0, n, step))
    workers = max(1, min(torch.get_num_threads(), len(starts)))
    thr, low, Qy_t = g.thr, _LOW, g.Qy
    thr_t = torch.from_numpy(thr)
    low64 = np.int64(np.iinfo(np.int32).min)
    state = [{"bv": np.full(m, low, dtype=np.int64), "bj": np.zeros(m, dtype=np.int64),
              "far": np.full(m, low, dtype=np.int64), "near": [], "cnt": np.zeros(m, dtype=np.int64),
              "tv": None, "ti": None} for _ in range(workers)]

    def work(a: int, w: int) -> None:
        scan.check_time()
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
    return state


def _judge_near_rows(scan: Scan, g: GridDirections, state: list[dict], far, cnt, done, gap, jstar) -> None:
    """The directions not yet certified with few near rows: those rows scored exactly in float64
    from Z, the others bounded by ``far``; fills ``done``, ``gap`` and ``jstar`` in place."""
    Zn, r = scan.Z.numpy(), scan.r
    pairs = [p for w in state for p in w["near"]]
    nq = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
    nj = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
    order = np.argsort(nq, kind="stable")
    nq, nj = nq[order], nj[order]
    for q in np.nonzero(~done & (cnt <= NEAR_MAX))[0]:
        near = np.unique(nj[np.searchsorted(nq, q):np.searchsorted(nq, q, side="right")])
        far_up = -np.inf if far[q] == _LOW else float(_upper(g, far[q:q + 1], slice(q, q + 1))[0])
        top_up = far_up                                        # near rows exact, the others bounded
        if len(near):
            zn = Zn[near].astype(np.float64)
            ex = zn @ g.Y64[q] + exact_slack(r) * np.linalg.norm(zn, axis=1) * g.yn[q]
            k = int(np.argmax(ex))
            jstar[q] = near[k]
            top_up = max(float(ex[k]), far_up)
        if top_up < g.own_lo[q]:
            done[q], gap[q] = True, g.own_lo[q] - top_up


def _merged_top(state: list[dict], want: np.ndarray, m: int, kk: int) -> np.ndarray:
    """The ``kk`` best rows of the wanted directions over all workers (best first): int64 [m, kk]."""
    top = np.zeros((m, kk), dtype=np.int64)
    tis = [w["ti"] for w in state if w["ti"] is not None]
    tvs = [w["tv"] for w in state if w["tv"] is not None]
    if tis and len(want):
        tv, ti = np.concatenate(tvs, 1), np.concatenate(tis, 1)
        o = np.argsort(-tv, axis=1, kind="stable")[:, :kk]
        top[want] = np.take_along_axis(ti, o, 1)
    return top


__all__ = ["NEAR_MAX", "GridDirections", "grid_directions", "int8_pass", "int8_ready"]
