"""Argmaxable certificates: stage ``gemm`` (all pairs, exact int8 grid) and stage ``reflect`` (batched
Braid reflections); stage ``verify`` (float64 re-check in the original coordinates) is in
:mod:`~vocablens.argmax.verify`.

- ``gemm``: the certificate ``y = q_i`` (the whitened row on the global int8 grid) for every token
  at once. ``Q Q^T`` by blocks, exact integer arithmetic, over the upper triangle only (it is
  symmetric: each block serves its rows and its columns), with a rigorous bound for the rounding
  ``z - q``. A token is settled when ``q_i.q_i`` beats every other ``q_j.q_i`` by more than the bound.
- ``reflect``: float32 re-check of the failures and at most ``reflect_iters`` reflections of the
  near misses across the hyperplane that separates them from their current winner (the "Braid
  reflect" of Grivas, Bogoychev and Lopez 2022, §4), by blocks of at most 256 columns
  (fewer when the scores [n, columns] would pass 16 MiB).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from vocablens.argmax.distributed import allreduce_max, gather_near
from vocablens.argmax.kernels import fp32_exact_mm, exact_products
from vocablens.ops.vocab_parallel.comm import world
from vocablens.argmax.decisions import Argmaxable, StageResult, Stopped, argmaxable_at, still_open
from vocablens.argmax.near import Bounds, NearPairs, judge
from vocablens.argmax.sparse import screen_interior
from vocablens.argmax.scoring import int8_pass, int8_ready
from vocablens.argmax.blocks import U32, rows_per_block, scores_against
from vocablens.argmax.scan import Scan
from vocablens.argmax.tilt import TILT_NORM

#: reflect columns at a time at most (the scores are [n, this] float32, capped at
#: :data:`~vocablens.argmax.blocks.BLOCK_BYTES`)
REFLECT_COLS = 256
#: columns handed to the interior screen at a time
SCREEN_COLS = 32
#: the interior screen tries a row only when its best competitor scores at least this times its own
#: score at ``y = z_t`` (planted midpoints score about twice their own; docs/performance-argmax.md)
SCREEN_LEAD = 1.25


def exact_int_matmul(Q: torch.Tensor):
    """An exact ``(A, B) -> A @ B^T`` for int8 row blocks of Q (int32, or float32 holding exact
    integers); the faster of two kernels.

    ``torch._int_mm`` (int8 products, int32 sums; fast with AVX512-VNNI/AMX, a slow fallback on
    plain AVX2) counts only when it reproduces an int64 reference on a sample of Q's own rows (it is
    wrong for some shapes, e.g. one column); Q is padded with zero columns to a multiple of 8 for it.
    The other kernel is float32 GEMMs (exact, see :func:`~vocablens.argmax.kernels.fp32_exact_mm`). Both give the same
    integers; a short timing on Q's rows picks one.
    """
    n, r = Q.shape
    pad = (-r) % 8
    sample = Q[: min(n, 64)]
    ref = sample.cpu().long() @ sample.cpu().long().T          # int64 matmul: CPU only
    fp = fp32_exact_mm(r)
    if not hasattr(torch, "_int_mm"):
        return fp

    def im(A, B):
        if pad:
            A = torch.nn.functional.pad(A, (0, pad))
            B = torch.nn.functional.pad(B, (0, pad))
        if A.device.type == "cuda":  # CUDA's kernel takes more than 16 rows of A and rows of B in eights
            m, nb = A.shape[0], B.shape[0]
            A = torch.nn.functional.pad(A, (0, 0, 0, max(0, 17 - m)))
            B = torch.nn.functional.pad(B, (0, 0, 0, (-nb) % 8))
            return torch._int_mm(A.contiguous(), B.contiguous().T)[:m, :nb].contiguous()
        return torch._int_mm(A.contiguous(), B.contiguous().T)
    try:
        if not torch.equal(im(sample, sample).cpu().long(), ref):
            return fp
    except RuntimeError:
        return fp
    if Q.device.type != "cpu":
        return im
    A, B = Q[: min(n, 256)], Q[: min(n, 1024)]
    times = [math.inf, math.inf]
    for _ in range(3):                  # the best of three, interleaved: one slow call on a shared
        for k, f in enumerate((im, fp)):    # machine must not pick the slower kernel for a whole scan
            t = time.perf_counter()
            f(A, B)
            times[k] = min(times[k], time.perf_counter() - t)
    return im if times[0] <= times[1] else fp


#: bytes of one product's scores in the all-pairs stage ([block, columns] float32 or int32): small
#: enough that the two reductions over them read a cached block (docs/performance-argmax.md)
GEMM_BYTES = 2 * 2 ** 20


def stage_gemm(scan: Scan, block: int) -> StageResult:
    """Stage 1 for every distinct row: the rows it certifies (:class:`~vocablens.argmax.decisions.Argmaxable`
    with no explicit x: ``scale A (qs q_t)``), the failures open, each row's ``bound_ratio``, the
    exact int8 kernel it picked (``products``) and ``q_dot_max``.

    The upper triangle of ``Q Q^T`` by blocks of ``block`` rows x as many columns as fit :data:`GEMM_BYTES`: each
    product serves its rows (maxima along its rows) and its columns (along its columns), so
    V^2 r FLOPs in all (one multiply-add per pair, half of the full product) and the rows' maxima
    are complete once their own row block is done. Memory: the maxima [n] and one block of scores
    (:data:`GEMM_BYTES`).
    The budget is checked before each product; when it runs out the rows whose maximum is complete
    (the row blocks done) are still judged, the rest stay open, and the result is ``cut``.

    A row certified here is the strict argmax of its own (quantised whitened) direction; no other
    certificate can be cheaper in general: one direction certifies at most one row (its argmax),
    and checking a direction costs a pass over all n rows, so n certificates cost n^2 r multiply-adds
    whichever directions they use (random directions included); the symmetric product halves that.
    """
    n = scan.n
    rank, size = world()
    decided: list = []
    with Stopped() as stop:
        bounds = Bounds(scan)
        best_t, done, near, px, cut = _dense_maxima(scan, block, rank, size, bounds.thresholds(scan))
        complete = np.zeros(n, dtype=bool)
        complete[:done] = True
        ok, m1, ratio = judge(scan, best_t.double().numpy(), complete, bounds, near)
        for k in np.nonzero(ok)[0]:
            t = int(scan.distinct.ids[k])
            s, m = scan.bias_scaled(t, float(m1[k]))
            decided.append(Argmaxable(token=t, stage=1, margin=m, scale=s))
        return StageResult(name="gemm", decided=tuple(decided), open=np.nonzero(~ok)[0], cut=cut,
                           bound_ratio=(np.arange(n), ratio), q_dot_max=bounds.q_dot_max, products=px)
    return StageResult(name="gemm", decided=tuple(decided), open=still_open(np.arange(n), decided, scan.distinct.position),
                       cut=stop.cut, interrupted=stop.interrupted)


def _pick_kernel(scan: Scan, Qt: torch.Tensor, dev: torch.device, workers: int):
    """The all-pairs stage's exact kernel, picked (timed) on as many torch threads as each worker
    runs: ``(px, imm, probe)``, the scan's int8 kernel for the CPU
    (:func:`~vocablens.argmax.kernels.exact_products`) or None, the GPU's product (``--device
    cuda``) or None, and one product of two rows (its dtype is the scores')."""
    threads = torch.get_num_threads()
    if workers > 1:
        torch.set_num_threads(1)                        # the kernel is picked (timed) as it will run
    try:
        px = exact_products(scan.Q, scan.device) if dev.type == "cpu" else None     # the scan's exact int8 kernel
        imm = exact_int_matmul(Qt) if px is None else None          # the GPU's (--device cuda)
        probe = imm(Qt[:2], Qt[:2]) if px is None else px.mm(Qt[:2], 0, 2)
    finally:
        torch.set_num_threads(threads)
    return px, imm, probe


def _dense_maxima(scan: Scan, block: int, rank: int, size: int, T: np.ndarray):
    """Every pair's exact product (the upper triangle of ``Q Q^T``): the rows' maxima, the number
    of leading rows whose maximum is complete, the :class:`~vocablens.argmax.near.NearPairs`
    whose product reaches the row's threshold ``T`` [n] (every rank's, under torch.distributed),
    the exact int8 kernel picked (:func:`~vocablens.argmax.kernels.exact_products`; None on a GPU)
    and whether the budget cut the pass short.

    On the CPU the row blocks go to ``torch.get_num_threads()`` Python workers that each run their
    products and reductions on one torch thread (a shared counter hands out the blocks; each worker
    keeps its own maxima, merged at the end): a product is then never a parallel region whose threads
    wait for each other (on a shared machine a descheduled peer stalls the others). The
    main thread is one of the workers and reports the progress."""
    from vocablens.argmax.blocks import OutOfTime, run_in_workers

    n = scan.n
    dev = torch.device(scan.device or "cpu")
    Qt = scan.Q.to(dev)                                  # --device cuda: the products run on the GPU
    mine = [i0 for bi, i0 in enumerate(range(0, n, block)) if bi % size == rank]
    workers = max(1, min(torch.get_num_threads(), len(mine))) if dev.type == "cpu" else 1
    finished: set = set()
    told = [0]

    def complete_rows() -> int:                         # leading rows whose blocks are all done
        d = 0
        while d < n and d in finished:
            d = min(n, d + block)
        return d

    def work(i0: int, w: int) -> None:
        best = bests[w]
        i1 = min(n, i0 + block)
        QI = Qt[i0:i1].float() if floating and (px is None or px.kind == "float32") else Qt[i0:i1]
        for c0 in range(i0, n, col_chunk):
            if size == 1:
                scan.check_time()
            c1 = min(n, c0 + col_chunk)
            S = imm(QI, Qt[c0:c1]) if px is None else px.mm(QI, c0, c1)     # [bi, bc] exact integers
            if c0 < i1:                                 # the diagonal runs through it: masked
                ar = torch.arange(c0, min(i1, c1), device=dev)
                S[ar - i0, ar - c0] = low
            rmax, cmax = S.amax(1), S.amax(0)
            torch.maximum(best[i0:i1], rmax, out=best[i0:i1])
            torch.maximum(best[c0:c1], cmax, out=best[c0:c1])
            if near is not None:
                near.take(S, rmax, cmax, i0, c0, w)
            del S
        finished.add(i0)                                # one set.add: atomic under the GIL
        now = complete_rows() if size == 1 else i1
        if w == 0 and now > told[0]:                    # progress from the main thread only
            told[0] = now
            scan.progress("gemm", now, n)

    px, imm, probe = _pick_kernel(scan, Qt, dev, workers)
    floating = probe.is_floating_point()
    low = -math.inf if floating else torch.iinfo(torch.int32).min
    bests = [torch.full((n,), low, dtype=probe.dtype, device=dev) for _ in range(workers)]
    near = NearPairs(T, workers, probe.dtype, dev)
    col_chunk = _column_chunk(block, int(Qt.shape[1]), px)
    cut = False
    try:
        run_in_workers(mine, work, workers)
    except OutOfTime:
        cut = True
    done = complete_rows() if size == 1 else n
    if size == 1 and done > told[0] and not cut:
        scan.progress("gemm", done, n)
    return _merged_maxima(bests, near, size), done, near, px, cut


def _column_chunk(block: int, r: int, px) -> int:
    """Columns per product of the all-pairs pass: the scores [block, cols] and the columns' float32
    copy [cols, r] fit GEMM_BYTES (the block's diagonal square may span several products: each masks
    its part); whole packed chunks for a packed kernel ``px``."""
    col_chunk = rows_per_block(max(block, r), 4, GEMM_BYTES)
    if px is not None and px.align > 1:
        col_chunk = max(px.align, col_chunk // px.align * px.align)
    return col_chunk


def _merged_maxima(bests: list[torch.Tensor], near: NearPairs, size: int) -> torch.Tensor:
    """The rows' maxima [n] over the workers' ``bests`` (merged in place into the first), on the CPU;
    under torch.distributed over every rank too, whose near pairs are gathered as well."""
    best = bests[0]
    for b in bests[1:]:
        torch.maximum(best, b, out=best)
    best = best.cpu()
    if size > 1:
        # each rank picks its faster kernel by timing, so one rank's maxima may be int32 and
        # another's float32: reduce in float64, which holds both exactly (the same bytes reduced
        # as two dtypes gave garbage maxima, re-checked into "undecided")
        best = best.double()
        allreduce_max(best)
        gather_near(near)
    return best


#: competitors kept per row the first scoring leaves open (the proof stage starts from them and
#: the interior screen tries them)
START_TOP = 32


def stage_reflect(scan: Scan, left: np.ndarray, iters: int, parts=None) -> StageResult:
    """Stage 2 on the open rows ``left`` (int64 positions into ``distinct.ids``): the rows it
    decides, those left open, the rigorous certificates' ``bound_ratio`` and the top competitors
    of the rows left open (``start_top``, where the proof stage starts).

    The open rows go through one pool of at most :data:`REFLECT_COLS` columns (fewer when their
    scores [n, columns] would pass :data:`~vocablens.argmax.blocks.BLOCK_BYTES`): each pass scores
    every pooled direction against all rows with one product, settles the columns it certifies,
    reflects the others, and refills the freed columns from the rows still waiting. A pass costs
    about one read of Z however few columns it holds, so the pool keeps passes full: the number of
    passes is about (column-iterations) / (pool width) plus the slowest column's iterations (it was
    the sum, over fixed blocks of columns, of each block's slowest column).

    Args:
        iters: scorings per column at most (the first at ``y = z_t``, then after each reflection).
        parts: the :class:`~vocablens.argmax.sparse.InteriorParts` of a scan without bias, or None.
            With them the columns the first scoring did not settle get a quick interior proof
            (:func:`~vocablens.argmax.sparse.screen_interior`, at most :data:`SCREEN_COLS` columns at
            a time, from the :data:`START_TOP` rows scoring highest at ``y = z_t``); the columns it
            settles skip the reflections.
    """
    if not len(left) or iters <= 0:
        return StageResult(name="reflect", decided=(), open=left)
    decided: list = []
    with Stopped() as stop:
        return _reflect(scan, left, iters, parts, decided)
    return StageResult(name="reflect", decided=tuple(decided), open=still_open(left, decided, scan.distinct.position),
                       cut=stop.cut, interrupted=stop.interrupted)


def _float32_pass(scan: Scan, Zn: np.ndarray, cols: np.ndarray, Y: np.ndarray):
    """Directions ``Y`` float32 [m, r] for the rows ``cols`` [m] scored against all rows ``Zn`` in
    float32 with the GEMM's rounding bound: ``(done, gap, jstar, lead, S)`` as
    :func:`~vocablens.argmax.scoring.int8_pass` gives them, and the scores ``S`` [m, n] (own
    entries -inf). Scores [m, n]: numpy's float32 GEMM and reductions along rows (faster than
    torch's [n, m] product and column maxima: docs/performance-argmax.md)."""
    coef = (scan.r * U32 / (1 - scan.r * U32) + 3 * U32) * 1.01
    ar = np.arange(len(cols))
    S = scores_against(Y, Zn)
    own = S[ar, cols].copy()
    S[ar, cols] = -np.inf
    jstar = S.argmax(1)
    bestv = S[ar, jstar]
    ynorm = np.linalg.norm(Y.astype(np.float64), axis=1)
    mm = own.astype(np.float64) - bestv
    bnd = coef * ynorm * (scan.white.z_norm[cols] + scan.white.z_norm_max) + 1e-30
    lead = bestv.astype(np.float64) / np.maximum(np.abs(own.astype(np.float64)), 1e-300)
    return mm > bnd, mm - bnd, jstar, lead, S


def _reflect(scan: Scan, left: np.ndarray, iters: int, parts, decided: list) -> StageResult:
    """The body of :func:`stage_reflect`; appends to ``decided`` as it goes."""
    Zn = scan.Z.numpy()
    still: list[np.ndarray] = []
    ratios: list = []                                       # (positions, margin / slack) of the int8 scorings
    start_top: dict = {}
    cut = False
    use8 = int8_ready(scan)                                   # int8 scores, streamed over Q's rows
    med = float(np.median(scan.white.z_norm))
    if scan.source.bias is None and scan.n > scan.r + 2:
        # rows near the centre go straight to the proof stage: the tilt proves them (a direction
        # for them is never found by reflections) and the NNLS proofs make their own start sets
        centre = scan.white.z_norm[left] <= TILT_NORM * med
        still.append(left[centre])
        left = left[~centre]
    ncol = REFLECT_COLS if use8 else rows_per_block(scan.n, 4, most=REFLECT_COLS)   # float32: [ncol, n] fit BLOCK_BYTES
    cols = np.zeros(0, dtype=np.int64)
    Y = np.zeros((0, scan.r), dtype=np.float32)                # one direction per pooled column
    age = np.zeros(0, dtype=np.int64)                        # scorings done per pooled column
    nxt, finished = 0, 0
    while True:
        if scan.time_left() <= 0:
            cut = True
            still += [cols, left[nxt:]]
            break
        add = left[nxt:nxt + ncol - len(cols)]
        nxt += len(add)
        if len(add):
            cols, Y = np.concatenate([cols, add]), np.concatenate([Y, Zn[add]])
            age = np.concatenate([age, np.zeros(len(add), dtype=np.int64)])
        if not len(cols):
            break
        S = top = None
        if use8 and len(cols) >= 32:
            # int8 products with a rigorous bound, the near calls exact (vocablens.argmax.scoring)
            done, gap, jstar, top, lead, slack = int8_pass(scan, cols, Y, START_TOP, np.nonzero(age == 0)[0])
            ratios.append((cols[done], gap[done] / slack[done]))     # rigorous: verify re-checks the smallest
        else:
            done, gap, jstar, lead, S = _float32_pass(scan, Zn, cols, Y)
        dq = np.nonzero(done)[0]
        X = Y[dq].astype(np.float64) @ scan.white.whiten.T                # the certificates x = A y, one GEMM
        for i, q in enumerate(dq):
            t = int(scan.distinct.ids[int(cols[q])])
            decided.append(argmaxable_at(scan, t, 2, Y[q].astype(np.float64), float(gap[q]), X[i]))
        fresh = np.nonzero(~done & (age == 0))[0]            # first scoring, at y = z_t
        if len(fresh) and top is None:
            k = min(START_TOP, scan.n - 1)
            top = np.zeros((len(cols), k), dtype=np.int64)
            top[fresh] = torch.topk(torch.from_numpy(S[fresh]), k, dim=1).indices.numpy()
        # the quick interior proof only where it can work: a row well beaten at its own direction
        # (a point between a few rows and the centre has competitors scoring ~2x its own), and not
        # a row near the centre (the tilt proves those; the Ball and 32 rows rarely reach them)
        tryq = fresh[(lead[fresh] >= SCREEN_LEAD) & (scan.white.z_norm[cols[fresh]] > TILT_NORM * med)]
        if parts is not None and len(tryq):
            for j in range(0, len(tryq), SCREEN_COLS):
                part = tryq[j:j + SCREEN_COLS]
                got, certs = screen_interior(scan, parts, cols[part], top[part])
                done[part] |= got
                decided.extend(certs)
        for q in fresh[~done[fresh]]:             # the proof stage starts from these
            start_top[int(cols[q])] = top[q]
        del S
        age += 1
        spent = ~done & (age >= iters)
        still.append(cols[spent])
        finished += int((done | spent).sum())
        keep = ~(done | spent)
        Y, cols, jstar, age = Y[keep], cols[keep], jstar[keep], age[keep]
        if len(cols):
            nv = Zn[cols] - Zn[jstar]                    # [m, r]  z_t - z_j
            coefr = (nv * Y).sum(1) / np.maximum((nv * nv).sum(1), 1e-30)
            Y = Y - (2.0 * coefr)[:, None] * nv
        scan.progress("reflect", finished, len(left))
    pos = np.concatenate([p for p, _ in ratios]) if ratios else np.zeros(0, dtype=np.int64)
    ratio = np.concatenate([v for _, v in ratios]) if ratios else np.zeros(0)
    return StageResult(name="reflect", decided=tuple(decided),
                       open=np.sort(np.concatenate(still)) if still else np.zeros(0, dtype=np.int64),
                       cut=cut, bound_ratio=(pos, ratio), start_top=start_top)
