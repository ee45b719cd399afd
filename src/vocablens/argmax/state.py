"""The mutable state the stages of the exact argmax check pass along, and its time budget.

One :class:`ScanState` holds the verdict arrays (one entry per token), the prepared geometry
(distinct rows, whitening, int8 grid) and the clock. Each stage (``preparation``,
``certificates``, ``proofs``) reads it and settles tokens through its ``settle_*`` methods, so a
stage function is plain code over one object instead of a closure over many locals.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from vocablens.argmax.prepared import DistinctRows, SourceRows, Whitening
from vocablens.argmax.result import (
    ARGMAXABLE, BUDGET, DUPLICATE, STAGES, UNARGMAXABLE, UNDECIDED, ArgmaxResult, Progress,
)

U32 = 2.0 ** -24  # unit roundoff of float32
U64 = 2.0 ** -53  # unit roundoff of float64


def exact_slack(r: int) -> float:
    """Relative bound on a float64 dot product of a float32 whitened row with y (the float32 storage
    of Z plus the float64 sum of r terms, with room): ``|z . y - fl(z32 . y)| <= this ||z|| ||y||``."""
    return 2 * U32 + 2 * r * U64


#: bytes of one transient block (a block of rows in float64, a block of scores): every stage works
#: in blocks of about this size, so the peak is the stored rows plus O(1) blocks whatever V and d
BLOCK_BYTES = 16 * 2 ** 20


def rows_per_block(width: int, itemsize: int = 8, budget: int | None = None, most: int | None = None) -> int:
    """Rows of ``width`` entries of ``itemsize`` bytes that fit ``budget`` bytes (default
    :data:`BLOCK_BYTES`, read at each call); at least 1, at most ``most``."""
    k = max(1, (BLOCK_BYTES if budget is None else budget) // (itemsize * max(1, int(width))))
    return k if most is None else max(1, min(k, most))


def quantize(z: np.ndarray, qs: float) -> np.ndarray:
    """Whitened rows z (float32 [k, r]) on the int8 grid of step qs: ``rint(z / qs)`` in float64,
    elementwise, so any block of rows gives the same bits (int8 [k, r])."""
    q = z.astype(np.float64)
    np.divide(q, qs, out=q)
    np.rint(q, out=q)
    return q.astype(np.int8)


#: rows per gather of scattered rows from a read-only mapped W, whose pages then go back: the
#: kernel maps up to 16 pages around each faulting one (fault-around), so each row read can make
#: 64 KiB resident: 128 rows, at most 8 MiB (:mod:`~vocablens.models.pages`)
GATHER_ROWS = 128


class OutOfTime(Exception):
    """Raised inside a stage when the run's time budget is spent (caught by the driver)."""


def one_blas_thread():
    """Context manager: numpy's BLAS on one thread. The proofs run many small float64 products
    ([k, d] @ [d, r]); on a shared machine a threaded BLAS spends more time waking its threads
    than computing (docs/performance-argmax.md)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def run_in_workers(items, fn, workers: int, static: bool = False) -> None:
    """``fn(item, w)`` for every item on ``workers`` threads, the main thread being worker 0.

    Each worker runs torch on one thread (restored after); numpy's BLAS the caller limits. Work
    split by Python threads that release the GIL in BLAS or torch never waits in a parallel region
    for a descheduled peer (docs/performance-argmax.md). Items go out
    from a shared counter, or with ``static`` round-robin (worker w takes items w, w + workers, ...
    in order: what each worker sums is then fixed, so the result does not depend on timing). The
    first exception in any worker (OutOfTime, KeyboardInterrupt, an error) stops the others before
    their next item and is raised here once all have stopped.
    """
    import threading

    items = list(items)
    workers = max(1, min(int(workers), len(items)))
    if workers == 1:
        for x in items:
            fn(x, 0)
        return
    lock, errors = threading.Lock(), []
    queue = iter(range(len(items)))

    def loop(w: int) -> None:
        if w:
            torch.set_num_threads(1)            # in the thread itself (else the products run far slower)
        mine = iter(range(w, len(items), workers)) if static else None
        try:
            while not errors:
                if static:
                    k = next(mine, None)
                else:
                    with lock:
                        k = next(queue, None)
                if k is None:
                    return
                fn(items[k], w)
        except BaseException as e:  # noqa: BLE001 — raised by the main thread below
            errors.append(e)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pool = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(1, workers)]
    try:
        for th in pool:
            th.start()
        loop(0)
    finally:
        for th in pool:
            th.join()
        torch.set_num_threads(threads)
    if errors:
        raise errors[0]


def scores_against(Y: np.ndarray, Zn: np.ndarray) -> np.ndarray:
    """``Y @ Zn.T`` (float32 [m, n]) for directions ``Y`` [m, r] against all rows ``Zn`` [n, r], the
    rows split over ``torch.get_num_threads()`` workers with one BLAS thread each (the caller
    holds :func:`one_blas_thread`): float32 dot products of length r, so the rounding bound of one
    GEMM holds, on every core."""
    n = Zn.shape[0]
    workers = max(1, min(torch.get_num_threads(), n // 4096))
    if workers == 1:
        return Y @ Zn.T
    S = np.empty((Y.shape[0], n), dtype=np.result_type(Y, Zn))
    cuts = np.linspace(0, n, workers + 1).astype(np.int64)

    def part(w: int, _w: int) -> None:
        a, b = int(cuts[w]), int(cuts[w + 1])
        S[:, a:b] = Y @ Zn[a:b].T       # (rows of Z, written in place: cheaper than splitting Y's rows)

    run_in_workers(range(workers), part, workers, static=True)
    return S


@dataclass(eq=False)
class ScanState:
    """The scan's verdict book and clock, and what stage prepare made. Arrays are numpy, indexed by
    token id ([V]) unless noted.

    Verdict book (written through the ``settle_*`` methods): ``verdict``, ``stage``, ``margin``,
    ``residual``, ``group``, ``scale``, ``in_play``; dicts ``x_extra``, ``combos``, ``combo_mean``,
    ``combo_tilt``, ``reasons``, ``group_can_tie``; ``settled`` per stage. What prepare made, frozen
    (:mod:`~vocablens.argmax.prepared`): ``src`` (W, bias), ``distinct`` (the distinct rows),
    ``white`` (whitening and int8 grid), and the matrices ``Z`` float32 [n, r] (whitened rows,
    None from the re-check on: :meth:`z_to_q`) and ``Q`` int8 [n, r] (their grid rows). ``left``:
    int64 positions (into ``distinct.ids``) of the rows still open.
    """

    V: int
    d: int
    tol: float
    progress: Progress
    deadline: float | None = None
    budget_s: float | None = None
    t0: float = field(default_factory=time.perf_counter)
    verdict: np.ndarray = None
    stage: np.ndarray = None
    margin: np.ndarray = None
    residual: np.ndarray = None
    group: np.ndarray = None
    scale: np.ndarray = None
    in_play: np.ndarray = None
    x_extra: dict = field(default_factory=dict)
    combos: dict = field(default_factory=dict)
    combo_mean: dict = field(default_factory=dict)
    combo_tilt: dict = field(default_factory=dict)
    start_top: dict = field(default_factory=dict)      # position -> (top rows at z_t, skip the sparse try)
    reasons: dict = field(default_factory=dict)
    group_can_tie: dict = field(default_factory=dict)
    timings: dict = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    cpu: dict = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    c0: float = field(default_factory=time.process_time)
    settled: dict = field(default_factory=lambda: {s: 0 for s in STAGES})
    cut_short: list = field(default_factory=list)
    interrupted: bool = False
    verified: int = 0
    # what stage prepare made (frozen: :mod:`~vocablens.argmax.prepared`)
    src: SourceRows = None
    distinct: DistinctRows | None = None
    white: Whitening | None = None
    Z: torch.Tensor = None
    Q: torch.Tensor = None
    bound_ratio: np.ndarray = None
    left: np.ndarray = None
    ball: object = None          # sparse.Ball, built on first use
    device: str = "cpu"          # where the all-pairs stage's products run ("cuda": the GPU)

    @classmethod
    def new(cls, V: int, d: int, tol: float, progress: Progress | None, budget_s: float | None) -> "ScanState":
        t0 = time.perf_counter()
        st = cls(V=V, d=d, tol=tol, progress=progress or (lambda *_: None), budget_s=budget_s, t0=t0,
                 deadline=None if budget_s is None else t0 + float(budget_s))
        st.verdict = np.full(V, UNDECIDED, dtype=np.int8)
        st.stage = np.full(V, -1, dtype=np.int8)
        st.margin = np.full(V, np.nan)
        st.residual = np.full(V, np.nan)
        st.group = np.full(V, -1, dtype=np.int64)
        st.scale = np.ones(V)
        st.in_play = np.ones(V, dtype=bool)
        st.left = np.zeros(0, dtype=np.int64)
        return st

    # ------------------------------------------------------------------ sizes and the clock
    @property
    def n(self) -> int:
        """Distinct rows in play."""
        return 0 if self.distinct is None else len(self.distinct.ids)

    @property
    def r(self) -> int:
        """Dimension after whitening."""
        return 0 if self.white is None else self.white.rank

    def time_left(self) -> float:
        """Seconds left in the budget (inf without one)."""
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def check_time(self) -> None:
        """Raise :class:`OutOfTime` when the budget is spent. Every stage calls it once per block
        of work (a block of rows, a column chunk, one proof round), so a run ends within about one
        block's time of its budget whatever V."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise OutOfTime

    def still_open(self, pos: np.ndarray) -> np.ndarray:
        """The positions (into ``reps``) among ``pos`` whose token no stage has settled yet."""
        pos = np.asarray(pos, dtype=np.int64)
        return pos[self.stage[self.distinct.ids[pos]] < 1] if len(pos) else pos

    # ------------------------------------------------------------------ settling tokens
    def settle_arg(self, t: int, st: int, m: float) -> None:
        """Token t is argmaxable (a duplicate representative: its group can tie), margin m."""
        if self.verdict[t] == DUPLICATE:
            self.group_can_tie[int(self.group[t])] = True
        else:
            self.verdict[t] = ARGMAXABLE
        self.stage[t] = st
        self.margin[t] = m
        self.settled[STAGES[st]] += 1

    def settle_unarg(self, t: int, ids, wts, rn: float, st: int, means=None) -> None:
        """Token t is dominated by ``sum wts[k] w[ids[k]]`` plus, when ``means = (m_all, h)``, weights
        on means of the distinct rows (see :attr:`ArgmaxResult.combo_mean`)."""
        if self.verdict[t] == DUPLICATE:
            self.group_can_tie[int(self.group[t])] = False
        else:
            self.verdict[t] = UNARGMAXABLE
        self.stage[t] = st
        self.residual[t] = rn
        self.combos[int(t)] = (torch.from_numpy(np.asarray(ids, dtype=np.int64)),
                               torch.from_numpy(np.asarray(wts, dtype=np.float64)))
        if means is not None:
            self.combo_mean[int(t)] = (float(means[0]), torch.from_numpy(np.asarray(means[1], dtype=np.float64)))
        self.settled[STAGES[st]] += 1

    def settle_tilt(self, t: int, a: float, u: np.ndarray, excluded, rn: float, st: int) -> None:
        """Token t is dominated by the tilted combination ``lambda_j = a + q_j . u`` on the distinct
        rows in play outside ``excluded`` (token ids; see :attr:`ArgmaxResult.combo_tilt`)."""
        self.settle_unarg(t, [], [], rn, st)                    # no explicit part
        self.combo_tilt[int(t)] = (float(a), torch.from_numpy(np.asarray(u, dtype=np.float64)),
                                   torch.from_numpy(np.asarray(excluded, dtype=np.int64)))

    def q_rows_at(self, pos) -> torch.Tensor:
        """int8 grid rows at positions ``pos`` (into ``reps``) [k, r] (the same bits as :meth:`q_rows`)."""
        pos = np.asarray(pos, dtype=np.int64)
        if self.Q is not None:
            return self.Q[torch.from_numpy(pos)]
        return torch.from_numpy(quantize(self.Z.numpy()[pos], self.white.grid_step))

    def bias_scaled(self, t: int, m0: float) -> tuple[float, float]:
        """Scale s of a no-bias certificate with margin m0 so the biases cannot change the winner,
        and the margin it then has (with bias); (1, m0) without bias."""
        if self.src.bias is None:
            return 1.0, m0
        s = 2.0 * max(1.0, (self.white.bias_max - self.src.bias[t]) / m0)
        return s, s * m0 - (self.white.bias_max - self.src.bias[t])

    def settle_arg_y(self, t: int, st: int, y: np.ndarray, m0: float, x: np.ndarray | None = None) -> None:
        """Settle t with the whitened no-bias certificate y [r] and margin m0 (scaled for the bias);
        ``x = A y`` when the caller has it (a batch of them is one GEMM)."""
        s, m = self.bias_scaled(t, m0)
        self.x_extra[int(t)] = torch.from_numpy(s * (self.white.whiten @ y if x is None else x))
        self.settle_arg(t, st, m)

    def q_rows(self, s: int, e: int) -> torch.Tensor:
        """int8 grid rows ``Q[s:e]`` [k, r]: the stored Q, or, once it is gone, made again from Z by
        :func:`quantize` (the same bits)."""
        if self.Q is not None:
            return self.Q[s:e]
        return torch.from_numpy(quantize(self.Z[s:e].numpy(), self.white.grid_step))

    def z_to_q(self) -> None:
        """Q made again from Z (if gone), then Z dropped: the re-check and the result read Q only."""
        if self.Q is None and self.Z is not None:
            step = rows_per_block(self.r, 8, BLOCK_BYTES // 4)     # beside Z and Q: a small block
            Q = np.empty((self.n, self.r), dtype=np.int8)
            for s in range(0, self.n, step):
                Q[s:s + step] = quantize(self.Z[s:s + step].numpy(), self.white.grid_step)
            self.Q = torch.from_numpy(Q)
        self.Z = None

    def rows64(self, ids) -> np.ndarray:
        """Rows ``W[ids]`` in float64 [k, d] (a copy); their pages then go back (:meth:`release`)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.d), dtype=np.float64)
        step = GATHER_ROWS
        for s in range(0, len(ids), step):
            out[s:s + step] = self.src.rows[ids[s:s + step]]  # exact cast, row by row
            if self.src.pages is not None:
                self.src.pages.release_all()
        return out

    def z64(self, pos) -> np.ndarray:
        """Whitened rows at positions ``pos`` (into ``reps``) in float64, computed afresh from W: [k, r]."""
        X = self.rows64(self.distinct.ids[np.asarray(pos)])
        X -= self.white.center                                    # in place: the same numbers, one copy less
        return X @ self.white.whiten

    def release(self, s: int, e: int) -> None:
        """Give back the resident pages of the distinct rows ``reps[s:e]`` after a pass has read
        them (:mod:`~vocablens.models.pages`: only for a read-only file mapping; results unchanged)."""
        e = min(e, self.n)
        if self.src.pages is not None and e > s:
            self.src.pages.release(self.distinct.ids[s], self.distinct.ids[e - 1] + 1)

    def cut(self, stage: str) -> None:
        """Record that ``stage`` was cut short (or skipped) by the budget."""
        if stage not in self.cut_short:
            self.cut_short.append(stage)

    # ------------------------------------------------------------------ the result
    def result(self) -> ArgmaxResult:
        """Freeze into an :class:`ArgmaxResult` (open tokens become undecided with a reason)."""
        why = "interrupted" if self.interrupted else (BUDGET if self.cut_short else "not settled")
        for t in np.nonzero(self.verdict == UNDECIDED)[0]:
            self.reasons.setdefault(int(t), why)
        for t in ({} if self.distinct is None else self.distinct.twins):
            if int(self.group[t]) not in self.group_can_tie:      # the group's question is open
                self.reasons.setdefault(int(t), why)
        self.timings["total"] = time.perf_counter() - self.t0
        self.cpu["total"] = time.process_time() - self.c0
        d = self.d
        center = torch.zeros(d, dtype=torch.float64) if self.white is None else torch.from_numpy(self.white.center)
        A = torch.zeros(d, 0, dtype=torch.float64) if self.white is None else torch.from_numpy(self.white.whiten)
        Q = torch.zeros(self.n, 0, dtype=torch.int8) if self.Q is None else self.Q
        row = np.full(self.V, -1, dtype=np.int64) if self.distinct is None else self.distinct.position
        return ArgmaxResult(
            verdict=torch.from_numpy(self.verdict), stage=torch.from_numpy(self.stage),
            margin=torch.from_numpy(self.margin), residual=torch.from_numpy(self.residual),
            group=torch.from_numpy(self.group), group_can_tie=self.group_can_tie,
            in_play=torch.from_numpy(self.in_play), center=center, whiten=A,
            scale=torch.from_numpy(self.scale), quant=Q, quant_scale=1.0 if self.white is None else self.white.grid_step,
            row=torch.from_numpy(row), x_extra=self.x_extra, combos=self.combos,
            combo_mean=self.combo_mean, combo_tilt=self.combo_tilt, reasons=self.reasons, timings=self.timings,
            settled=self.settled, bias_used=self.src.bias is not None, rank=self.r, n_unique=self.n,
            tol=self.tol, verified_f64=self.verified, interrupted=self.interrupted,
            budget_s=self.budget_s, cut_short=tuple(self.cut_short), cpu_s=dict(self.cpu))
