"""Stage ``prepare`` of the exact argmax check: validation, masks, exact duplicates, whitening.

- Rows beyond the tokenizer (padding) and never-trained rows are excluded unless asked for.
- Bit-identical rows (and with bias, equal biases) are grouped: a group can never hold the strict
  argmax (``duplicate``); one representative is checked with its twins removed. With bias, a twin
  with a smaller bias is dominated by its larger-bias twin (``mu = e_top``).
- The distinct rows are centred and whitened on their numerical range in float64,
  ``Z = (W - mu) A``, and rounded to one global int8 grid ``Q`` (step ``qs``) for stage 1, with a
  rigorous bound ``enorm`` on ``||z - qs q||`` (rounding to the grid and to float32).

Memory: every pass runs over blocks of rows of about :data:`~vocablens.argmax.blocks.BLOCK_BYTES`
(float64), so the peak is the float32 ``Z`` and the int8 ``Q`` ([n, r] each) plus a few such blocks,
whatever V and d; each block checks the time budget.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vocablens.ops.vocab_parallel.comm import world
from vocablens.argmax.blocks import U32, one_blas_thread, rows_per_block, run_in_workers
from vocablens.argmax.prepared import DistinctRows, SourceRows, Whitening
from vocablens.errors import BadInput, ShapeMismatch


def as_numpy(W: torch.Tensor) -> np.ndarray:
    """Rows as numpy without losing precision: float64 stays float64, everything else float32."""
    W = W.detach().cpu()
    if W.dtype == torch.float64:
        return W.numpy()
    return W.float().numpy()


def check_input(W, bias, masks: dict):
    """Validate ``W [V, d]``, ``bias [V]`` and bool masks ``[V]``; returns (W, bias) as tensors.

    Raises:
        ShapeMismatch: W not a non-empty float matrix, bias or a mask of the wrong shape.
        BadInput: NaN/inf rows or biases (ids named).
    """
    if not isinstance(W, torch.Tensor):
        W = torch.as_tensor(W)
    if W.dim() != 2:
        raise ShapeMismatch(f"W must be a matrix [V, d]; got shape {tuple(W.shape)}")
    V, d = W.shape
    if V < 1 or d < 1:
        raise ShapeMismatch(f"W must have at least one row and one column; got shape {tuple(W.shape)}")
    if not W.is_floating_point():
        raise ShapeMismatch(f"W must be floating point; got {W.dtype}")
    bad = torch.zeros(V, dtype=torch.bool)
    step = rows_per_block(d, 4 * W.element_size())   # isfinite keeps a few temporaries of the block
    ones = None
    for s in range(0, V, step):
        # one product with a vector of ones: NaN and inf propagate into a row's sum, so a row whose
        # sum is finite has only finite entries; the (rare) rows whose sum is not finite, an overflow
        # of finite entries included, are then looked at entry by entry. No [rows, d] mask.
        blk = W[s:s + step]
        if blk.dtype not in (torch.float32, torch.float64):
            blk = blk.float()
        if ones is None:
            ones = torch.ones(d, dtype=blk.dtype, device=blk.device)
        rs = ~torch.isfinite(blk @ ones)
        if bool(rs.any()):
            rs = ~torch.isfinite(blk).all(dim=1)
        bad[s:s + step] = rs
    if bool(bad.any()):
        ids = bad.nonzero().flatten()
        raise BadInput(f"W has {len(ids)} row(s) with NaN or inf (ids {ids[:8].tolist()}"
                       f"{' ...' if len(ids) > 8 else ''}): argmaxability is undefined for them; "
                       "fix or mask the rows first")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            bias = torch.as_tensor(bias)
        if bias.shape != (V,):
            raise ShapeMismatch(f"bias must have shape [V] = [{V}]; got {tuple(bias.shape)}")
        badb = ~torch.isfinite(bias)
        if bool(badb.any()):
            ids = badb.nonzero().flatten()
            raise BadInput(f"bias has {len(ids)} NaN/inf entries (ids {ids[:8].tolist()})")
    for name, m in masks.items():
        if m is not None and (not isinstance(m, torch.Tensor) or m.shape != (V,) or m.dtype != torch.bool):
            raise ShapeMismatch(f"{name} must be a bool tensor [V] = [{V}]")
    return W, bias


class _Count:
    """Thread-safe progress of one preparation step: ``add(k)`` after each block of k rows, from any
    worker, reports ``progress(stage, done, total)`` (0 when made, total at :meth:`end`)."""

    def __init__(self, progress, stage: str, total: int):
        import threading

        self.progress, self.stage, self.total, self.done = progress, stage, int(total), 0
        self.lock = threading.Lock()
        if progress is not None:
            progress(stage, 0, self.total)

    def add(self, k: int) -> None:
        if self.progress is None:
            return
        with self.lock:
            self.done = min(self.total, self.done + int(k))
            self.progress(self.stage, self.done, self.total)

    def end(self) -> None:
        if self.progress is not None and self.done < self.total:
            with self.lock:
                self.done = self.total
                self.progress(self.stage, self.total, self.total)


def group_identical(Wn: np.ndarray, ids: np.ndarray, tick=None, progress=None):
    """Groups of bit-identical rows among ``Wn[ids]``; ``tick()`` is called once per block of rows
    (the time budget's check: it may raise); ``progress(stage, done, m)``: stage ``prepare: duplicates``.

    Returns ``(inv, cnt, order)``: group of each row [m], group sizes [g], and the rows sorted by
    group (stable) so that group g is ``ids[order[sum(cnt[:g]):sum(cnt[:g+1])]]``.
    """
    m = len(ids)
    itype = np.int32 if Wn.dtype == np.float32 else np.int64
    rng = np.random.default_rng(0)
    R = rng.integers(-(2 ** 62), 2 ** 62, size=(Wn.shape[1], 2), dtype=np.int64)
    keys = np.empty((m, 2), dtype=np.int64)
    step = rows_per_block(Wn.shape[1])           # int64 bits: one BLOCK_BYTES block per worker
    count = _Count(progress, "prepare: duplicates", m)

    def hash_block(s: int, _w: int) -> None:
        if tick is not None:
            tick()
        with np.errstate(over="ignore"):
            bits = (Wn[ids[s:s + step]] + Wn.dtype.type(0)).view(itype).astype(np.int64)
            keys[s:s + step] = bits @ R          # wraps modulo 2^64: an exact function of the bits
        count.add(len(bits))

    run_in_workers(range(0, m, step), hash_block, torch.get_num_threads())
    count.end()
    _, inv, cnt = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    if (cnt > 1).any():
        # confirm bitwise; split a (vanishingly rare) hash collision into its true groups
        nxt = len(cnt)
        for g in np.nonzero(cnt > 1)[0]:
            mem = np.nonzero(inv == g)[0]
            rows = Wn[ids[mem]] + Wn.dtype.type(0)
            sub = np.unique(rows.view(itype), axis=0, return_inverse=True)[1].ravel()
            for k in range(1, sub.max() + 1):
                inv[mem[sub == k]] = nxt
                nxt += 1
        _, inv = np.unique(inv, return_inverse=True)
        inv = inv.ravel()
        cnt = np.bincount(inv)
    order = np.argsort(inv, kind="stable")
    return inv, cnt, order


def excluded(padding, untrained, include_padding: bool, include_untrained: bool):
    """The padding and never-trained rows to exclude (bool [V] numpy each, None: none)."""
    pm = None if padding is None or include_padding else padding.cpu().numpy()
    um = None if untrained is None or include_untrained else untrained.cpu().numpy()
    return pm, um


def dedupe(source: SourceRows, in_play: np.ndarray, clock) -> tuple[DistinctRows, list, list]:
    """Group bit-identical rows in play (bool [V]): the distinct rows, the duplicate groups
    ``(members, top)`` (int64 token ids: the group, and its rows with the largest bias, which can
    only tie) with more than one top row, and the rows dominated by an identical row with a larger
    bias ``(token, twin)``.

    Raises:
        OutOfTime: the run's budget ran out (checked per block of rows, in one process only).
    """
    V = len(in_play)
    play_ids = np.nonzero(in_play)[0]
    # under torch.distributed no rank may stop alone before the collectives of whiten and gemm
    inv, cnt, order = group_identical(source.rows, play_ids, clock.check_time if world()[1] == 1 else None,
                                      clock.progress)
    bn = source.bias
    bounds = np.concatenate([[0], np.cumsum(cnt)])
    reps: list[int] = play_ids[order[bounds[:-1][cnt == 1]]].tolist()      # the unique rows
    twins, groups, dominated = {}, [], []
    for g in np.nonzero(cnt > 1)[0]:
        members = play_ids[order[bounds[g]:bounds[g + 1]]]
        if bn is None:
            top = members
        else:
            bmax = bn[members].max()
            top = members[bn[members] == bmax]
            dominated += [(m, int(top[0])) for m in members[bn[members] < bmax]]
        if len(top) > 1:
            groups.append((members, top))
            twins[int(top[0])] = top[1:]
        reps.append(int(top[0]))
    ids = np.array(sorted(reps), dtype=np.int64)
    position = np.full(V, -1, dtype=np.int64)
    position[ids] = np.arange(len(ids))
    return DistinctRows(ids=ids, position=position, twins=twins), groups, dominated


def _sum_over_ranks(t: torch.Tensor, size: int, op: str = "sum") -> None:
    """In place: the sum (or max) of ``t`` over the ranks of the default process group (no-op alone)."""
    if size > 1:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)


def _rows_f32(Wn: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``Wn[ids]`` for sorted distinct ids: a view when they are one run of rows (no copy)."""
    if len(ids) and int(ids[-1]) - int(ids[0]) == len(ids) - 1:
        return Wn[int(ids[0]):int(ids[-1]) + 1]
    return Wn[ids]


def whiten(source: SourceRows, distinct: DistinctRows, clock) -> tuple[Whitening, torch.Tensor, torch.Tensor]:
    """Centre and whiten the distinct rows (float64) and put them on the int8 grid: returns the
    :class:`~vocablens.argmax.prepared.Whitening`, ``Z`` float32 [n, r] and ``Q`` int8 [n, r].

    Any invertible A gives the same answer; A only has to keep every direction the rows use, so it
    is the inverse square root of the row covariance on its numerical range (eigenvalues above
    1e-12 of the largest). Under torch.distributed the row blocks are dealt round-robin over the
    ranks (the mean, the covariance and the whitened rows are all-reduced), so its 2 n d (d + r)
    float64 FLOPs split over them; the sums then differ from one process's in float64 rounding only,
    and the verdicts, being certified, are the same. It then runs to the end whatever the budget.

    Cost: three passes over the rows (mean, covariance, whitened rows), each reading a block of
    rows into a reused float64 buffer (a view of W, no gather, where the distinct rows are a run)
    and running numpy's BLAS on it, the blocks shared out over worker threads with one BLAS thread
    each (:func:`~vocablens.argmax.blocks.run_in_workers`; the covariance's blocks fixed per worker,
    so its sums do not depend on timing). Figures: docs/performance-argmax.md.
    """
    Wn, reps = source.rows, distinct.ids
    n, d = len(reps), Wn.shape[1]
    step = rows_per_block(d, 4, most=4096)          # float64 rows, two blocks' worth per step
    starts = list(range(0, n, step))
    rank, size = world()
    tick = clock.check_time if size == 1 else (lambda: None)   # ranks must reach each all_reduce together
    mine = starts[rank::size]           # under torch.distributed each rank whitens every size-th block
    workers = max(1, min(torch.get_num_threads(), len(mine)))
    bufs = [np.empty((min(step, n), d)) for _ in range(workers)]    # each worker's float64 block

    def block(s: int, w: int) -> np.ndarray:
        """Rows ``reps[s:s + step]`` minus the mean, float64, in worker w's buffer (exact cast, then
        one rounding)."""
        X = bufs[w][:min(step, n - s)]
        np.copyto(X, _rows_f32(Wn, reps[s:s + step]))
        X -= mu
        return X

    mu = _row_mean(Wn, reps, mine, step, size, tick)
    Cs = [np.zeros((d, d)) for _ in range(workers)]
    n_mine = sum(min(s + step, n) - s for s in mine)   # this rank's rows (progress counts them)
    count = _Count(clock.progress, "prepare: covariance", n_mine)

    def cov(s: int, w: int) -> None:
        tick()
        X = block(s, w)
        Cs[w] += X.T @ X                            # numpy: a symmetric rank-k update
        count.add(len(X))

    with one_blas_thread():             # workers on one BLAS thread each (threaded LAPACK is far slower)
        run_in_workers(mine, cov, workers, static=True)     # static: each C_w sums fixed blocks
        count.end()
        C = Cs[0]
        for Cw in Cs[1:]:
            C += Cw
        _sum_over_ranks(torch.from_numpy(C), size)
        tick()
        A, cond_ok = _inverse_sqrt(C)
        r = A.shape[1]
        Z = (np.zeros if size > 1 else np.empty)((n, r), dtype=np.float32)
        wsq = [0.0] * workers
        zbufs = [np.empty((len(bufs[0]), r)) for _ in range(workers)]
        count = _Count(clock.progress, "prepare: whitening", n_mine)

        def whitened(s: int, w: int) -> None:
            tick()
            X = block(s, w)
            k = len(X)
            wsq[w] = max(wsq[w], float(np.einsum("ij,ij->i", X, X).max()))
            np.matmul(X, A, out=zbufs[w][:k])
            Z[s:s + k] = zbufs[w][:k]                   # float64 -> float32, one rounding
            if source.pages is not None:                # W's pages out as Z's come in: one [n, d] matrix
                source.pages.release(reps[s], reps[min(s + k, n) - 1] + 1)
            count.add(k)

        run_in_workers(mine, whitened, workers)
        count.end()
    wsq = _over_ranks(Z, max(wsq), size)
    grid, Q = _grid(Z, source.bias, reps, clock.progress, tick, cond_ok)
    return Whitening(center=mu, whiten=A, w_scale=math.sqrt(wsq) or 1.0, **grid), torch.from_numpy(Z), Q


def _over_ranks(Z: np.ndarray, wsq: float, size: int) -> float:
    """Under torch.distributed, every rank's whitened rows summed into ``Z`` in place (each rank
    wrote its own blocks, zeros elsewhere); returns the largest squared row norm over the ranks
    (``wsq``, this rank's, with one process)."""
    if size == 1:
        return wsq
    _sum_over_ranks(torch.from_numpy(Z), size)
    wsq_t = torch.tensor([wsq], dtype=torch.float64)
    _sum_over_ranks(wsq_t, size, "max")
    return float(wsq_t)


def _row_mean(Wn, reps: np.ndarray, mine: list[int], step: int, size: int, tick) -> np.ndarray:
    """The mean of the rows ``Wn[reps]`` float64 [d]: this rank's blocks ``reps[s:s + step]`` (s in
    ``mine``) summed in float64, summed over the ranks, divided by ``len(reps)``."""
    mu = np.zeros(Wn.shape[1])
    for s in mine:
        tick()
        mu += np.add.reduce(_rows_f32(Wn, reps[s:s + step]), axis=0, dtype=np.float64)
    _sum_over_ranks(torch.from_numpy(mu), size)
    mu /= len(reps)
    return mu


def _inverse_sqrt(C: np.ndarray) -> tuple[np.ndarray, bool]:
    """The whitening matrix of the covariance (sum) ``C`` float64 [d, d]: ``A = V diag(lam^-1/2)``
    [d, r] on the eigenvalues above 1e-12 of the largest (at least the largest), so ``A^T C A = I_r``;
    and whether the kept spectrum is well conditioned (smallest kept > 1e-6 of the largest)."""
    lam, vec = np.linalg.eigh(C)
    keep = lam > max(lam[-1], 0.0) * 1e-12
    if not keep.any():
        keep[-1] = True
    A = np.ascontiguousarray(vec[:, keep] / np.sqrt(lam[keep]))     # [d, r]
    return A, bool(lam[keep].min() > 1e-6 * lam[-1])


def _grid(Z: np.ndarray, bias, reps: np.ndarray, progress, tick, cond_ok: bool = False) -> tuple[dict, torch.Tensor]:
    """The global int8 grid for stage 1: ``q = round(z / qs)``, ``e = z - qs q`` (z exact: plus the
    float32 rounding of Z), with the bound ``enorm >= ||e||`` per row."""
    n, r = Z.shape
    step = rows_per_block(r)                        # three float64 blocks at a time, per worker
    starts, workers = range(0, n, step), torch.get_num_threads()
    zabs_w = [0.0] * workers

    def zabs_block(s: int, w: int) -> None:
        zabs_w[w] = max(zabs_w[w], float(np.abs(Z[s:s + step]).max()))    # no [n, r] copy

    run_in_workers(starts, zabs_block, workers)
    zabs = max(zabs_w)
    qs = zabs * (1 + 1e-6) / 127.0 or 1.0
    Q = np.empty((n, r), dtype=np.int8)
    enorm = np.empty(n)
    znorm = np.empty(n)
    pos_w = np.zeros((workers, r), dtype=np.int64)  # rows with q_k > 0, per axis (the Ball's halves)
    count = _Count(progress, "prepare: int8 grid", n)

    def grid_block(s: int, w: int) -> None:
        tick()
        zc = Z[s:s + step].astype(np.float64)
        qc = np.divide(zc, qs)
        np.rint(qc, out=qc)
        Q[s:s + step] = qc.astype(np.int8)
        pos_w[w] += np.count_nonzero(qc > 0, axis=0)
        zn = np.sqrt(np.einsum("ij,ij->i", zc, zc))
        np.multiply(qc, qs, out=qc)
        np.subtract(zc, qc, out=qc)                 # z - qs q, the rounding to the grid
        enorm[s:s + step] = np.sqrt(np.einsum("ij,ij->i", qc, qc)) + 1.01 * U32 * zn
        znorm[s:s + step] = zn
        count.add(len(zc))

    run_in_workers(starts, grid_block, workers)
    count.end()
    pos = pos_w.sum(0)
    # reach of the Ball (sparse.Ball): its points are convex combinations of means of at least
    # h = min_k min(pos_k, n - pos_k) whitened rows, and a mean of h rows has norm <= 1 / sqrt(h)
    # since Z^T Z = I (whitening); x2 for the rounding of Z^T Z. Only a filter (a gap farther than
    # this skips building the Ball), never part of a verdict; off when the whitening is ill-conditioned.
    h = int(np.minimum(pos, n - pos).min()) if r else 0
    return dict(grid_step=qs, grid_error=enorm, grid_error_max=float(enorm.max()), z_norm=znorm,
                z_norm_max=float(znorm.max()), bias_max=float(bias[reps].max()) if bias is not None else 0.0,
                ball_reach=2.0 / math.sqrt(h) if h > 0 and cond_ok else math.inf), torch.from_numpy(Q)
