"""The all-pairs stage below its full cost: an exact half-width screen with a sound tail bound.

Stage ``gemm`` needs, for every distinct row t, an upper bound ``best_t >= max_{j != t} q_j . q_t``
(exact integers on the int8 grid Q [n, r]) and certifies t when ``best_t`` is below its threshold
``thr_t`` (:func:`thresholds`). The full symmetric product costs n^2 r / 2 multiply-adds. Split
the r coordinates into a *head* H (``m`` of them, a fixed pseudo-random subset) and a *tail* T.
For every pair

    q_i . q_j = h_i . h_j + t_i . t_j <= h_i . h_j + ||t_i|| ||t_j||        (Cauchy-Schwarz)

so the exact head product (int8 products, exact integer sums, :func:`exact_int_matmul`) plus the
tail norms bounds every pair; only the pairs whose bound reaches a threshold get their tail product
(exact integers, gathered, or one dense tail product for a block where many pairs need it). In
whitened coordinates ``q_t . q_t`` is about r while other pairs are about +-sqrt(r), so a half-width
head clears nearly every pair (SmolLM2-135M: 2 in 10,000 pairs need a tail), and the stage costs
about n^2 m / 2 multiply-adds instead of n^2 r / 2. Rows are taken in decreasing norm so that the
tail bound of a block (``||t_i|| * max_{j in block} ||t_j||``) stays close to the pair's own.

Soundness (no floating-point guess): head products are exact integers (float32 holds integers below
2^24 exactly; the kernel is checked against int64 on Q's own rows); tail norms are float64 square
roots of exact integer sums, inflated by ``1 + 1e-12`` (far above float64 rounding, 2^-53 per
operation); every comparison runs in float64 on vectors [block]. A pair is skipped only when its
bound is below both rows' thresholds, and the maxima then hold the bound (never less than the exact
value), so the rows certified are exactly those the full product certifies: verdicts are identical;
the reported stage-1 margins are lower bounds (the float64 re-check replaces the borderline ones).
Tested on adversarial near-ties (pairs whose exact product sits one integer below and at the
threshold) in tests/unit/test_argmax_screen.py.

Source: the bound is the incremental-pruning idea of exact MIPS (LEMP, Teflioudi, Gemulla and
Mykytiuk, SIGMOD 2015; FEXIPRO, Li et al., SIGMOD 2017: a partial inner product plus a Cauchy-Schwarz
bound on the rest); applied here to the symmetric all-pairs certificate product.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: fraction of the whitened coordinates in the head (measured on SmolLM2: 1/4 leaves 13% of the pairs,
#: 1/2 leaves 0.02%)
HEAD_FRACTION = 0.5
#: a block whose flagged pairs pass this fraction of its entries gets one dense tail product
DENSE_FRACTION = 1.0 / 32
#: a block where more than this fraction of its rows (or columns) need refining gets one dense tail product
DENSE_LINES = 0.25
#: the screen is used from this width on (narrower rows: the full product is as cheap)
MIN_WIDTH = 48
#: relative inflation of the tail norms (float64 rounding is 2^-53 per operation)
INFLATE = 1e-12


def head_columns(r: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed pseudo-random split of ``range(r)`` into head (``HEAD_FRACTION`` of them) and tail."""
    m = max(1, min(r - 1, int(round(r * HEAD_FRACTION))))
    perm = np.random.default_rng(seed).permutation(r)
    return np.sort(perm[:m]), np.sort(perm[m:])


def thresholds(st, dg: np.ndarray, qn: np.ndarray) -> np.ndarray:
    """float64 [n]: row t is certified by stage ``gemm`` iff ``best_t`` is below this (q units).

    ``m1 = qs^2 (dg - best) - (enorm + emax) qs qn * 1.001 > 0``; lowered by a hair (1e-9 relative,
    one integer) so a float64 rounding of the threshold never clears a pair that the final test
    would not."""
    thr = dg - (st.enorm + st.emax) * qn * 1.001 / st.qs
    return thr - 1e-9 * np.abs(thr) - 1.0


def screened_maxima(st, block: int, imm_factory, check_time, progress, rank: int = 0, size: int = 1,
                    device: str = "cpu"):
    """Upper bounds on every row's largest competitor score, by the head screen.

    Args:
        st: the scan state (``Qt`` int8 [n, r], ``enorm``, ``emax``, ``qs``).
        block: rows per block (rows and columns alike).
        imm_factory: ``Q -> (A, B) -> A @ B^T`` exact integer kernel
            (:func:`~vocablens.argmax.certificates.exact_int_matmul`).
        check_time: called before each product (raises OutOfTime).
        progress: ``(done, total)`` callback.
        rank, size: torch.distributed rank and world size (blocks dealt round-robin).
        device: where the products run (``"cuda"``: on the GPU; results are the same integers).

    Returns:
        ``(best float64 [n], complete bool [n], pairs_tail int)``: ``best[k] >= max_{j != k}
        q_j . q_k`` for every k with ``complete[k]``; the number of pairs whose tail was computed.
    """
    Qt = st.Qt
    n, r = Qt.shape
    hc, tc = head_columns(r)
    hc_t, tc_t = torch.from_numpy(hc), torch.from_numpy(tc)
    Q64 = Qt.long()
    dg = (Q64 * Q64).sum(1).double().numpy()
    Qtail = Q64[:, tc_t]
    tn = np.sqrt((Qtail * Qtail).sum(1).double().numpy()) * (1 + INFLATE)
    del Q64, Qtail
    qn = np.sqrt(dg)
    thr = thresholds(st, dg, qn)
    order = np.argsort(-tn, kind="stable")              # decreasing tail norm
    Qh = Qt[torch.from_numpy(order)][:, hc_t].contiguous()      # [n, m] int8, in that order
    Qtl = Qt[torch.from_numpy(order)][:, tc_t].contiguous()     # [n, r - m]
    if device != "cpu":
        Qh, Qtl = Qh.to(device), Qtl.to(device)
    tn_o, thr_o = tn[order], thr[order]
    imm_h = imm_factory(Qh)
    imm_t = imm_factory(Qtl)
    best = np.full(n, -math.inf)
    done = np.zeros(n, dtype=bool)
    tails = 0
    starts = list(range(0, n, block))
    for bi, i0 in enumerate(starts):
        if bi % size != rank:
            continue
        i1 = min(n, i0 + block)
        for j0 in range(i0, n, block):
            check_time()
            j1 = min(n, j0 + block)
            tails += _block(Qh, Qtl, imm_h, imm_t, i0, i1, j0, j1, tn_o, thr_o, best)
        done[i0:i1] = True
        progress(i1, n)
    out = np.empty(n)
    out[order] = best
    comp = np.zeros(n, dtype=bool)
    comp[order] = done
    return out, comp, tails


#: rows per group inside a block: the tail bound of a pair uses its group's largest tail norm
GROUP = 256


def _group_bounds(H: torch.Tensor, t_self: np.ndarray, t_other: np.ndarray, dim: int) -> np.ndarray:
    """Per line of H (rows when ``dim == 1``, columns when 0): ``max_g (max_{j in g} h.h_j +
    ||t|| max_{j in g} ||t_j||)`` over groups g of :data:`GROUP` lines of the other side (sorted by
    decreasing tail norm: a group's largest is its first), a bound on every pair of the line.
    One pass over H (a reshape; the last, shorter group apart)."""
    n_other = H.shape[dim]
    full = (n_other // GROUP) * GROUP
    parts = []
    if full:
        if dim == 1:
            M = H[:, :full].reshape(H.shape[0], full // GROUP, GROUP).amax(2)       # [lines, G]
        else:
            M = H[:full].reshape(full // GROUP, GROUP, H.shape[1]).amax(1).T        # [lines, G]
        parts.append(M.double().cpu().numpy() + t_self[:, None] * t_other[0:full:GROUP][None])
    if full < n_other:
        rest = H[:, full:] if dim == 1 else H[full:]
        parts.append((rest.amax(dim).double().cpu().numpy() + t_self * t_other[full])[:, None])
    return np.concatenate(parts, axis=1).max(1)


def _block(Qh, Qtl, imm_h, imm_t, i0, i1, j0, j1, tn, thr, best) -> int:
    """One block pair (rows i0:i1 against columns j0:j1, j0 >= i0): updates ``best`` for both.
    Returns the number of pairs whose tail product was computed."""
    H = imm_h(Qh[i0:i1], Qh[j0:j1])                   # [bi, bj] exact integers
    if j0 == i0:                                       # the diagonal square: a row is no competitor
        k = min(i1, j1) - i0
        ar = torch.arange(k, device=H.device)
        H[ar, ar] = -2 ** 30                           # below any real score (|q.q| <= r 127^2 < 2^24)
    ti, tj = tn[i0:i1], tn[j0:j1]
    rb = _group_bounds(H, ti, tj, 1)
    cb = _group_bounds(H, tj, ti, 0)
    tails = 0
    bad_r = np.nonzero(rb >= thr[i0:i1])[0]
    bad_c = np.nonzero(cb >= thr[j0:j1])[0]
    if len(bad_r) > DENSE_LINES * len(ti) or len(bad_c) > DENSE_LINES * len(tj):
        # many lines to refine (the largest norms against the rest): the block's exact tail product
        S = H.float() + imm_t(Qtl[i0:i1], Qtl[j0:j1]).float()     # exact integers < 2^24
        if j0 == i0:
            S[ar, ar] = -math.inf
        np.maximum(best[i0:i1], S.amax(1).double().cpu().numpy(), out=best[i0:i1])
        np.maximum(best[j0:j1], S.amax(0).double().cpu().numpy(), out=best[j0:j1])
        return int(S.numel())
    if len(bad_r) or len(bad_c):
        Hn = H.cpu().numpy()
        if len(bad_r):
            rb[bad_r], n_ = _refine(Hn, Qtl, imm_t, i0, j0, bad_r, ti, tj, thr[i0:i1], rows=True)
            tails += n_
        if len(bad_c):
            cb[bad_c], n_ = _refine(Hn, Qtl, imm_t, i0, j0, bad_c, tj, ti, thr[j0:j1], rows=False)
            tails += n_
    np.maximum(best[i0:i1], rb, out=best[i0:i1])
    np.maximum(best[j0:j1], cb, out=best[j0:j1])
    return tails


def _refine(Hn, Qtl, imm_t, i0, j0, sel, ts, to, th, rows: bool):
    """Maxima of the selected rows (``rows``) or columns of the block (numpy ``Hn``), each pair
    bounded by its own ``h.h + ||t|| ||t'||`` and the pairs whose bound reaches the threshold made
    exact (small numpy work, one thread: no thread wake-ups on a shared machine)."""
    Hl = (Hn[sel] if rows else Hn[:, sel].T).astype(np.float64)      # [k, other side]
    Hs = Hl + ts[sel][:, None] * to[None]
    a, b = np.nonzero(Hs >= th[sel][:, None])
    mine, other = (i0, j0) if rows else (j0, i0)
    if len(a) > DENSE_FRACTION * Hs.size:          # many: one exact tail product for these lines
        A = Qtl[torch.from_numpy(mine + sel).to(Qtl.device)]
        B = Qtl[other:other + Hs.shape[1]]
        exact = Hl + imm_t(A, B).double().cpu().numpy()
        exact[Hl < -2.0 ** 29] = -math.inf                    # the diagonal entry
        return exact.max(1), int(Hs.size)
    if len(a):
        A = Qtl[torch.from_numpy(mine + sel[a]).to(Qtl.device)].cpu().numpy().astype(np.int32)
        B = Qtl[torch.from_numpy(other + b).to(Qtl.device)].cpu().numpy().astype(np.int32)
        Hs[a, b] = Hl[a, b] + np.einsum("ij,ij->i", A, B)    # exact integer tails
    return Hs.max(1), int(len(a))
