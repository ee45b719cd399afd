"""What every stage of the exact argmax check reads: the prepared rows, the clock, the int8 kernel.

A :class:`Scan` is frozen: no stage writes into it. Stage ``prepare`` makes the first one
(:mod:`~vocablens.argmax.preparation`); the driver (:mod:`~vocablens.argmax.exact`) makes the next
ones with :func:`dataclasses.replace` (the int8 kernel picked by stage ``gemm``; ``Z`` dropped
before stage ``verify``). Follow one token ``t``: ``source.rows[t]`` is its row, ``distinct.position[t]
= k`` its distinct row, ``Z[k]`` its whitened row and ``Q[k]`` its int8 grid row
(:mod:`~vocablens.argmax.prepared`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from vocablens.argmax.blocks import BLOCK_BYTES, GATHER_ROWS, OutOfTime, quantize, rows_per_block
from vocablens.argmax.prepared import DistinctRows, SourceRows, Whitening
from vocablens.argmax.result import Progress


@dataclass(frozen=True, eq=False)
class Clock:
    """The run's time budget and progress callback.

    Attributes:
        t0: ``time.perf_counter()`` at the start; deadline: ``t0`` plus the budget (None: no budget).
        progress: callback ``(stage, done, total)``.
    """

    t0: float
    deadline: float | None
    progress: Progress

    def time_left(self) -> float:
        """Seconds left in the budget (inf without one)."""
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def check_time(self) -> None:
        """Raise :class:`~vocablens.argmax.blocks.OutOfTime` when the budget is spent. Every stage
        calls it once per block of work (a block of rows, a column chunk, one proof round), so a run
        ends within about one block's time of its budget whatever V."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise OutOfTime


@dataclass(frozen=True, eq=False)
class Scan:
    """The prepared rows of one scan and how to read them (frozen).

    Attributes:
        V, d: the head's shape; tol: the not-argmaxable certificates' relative tolerance.
        clock: the :class:`Clock`.
        source, distinct, white: what stage prepare made (:mod:`~vocablens.argmax.prepared`).
        Z: float32 [n, r] the whitened distinct rows (None from stage verify on).
        Q: int8 [n, r] their int8 grid rows.
        device: where the all-pairs stage's products run (``"cpu"`` or ``"cuda[:N]"``).
        products: the exact int8 product kernel stage gemm picked
            (:func:`~vocablens.argmax.kernels.exact_products`; None: none, or not picked yet).
        q_norm_max: ``max_k ||q_k||`` (exact; 0 until stage gemm computed it).
    """

    V: int
    d: int
    tol: float
    clock: Clock
    source: SourceRows
    distinct: DistinctRows
    white: Whitening
    Z: torch.Tensor | None
    Q: torch.Tensor
    device: str = "cpu"
    products: object = None
    q_norm_max: float = 0.0

    # ------------------------------------------------------------------ sizes and the clock
    @property
    def n(self) -> int:
        """Distinct rows in play."""
        return len(self.distinct.ids)

    @property
    def r(self) -> int:
        """Dimension after whitening."""
        return self.white.rank

    def time_left(self) -> float:
        """Seconds left in the budget (:meth:`Clock.time_left`)."""
        return self.clock.time_left()

    def check_time(self) -> None:
        """:meth:`Clock.check_time`."""
        self.clock.check_time()

    def progress(self, stage: str, done: int, total: int) -> None:
        """Report progress ``(stage, done, total)``."""
        self.clock.progress(stage, done, total)

    # ------------------------------------------------------------------ reading rows
    def q_rows(self, s: int, e: int) -> torch.Tensor:
        """int8 grid rows ``Q[s:e]`` [k, r]."""
        return self.Q[s:e]

    def q_rows_at(self, pos) -> torch.Tensor:
        """int8 grid rows at positions ``pos`` (into ``distinct.ids``) [k, r]."""
        return self.Q[torch.from_numpy(np.asarray(pos, dtype=np.int64))]

    def rows64(self, ids) -> np.ndarray:
        """Rows ``W[ids]`` in float64 [k, d] (a copy); their pages then go back (:meth:`release`)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.d), dtype=np.float64)
        step = GATHER_ROWS
        for s in range(0, len(ids), step):
            out[s:s + step] = self.source.rows[ids[s:s + step]]  # exact cast, row by row
            if self.source.pages is not None:
                self.source.pages.release_all()
        return out

    def z64(self, pos) -> np.ndarray:
        """Whitened rows at positions ``pos`` in float64, computed afresh from W: [k, r]."""
        X = self.rows64(self.distinct.ids[np.asarray(pos)])
        X -= self.white.center                                    # in place: the same numbers, one copy less
        return X @ self.white.whiten

    def release(self, s: int, e: int) -> None:
        """Give back the resident pages of the distinct rows ``ids[s:e]`` after a pass has read
        them (:mod:`~vocablens.models.files.pages`: only for a read-only file mapping; results unchanged)."""
        e = min(e, self.n)
        if self.source.pages is not None and e > s:
            self.source.pages.release(self.distinct.ids[s], self.distinct.ids[e - 1] + 1)

    def bias_scaled(self, t: int, m0: float) -> tuple[float, float]:
        """Scale s of a no-bias certificate with margin m0 so the biases cannot change the winner,
        and the margin it then has (with bias); (1, m0) without bias."""
        if self.source.bias is None:
            return 1.0, m0
        s = 2.0 * max(1.0, (self.white.bias_max - self.source.bias[t]) / m0)
        return s, s * m0 - (self.white.bias_max - self.source.bias[t])

    def without_z(self) -> "Scan":
        """This scan with Z dropped (stage verify and the result read Q only)."""
        from dataclasses import replace

        return replace(self, Z=None)


def q_from_z(Z: torch.Tensor, grid_step: float) -> torch.Tensor:
    """The int8 grid rows of ``Z`` float32 [n, r] (the same bits as stage prepare's Q), by blocks."""
    n, r = Z.shape
    step = rows_per_block(r, 8, BLOCK_BYTES // 4)
    Q = np.empty((n, r), dtype=np.int8)
    for s in range(0, n, step):
        Q[s:s + step] = quantize(Z[s:s + step].numpy(), grid_step)
    return torch.from_numpy(Q)


__all__ = ["Clock", "Scan", "q_from_z"]
