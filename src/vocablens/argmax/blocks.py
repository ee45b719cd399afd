"""How the stages of the exact argmax check cut their work into blocks and share it out: block
sizes, worker threads, the unit roundoffs their rounding bounds use, and the budget's exception."""

from __future__ import annotations

import numpy as np
import torch

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
#: 64 KiB resident: 128 rows, at most 8 MiB (:mod:`~vocablens.models.files.pages`)
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
