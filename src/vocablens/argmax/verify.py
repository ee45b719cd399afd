"""Stage ``verify`` of the exact argmax check: float64 margins at the argmaxable certificates, in the
original coordinates, by blocks of rows (running maxima per token). A failed re-check never leaves a
verdict standing."""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from vocablens.argmax.blocks import one_blas_thread, rows_per_block, run_in_workers
from vocablens.argmax.scan import Scan

#: certificates with a rigorous bound re-checked in float64 by ``verify="borderline"``: those with the
#: smallest margin over their rounding bound
BORDERLINE = 512


def verify_argmaxable(Wn, bn, in_play, tokens, cert, twins_of=None, chunk: int = 512, progress=None,
                      deadline: float | None = None, release=None):
    """float64 margins ``l_t(x_t) - max_{j in play, j != t, j not a twin} l_j(x_t)`` for tokens [k].

    Args:
        Wn: rows ``[V, d]`` (numpy, float32 or float64); bn: bias [V] or None; in_play: bool [V].
        tokens: int64 [k]; cert: ``t -> x`` float64 [d].
        chunk: tokens per pass over the rows (lowered so their certificates ``[d, chunk]`` fit
            :data:`~vocablens.argmax.blocks.BLOCK_BYTES`).
        deadline: ``time.perf_counter()`` value after which no new pass starts.
        release: optional ``(start, stop)`` callback after each block of rows ``[start, stop)`` is
            read (:class:`~vocablens.models.files.pages.PageRelease`: hands their pages back).

    Returns:
        float64 [k] margins (logit units); NaN for tokens not reached before the deadline.

    Memory: per worker (``torch.get_num_threads()`` of them, one BLAS thread each: the row blocks
    are shared out) one block of rows in float64 and their scores ``[chunk, rows]`` (about
    :data:`~vocablens.argmax.blocks.BLOCK_BYTES` each), whatever V: the maxima are kept per token.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    out = np.full(len(tokens), np.nan)
    play = np.nonzero(in_play)[0]
    pos = np.full(len(in_play), -1)
    pos[play] = np.arange(len(play))
    d = Wn.shape[1]
    chunk = rows_per_block(d, 8, most=chunk)
    step = min(rows_per_block(chunk, 8), rows_per_block(d, 8))
    starts = list(range(0, len(play), step))
    workers = max(1, min(torch.get_num_threads(), len(starts)))
    bufs = [np.empty((min(step, len(play)), d)) for _ in range(workers)]     # float64 rows, per worker
    run = len(play) > 0 and int(play[-1]) - int(play[0]) == len(play) - 1    # rows in play are one run
    for s in range(0, len(tokens), chunk):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        tk = tokens[s:s + chunk]
        XT = np.stack([cert(t) for t in tk])                       # [k, d]
        # (token, row) entries left out of each token's maximum: its own row and its twins
        mr = [np.atleast_1d(pos[t]) for t in tk]
        if twins_of is not None:
            mr = [np.concatenate([m, pos[np.asarray(twins_of(t), dtype=np.int64)]]) for m, t in zip(mr, tk)]
        mrow = np.concatenate(mr)
        mcol = np.repeat(np.arange(len(tk)), [len(m) for m in mr])
        own = np.full(len(tk), np.nan)
        bests = [np.full(len(tk), -np.inf) for _ in range(workers)]

        def rows_block(r0: int, w: int) -> None:
            rows = play[r0:r0 + step]
            B = bufs[w][:len(rows)]
            np.copyto(B, Wn[int(rows[0]):int(rows[-1]) + 1] if run else Wn[rows])   # exact cast
            L = XT @ B.T                                           # [k, rows] float64
            if bn is not None:
                L += bn[rows][None, :]
            q = np.nonzero((pos[tk] >= r0) & (pos[tk] < r0 + step))[0]
            own[q] = L[q, pos[tk[q]] - r0]                         # each token's own row: one block
            sel = (mrow >= r0) & (mrow < r0 + step)
            L[mcol[sel], mrow[sel] - r0] = -np.inf
            np.maximum(bests[w], L.max(1), out=bests[w])
            if release is not None:
                release(rows[0], rows[-1] + 1)

        with one_blas_thread():         # row blocks over workers, one BLAS thread each
            run_in_workers(starts, rows_block, workers)
        best = np.max(bests, axis=0)
        out[s:s + len(tk)] = own - best if len(play) > 1 else math.inf
        if progress:
            progress(min(s + chunk, len(tokens)), len(tokens))
    return out


def cert_x(scan: Scan, x_extra: dict, scale: np.ndarray, t: int) -> np.ndarray:
    """The argmaxable certificate of token t in the original coordinates, float64 [d]: its explicit
    x (``x_extra``), or stage gemm's ``scale[t] A (qs q_t)``."""
    t = int(t)
    if t in x_extra:
        return x_extra[t].numpy()
    k = int(scan.distinct.position[t])
    return scale[t] * (scan.white.whiten @ (scan.white.grid_step * scan.q_rows(k, k + 1)[0].numpy().astype(np.float64)))


def stage_verify(scan: Scan, mode: str, candidates: np.ndarray, bound_ratio: np.ndarray | None,
                 x_extra: dict, scale: np.ndarray, in_play: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 re-check, in the original coordinates, of the argmaxable certificates of
    ``candidates`` (int64 token ids): (``"all"``) every one, or (``"borderline"``) every one without
    a rigorous whitened bound (the float32 scorings, the proof stage's directions) and the
    :data:`BORDERLINE` with the smallest margin relative to their rounding bound among those that
    have one (stage 1's exact int8 products, the reflect stage's int8 scorings: ``bound_ratio``
    float64 [n] per distinct row, > 0 for those). ``x_extra``, ``scale``: the certificates
    (:func:`cert_x`); ``in_play``: bool [V] the competitors.

    Returns ``(tokens int64 [k], margins float64 [k])``: the float64 margins (NaN for those not
    reached before the budget ran out). The driver never leaves a verdict standing whose margin
    is not > 0 (:meth:`~vocablens.argmax.book.VerdictBook.fold_verify`)."""
    cand = candidates
    if mode == "all" or bound_ratio is None:
        chosen = cand.astype(np.int64)
    else:
        ratio = bound_ratio[scan.distinct.position[cand]]
        rig = ratio > 0
        pick = cand[rig][np.argsort(ratio[rig], kind="stable")[:BORDERLINE]]
        chosen = np.unique(np.concatenate([cand[~rig], pick])).astype(np.int64)
    res = verify_argmaxable(scan.source.rows, scan.source.bias, in_play, chosen, lambda t: cert_x(scan, x_extra, scale, t),
                            twins_of=lambda t: scan.distinct.twins.get(int(t), np.zeros(0, dtype=np.int64)),
                            progress=lambda a, b: scan.progress("verify", a, b), deadline=scan.clock.deadline,
                            release=None if scan.source.pages is None else scan.source.pages.release)
    return chosen, res
