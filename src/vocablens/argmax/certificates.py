"""Argmaxable certificates: stage ``gemm`` (all pairs, exact int8 grid), stage ``reflect`` (batched
Braid reflections) and stage ``verify`` (float64 re-check in the original coordinates).

- ``gemm``: the certificate ``y = q_i`` (the whitened row on the global int8 grid) for every token
  at once. ``Q Q^T`` by blocks, exact integer arithmetic, over the upper triangle only (it is
  symmetric: each block serves its rows and its columns), with a rigorous bound for the rounding
  ``z - q``. A token is settled when ``q_i.q_i`` beats every other ``q_j.q_i`` by more than the bound.
- ``reflect``: float32 re-check of the failures and at most ``reflect_iters`` reflections of the
  near misses across the hyperplane that separates them from their current winner (the "Braid
  reflect" of Grivas, Bogoychev and Lopez 2022, §4), by blocks of at most 256 columns
  (fewer when the scores [n, columns] would pass 16 MiB).
- ``verify``: float64 margins at the certificates, by blocks of rows (running maxima per token).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from vocablens.argmax.distributed import allreduce_max
from vocablens.ops.vocab_parallel.comm import world
from vocablens.argmax.result import DUPLICATE, UNDECIDED
from vocablens.argmax.state import U32, ScanState, rows_per_block

#: reflect columns at a time at most (the scores are [n, this] float32, capped at
#: :data:`~vocablens.argmax.state.BLOCK_BYTES`)
REFLECT_COLS = 256
#: columns handed to the interior screen at a time (it takes their scores [n, this] as a copy)
SCREEN_COLS = 32


def _fp32_exact_mm(r: int):
    """``(A, B) -> A @ B^T`` for int8 blocks (or their float32 copies) via float32 GEMMs.

    Each product is <= 127^2, so with at most 1,040 columns (127^2 * 1040 < 2^24) every partial
    sum is an exact integer in float32: one GEMM, float32 result (exact integers). Wider rows are
    cut into column slices of 1,040 whose exact partial results are summed in int32.
    """
    step = max(1, min(r, (2 ** 24 - 1) // (127 * 127)))
    if step >= r:
        return lambda A, B: A.float() @ B.float().T

    def f(A, B):
        out = None
        for c in range(0, r, step):
            part = (A[:, c:c + step].float() @ B[:, c:c + step].float().T).int()
            out = part if out is None else out.add_(part)
        return out
    return f


def exact_int_matmul(Q: torch.Tensor, prefer_int: bool = False):
    """An exact ``(A, B) -> A @ B^T`` for int8 row blocks of Q (int32, or float32 holding exact
    integers); the faster of two kernels.

    ``torch._int_mm`` (int8 products, int32 sums; fast with AVX512-VNNI/AMX, a slow fallback on
    plain AVX2) counts only when it reproduces an int64 reference on a sample of Q's own rows (it is
    wrong for some shapes, e.g. one column); Q is padded with zero columns to a multiple of 8 for it.
    The other kernel is float32 GEMMs (exact, see :func:`_fp32_exact_mm`). Both give the same
    integers; a short timing on Q's rows picks one.
    """
    n, r = Q.shape
    pad = (-r) % 8
    sample = Q[: min(n, 64)]
    ref = sample.cpu().long() @ sample.cpu().long().T          # int64 matmul: CPU only
    fp = _fp32_exact_mm(r)
    if not hasattr(torch, "_int_mm"):
        return fp

    def im(A, B):
        if pad:
            A = torch.nn.functional.pad(A, (0, pad))
            B = torch.nn.functional.pad(B, (0, pad))
        return torch._int_mm(A.contiguous(), B.contiguous().T)
    try:
        if not torch.equal(im(sample, sample).cpu().long(), ref):
            return fp
    except RuntimeError:
        return fp
    if prefer_int or Q.device.type != "cpu":
        return im
    A, B = Q[: min(n, 256)], Q[: min(n, 1024)]
    times = []
    for f in (im, fp):
        f(A, B)
        t = time.perf_counter()
        f(A, B)
        times.append(time.perf_counter() - t)
    return im if times[0] <= times[1] else fp


#: bytes of one product's scores in the all-pairs stage ([block, columns] float32 or int32)
GEMM_BYTES = 16 * 2 ** 20


def stage_gemm(st: ScanState, block: int) -> None:
    """Stage 1 for every open row; leaves the failures in ``st.left``.

    The upper triangle of ``Q Q^T`` by blocks of ``block`` rows x as many columns as fit :data:`GEMM_BYTES`: each
    product serves its rows (maxima along its rows) and its columns (along its columns), so
    V^2 r FLOPs in all (one multiply-add per pair, half of the full product) and the rows' maxima
    are complete once their own row block is done. Memory: the maxima [n] and one block of scores
    (:data:`GEMM_BYTES`).
    The budget is checked before each product; on :class:`~vocablens.argmax.state.OutOfTime` the
    rows whose maximum is complete (the row blocks done) are still judged, the rest stay open.

    A row certified here is the strict argmax of its own (quantised whitened) direction; no other
    certificate can be cheaper in general: one direction certifies at most one row (its argmax),
    and checking a direction costs a pass over all n rows, so n certificates cost n^2 r multiply-adds
    whichever directions they use (random directions included); the symmetric product halves that.
    """
    from vocablens.argmax.screen import MIN_WIDTH, screened_maxima
    from vocablens.argmax.state import OutOfTime

    n, Qt = st.n, st.Qt
    rank, size = world()
    st.gemm_pairs = (n * (n - 1) // 2, 0)
    if getattr(st, "screen", False) and Qt.shape[1] >= MIN_WIDTH and n > 1:
        tick = st.check_time if size == 1 else (lambda: None)
        try:
            best, complete, tails = screened_maxima(
                st, block, lambda Q: exact_int_matmul(Q, prefer_int=True), tick,
                lambda a, b: st.progress("gemm", a, b), rank, size, device=st.device)
        except OutOfTime:
            st.cut("gemm")
            best, complete, tails = np.full(n, math.inf), np.zeros(n, dtype=bool), 0
        if size > 1:
            bt = torch.from_numpy(best)
            allreduce_max(bt)
            best, complete = bt.numpy(), np.ones(n, dtype=bool)
        st.gemm_pairs = (n * (n - 1) // 2, int(tails))
        Q64 = Qt.long()
        dg = (Q64 * Q64).sum(1).double().numpy()
        del Q64
        _judge_stage1(st, dg, best, complete)
        return
    best_t, done = _dense_maxima(st, block, rank, size)
    diag = torch.empty(n, dtype=torch.float64)
    step = rows_per_block(Qt.shape[1])
    for s in range(0, n, step):
        qi = Qt[s:s + step].long()
        diag[s:s + step] = (qi * qi).sum(1).double()
    complete = np.zeros(n, dtype=bool)
    complete[:done] = True
    _judge_stage1(st, diag.numpy(), best_t.double().numpy(), complete)


def _dense_maxima(st: ScanState, block: int, rank: int, size: int):
    """Every pair's exact product (the upper triangle of ``Q Q^T``): the rows' maxima and the
    number of leading rows whose maximum is complete."""
    from vocablens.argmax.state import OutOfTime

    n = st.n
    dev = torch.device(getattr(st, "device", "cpu") or "cpu")
    Qt = st.Qt.to(dev)                                  # --device cuda: the products run on the GPU
    imm = exact_int_matmul(Qt)
    probe = imm(Qt[:2], Qt[:2])
    low = -math.inf if probe.is_floating_point() else torch.iinfo(torch.int32).min
    best = torch.full((n,), low, dtype=probe.dtype, device=dev)
    # columns per product: the scores [block, cols] and the columns' float32 copy [cols, r] fit
    # GEMM_BYTES (at least the block itself: the diagonal square is masked in the first product)
    col_chunk = max(block, rows_per_block(max(block, Qt.shape[1]), 4, GEMM_BYTES))
    done = 0
    try:
        for bi, i0 in enumerate(range(0, n, block)):
            if bi % size != rank:
                continue                                # another rank's block
            i1 = min(n, i0 + block)
            QI = Qt[i0:i1].float() if probe.is_floating_point() else Qt[i0:i1]
            for c0 in range(i0, n, col_chunk):
                if size == 1:
                    st.check_time()
                c1 = min(n, c0 + col_chunk)
                S = imm(QI, Qt[c0:c1])                      # [bi, bc] exact integers
                if c0 == i0:
                    k = min(i1, c1) - i0
                    ar = torch.arange(k, device=dev)
                    S[ar, ar] = low
                torch.maximum(best[i0:i1], S.amax(1), out=best[i0:i1])
                torch.maximum(best[c0:c1], S.amax(0), out=best[c0:c1])
                del S
            done = i1
            st.progress("gemm", i1, n)
    except OutOfTime:
        st.cut("gemm")
    best = best.cpu()
    if size > 1:
        # each rank picks its faster kernel by timing, so one rank's maxima may be int32 and
        # another's float32: reduce in float64, which holds both exactly (the same bytes reduced
        # as two dtypes gave garbage maxima, re-checked into "undecided")
        best = best.double()
        allreduce_max(best)
        done = n
    return best, done


def _judge_stage1(st: ScanState, dg: np.ndarray, best: np.ndarray, complete: np.ndarray) -> None:
    """Settle the rows whose certificate ``y = qs q_t`` beats ``best`` (an upper bound on the
    other rows' exact scores, q units) by more than the rounding bound."""
    # z_j . y = s^2 q_j . q_t + e_j . y with |e_j . y| <= ||e_j|| ||y||, y = s q_t
    qs = st.qs
    qn = np.sqrt(dg)
    ynorm = qs * qn
    m1 = qs * qs * (dg - best) - (st.enorm + st.emax) * ynorm * 1.001
    ok = (m1 > 0) & (qn > 0) & complete
    for k in np.nonzero(ok)[0]:
        t = int(st.reps[k])
        s, m = st.bias_scaled(t, float(m1[k]))
        st.scale[t] = s
        st.settle_arg(t, 1, m)
    st.left = np.nonzero(~ok)[0]
    st.s1_ratio = np.where(ok, m1 / ((st.enorm + st.emax) * ynorm + 1e-300), 0.0)


def stage_reflect(st: ScanState, iters: int, screen=None) -> None:
    """Stage 2 on ``st.left``; failures stay in ``st.left``.

    The open rows go through one pool of at most :data:`REFLECT_COLS` columns (fewer when their
    scores [n, columns] would pass :data:`~vocablens.argmax.state.BLOCK_BYTES`): each pass scores
    every pooled direction against all rows with one product, settles the columns it certifies,
    reflects the others, and refills the freed columns from the rows still waiting. A pass costs
    about one read of Z however few columns it holds, so the pool keeps passes full: the number of
    passes is about (column-iterations) / (pool width) plus the slowest column's iterations (it was
    the sum, over fixed blocks of columns, of each block's slowest column).

    Args:
        iters: scorings per column at most (the first at ``y = z_t``, then after each reflection).
        screen: optional ``(state, cols, S) -> bool mask`` called (for at most :data:`SCREEN_COLS`
            columns at a time) with the scores
            ``S [n, m]`` at ``y = z_t`` (own scores masked out) for the columns the float32 re-check
            did not settle; it returns the columns it settled itself (a quick interior proof), which
            then skip the reflections.
    """
    if not len(st.left) or iters <= 0:
        return
    Zt, coef = st.Zt, (st.r * U32 / (1 - st.r * U32) + 3 * U32) * 1.01
    still: list[np.ndarray] = []
    left = st.left
    ncol = rows_per_block(st.n, 4, most=REFLECT_COLS)        # the scores [n, ncol] fit BLOCK_BYTES
    cols = torch.zeros(0, dtype=torch.int64)
    Y = torch.zeros(st.r, 0, dtype=Zt.dtype)
    age = np.zeros(0, dtype=np.int64)                        # scorings done per pooled column
    nxt, finished = 0, 0
    while True:
        if st.time_left() <= 0:
            st.cut("reflect")
            still += [cols.numpy(), left[nxt:]]
            break
        add = left[nxt:nxt + ncol - len(cols)]
        nxt += len(add)
        if len(add):
            at = torch.from_numpy(add)
            cols, Y = torch.cat([cols, at]), torch.cat([Y, Zt[at].T], dim=1)
            age = np.concatenate([age, np.zeros(len(add), dtype=np.int64)])
        if not len(cols):
            break
        S = Zt @ Y                                      # [n, m]
        ar = torch.arange(len(cols))
        own = S[cols, ar].clone()
        S[cols, ar] = -math.inf
        bestv, jstar = S.max(0)
        ynorm = Y.double().norm(dim=0).numpy()
        mm = (own - bestv).double().numpy()
        bnd = coef * ynorm * (st.znorm[cols.numpy()] + st.zmax) + 1e-30
        done = mm > bnd
        for q in np.nonzero(done)[0]:
            t = int(st.reps[int(cols[q])])
            st.settle_arg_y(t, 2, Y[:, q].double().numpy(), float(mm[q] - bnd[q]))
        fresh = np.nonzero(~done & (age == 0))[0]            # first scoring, at y = z_t
        if screen is not None and len(fresh):
            for j in range(0, len(fresh), SCREEN_COLS):      # S[:, part] is a copy: small parts
                part = fresh[j:j + SCREEN_COLS]
                done[part] |= screen(st, cols[part].numpy(), S[:, part])
        del S
        age += 1
        spent = ~done & (age >= iters)
        still.append(cols.numpy()[spent])
        finished += int((done | spent).sum())
        keepc = torch.from_numpy(~(done | spent))
        Y, cols, jstar, age = Y[:, keepc], cols[keepc], jstar[keepc], age[keepc.numpy()]
        if len(cols):
            nv = Zt[cols].T - Zt[jstar].T                # [r, m]  z_t - z_j
            coefr = (nv * Y).sum(0) / (nv * nv).sum(0).clamp_min(1e-30)
            Y = Y - 2.0 * coefr * nv
        st.progress("reflect", finished, len(left))
    st.left = np.sort(np.concatenate(still)) if still else np.zeros(0, dtype=np.int64)


# ----------------------------------------------------------------------------------------- verify
def verify_argmaxable(Wn, bn, in_play, tokens, cert, twins_of=None, chunk: int = 512, progress=None,
                      deadline: float | None = None, release=None):
    """float64 margins ``l_t(x_t) - max_{j in play, j != t, j not a twin} l_j(x_t)`` for tokens [k].

    Args:
        Wn: rows ``[V, d]`` (numpy, float32 or float64); bn: bias [V] or None; in_play: bool [V].
        tokens: int64 [k]; cert: ``t -> x`` float64 [d].
        chunk: tokens per pass over the rows (lowered so their certificates ``[d, chunk]`` fit
            :data:`~vocablens.argmax.state.BLOCK_BYTES`).
        deadline: ``time.perf_counter()`` value after which no new pass starts.
        release: optional ``(start, stop)`` callback after each block of rows ``[start, stop)`` is
            read (:class:`~vocablens.models.pages.PageRelease`: hands their pages back).

    Returns:
        float64 [k] margins (logit units); NaN for tokens not reached before the deadline.

    Memory: one block of rows in float64 and their scores ``[rows, chunk]`` (about
    :data:`~vocablens.argmax.state.BLOCK_BYTES` each), whatever V: the maxima are kept per token.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    out = np.full(len(tokens), np.nan)
    play = np.nonzero(in_play)[0]
    pos = np.full(len(in_play), -1)
    pos[play] = np.arange(len(play))
    d = Wn.shape[1]
    chunk = rows_per_block(d, 8, most=chunk)
    step = min(rows_per_block(chunk, 8), rows_per_block(d, 8))
    for s in range(0, len(tokens), chunk):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        tk = tokens[s:s + chunk]
        X = np.stack([cert(t) for t in tk], axis=1)               # [d, k]
        # (row, column) entries left out of each token's maximum: its own row and its twins
        mr = [np.atleast_1d(pos[t]) for t in tk]
        if twins_of is not None:
            mr = [np.concatenate([m, pos[np.asarray(twins_of(t), dtype=np.int64)]]) for m, t in zip(mr, tk)]
        mrow = np.concatenate(mr)
        mcol = np.repeat(np.arange(len(tk)), [len(m) for m in mr])
        own = np.full(len(tk), np.nan)
        best = np.full(len(tk), -np.inf)
        for r0 in range(0, len(play), step):
            rows = play[r0:r0 + step]
            L = Wn[rows].astype(np.float64) @ X                    # [rows, k]
            if bn is not None:
                L += bn[rows][:, None]
            q = np.nonzero((pos[tk] >= r0) & (pos[tk] < r0 + step))[0]
            own[q] = L[pos[tk[q]] - r0, q]
            sel = (mrow >= r0) & (mrow < r0 + step)
            L[mrow[sel] - r0, mcol[sel]] = -np.inf
            np.maximum(best, L.max(0), out=best)
            if release is not None:
                release(rows[0], rows[-1] + 1)
        out[s:s + len(tk)] = own - best if len(play) > 1 else math.inf
        if progress:
            progress(min(s + chunk, len(tokens)), len(tokens))
    return out


def cert_x(st: ScanState, t: int) -> np.ndarray:
    """The argmaxable certificate of token t in the original coordinates, float64 [d]."""
    t = int(t)
    if t in st.x_extra:
        return st.x_extra[t].numpy()
    k = int(st.row_of[t])
    return st.scale[t] * (st.A @ (st.qs * st.q_rows(k, k + 1)[0].numpy().astype(np.float64)))


def stage_verify(st: ScanState, mode: str) -> None:
    """float64 re-check of the certificates from stages 2+ and (``"borderline"``) of the 256
    stage-1 certificates with the smallest margin relative to their error bound, or (``"all"``)
    of every certificate. A failed re-check never leaves a verdict standing: the token becomes
    undecided. With a budget, certificates not reached keep their certified float32 margins."""
    cand = np.nonzero((st.stage >= 1) & ~np.isnan(st.margin))[0]
    if mode == "all":
        chosen = cand.astype(np.int64)
    else:
        s1 = cand[st.stage[cand] == 1]
        later = cand[st.stage[cand] != 1]
        pick = np.zeros(0, dtype=np.int64)
        if len(s1):
            ratio = st.s1_ratio[st.row_of[s1]]
            pick = s1[np.argsort(ratio)[:256]]
        chosen = np.unique(np.concatenate([later, pick])).astype(np.int64)
    res = verify_argmaxable(st.Wn, st.bn, st.in_play, chosen, lambda t: cert_x(st, t),
                            twins_of=lambda t: st.twins.get(int(t), np.zeros(0, dtype=np.int64)),
                            progress=lambda a, b: st.progress("verify", a, b), deadline=st.deadline,
                            release=None if st.pages is None else st.pages.release)
    for t, m in zip(chosen, res):
        if np.isnan(m):
            st.cut("verify")
            continue
        st.verified += 1
        if m > 0:
            st.margin[t] = m
        else:
            # never report a verdict the float64 check does not confirm
            if st.verdict[t] == DUPLICATE:
                st.group_can_tie.pop(int(st.group[t]), None)
            else:
                st.verdict[t] = UNDECIDED
            st.reasons[int(t)] = f"float64 re-check of the certificate gave margin {m:.3g}"
            st.margin[t] = np.nan
    st.settled["verify"] = st.verified
