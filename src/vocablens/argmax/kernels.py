"""Exact int8 products against the rows of Q through oneDNN's matmul primitive (AMX or VNNI).

Every int8 stage of the scan multiplies blocks of directions ``A`` (int8 [m, r]) by blocks of Q's
rows (int8 [k, r]). ``torch._int_mm`` runs them through oneDNN's old s8s8s32 GEMM interface, which
does not use AMX and re-packs its right operand on every call. Here Q's rows are packed once, in
chunks of :data:`PACK_ROWS`, for oneDNN's matmul primitive (``torch.ops.onednn.qlinear_prepack``,
the one PyTorch's x86 int8 inference uses), and each product is one call of that primitive with
unit scales and zero offsets: int32 accumulation on AMX tiles where the CPU has them (VNNI
otherwise), then the int32 sum written as float32.

Exactness: each product of two grid values is at most 127^2 in magnitude, so every sum over
``r <= 1,040`` columns is an integer below 2^24 and float32 holds it exactly; wider rows are not
packed. The path is used only where it reproduces an int64 reference on Q's own rows and on rows at
the grid's extremes, and where it is faster than ``torch._int_mm`` on the scan's shapes (timed
once per scan, on one thread, as the workers run it). Measured on 2 cores of a Xeon with AMX, one
thread, 1,024 x 576 times 576 x 512: 450-760 GMAC/s against 110-140 for ``torch._int_mm``.
"""

from __future__ import annotations

import math
import time

import torch

from vocablens.argmax.state import run_in_workers

#: Q's rows per packed chunk: the all-pairs stage's column blocks and the scoring blocks are
#: multiples of it (a product over a range that is not costs the chunks it touches)
PACK_ROWS = 512
#: widest rows packed: 127^2 x 1,040 < 2^24, so every product is an exact float32 integer
MAX_WIDTH = (2 ** 24 - 1) // (127 * 127)


def _op():
    ns = getattr(torch.ops, "onednn", None)
    try:
        return ns.qlinear_prepack, ns.qlinear_pointwise
    except (AttributeError, RuntimeError):
        return None


class PackedRows:
    """The rows of an int8 matrix ``Q`` [n, r] packed for oneDNN, in chunks of ``rows``.

    ``mm(A, a, b)`` is ``A @ Q[a:b]^T`` for int8 ``A`` [m, r]: float32 [m, b - a] holding the
    exact integers. Memory: one packed copy of Q (n r bytes). Raises ValueError for rows wider than
    :data:`MAX_WIDTH` (their sums could leave float32's exact integers) and RuntimeError where
    this PyTorch has no oneDNN int8 matmul.
    """

    def __init__(self, Q: torch.Tensor, rows: int = PACK_ROWS, m_hint: int = 1024, workers: int = 1):
        ops = _op()
        if ops is None:
            raise RuntimeError("this PyTorch has no oneDNN int8 matmul (torch.ops.onednn)")
        n, r = Q.shape
        if r > MAX_WIDTH:
            raise ValueError(f"rows of width {r} > {MAX_WIDTH}: products may not be exact in float32")
        self._prepack, self._call = ops
        self.n, self.r, self.rows = n, r, int(rows)
        starts = list(range(0, n, self.rows))
        self.chunks = [None] * len(starts)

        def pack(s: int, _w: int) -> None:
            self.chunks[s // self.rows] = self._prepack(Q[s:s + self.rows].contiguous(), [m_hint, r])
        run_in_workers(starts, pack, workers)
        self._ones = torch.ones(self.rows, dtype=torch.float32)
        self._zeros = torch.zeros(self.rows, dtype=torch.int64)

    def _one(self, A: torch.Tensor, k: int) -> torch.Tensor:
        c = min(self.rows, self.n - k * self.rows)
        return self._call(A, 1.0, 0, self.chunks[k], self._ones[:c], self._zeros[:c], None,
                          1.0, 0, torch.float32, "none", [], "")

    def mm(self, A: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """``A @ Q[a:b]^T`` (int8 ``A`` [m, r]) as float32 [m, b - a], exact integers."""
        A = A.contiguous()
        k0, k1 = a // self.rows, (b - 1) // self.rows
        parts = [self._one(A, k) for k in range(k0, k1 + 1)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        lo = a - k0 * self.rows
        return out if lo == 0 and out.shape[1] == b - a else out[:, lo:lo + b - a]


def _exact(pk: PackedRows, Q: torch.Tensor) -> bool:
    """Whether ``pk`` reproduces int64 products on Q's first rows and on rows at the grid's extremes."""
    n, r = Q.shape
    A = Q[: min(n, 64)]
    b = min(n, 2 * pk.rows + 3)                         # across a chunk boundary, not aligned
    ref = A.long() @ Q[1:b].long().T
    if not torch.equal(pk.mm(A, 1, b).long(), ref):
        return False
    ext = torch.full((3, r), 127, dtype=torch.int8)
    ext[1] = -127
    ext[2, ::2] = -127
    pe = PackedRows(ext, rows=2)
    return torch.equal(pe.mm(ext, 0, 3).long(), ext.long() @ ext.long().T)


def packed_rows(st) -> PackedRows | None:
    """The scan's packed Q (made once and kept on ``st``), or None where it cannot serve: Q not
    resident or not on the CPU, rows wider than :data:`MAX_WIDTH`, no oneDNN int8 matmul, a
    result that differs from the int64 reference, or slower than ``torch._int_mm`` here."""
    if getattr(st, "_packed", False) is not False:
        return st._packed
    st._packed = None
    Q = st.Qt
    if (Q is None or Q.device.type != "cpu" or Q.dtype != torch.int8 or st.n < 64
            or Q.shape[1] > MAX_WIDTH or _op() is None or getattr(st, "device", "cpu") != "cpu"):
        return None
    threads = torch.get_num_threads()
    try:
        pk = PackedRows(Q, workers=threads)
        torch.set_num_threads(1)                        # timed as the workers run it
        if not _exact(pk, Q):
            return None
        A = Q[: min(st.n, 1024)]                        # one all-pairs product: [1024, r] x one chunk
        e = min(st.n, pk.rows)
        times = [math.inf, math.inf]
        for _ in range(5):                              # best of five, interleaved
            for i, f in enumerate((lambda: pk.mm(A, 0, e), lambda: torch._int_mm(A, Q[:e].T))):
                t = time.perf_counter()
                try:
                    f()
                except (RuntimeError, AttributeError):  # no _int_mm, or it refuses this width
                    continue
                times[i] = min(times[i], time.perf_counter() - t)
        if times[1] < 0.8 * times[0]:                 # a clear loss only: the timing is noisy
            return None
    except (RuntimeError, ValueError):
        return None
    finally:
        torch.set_num_threads(threads)
    st._packed = pk
    return pk


__all__ = ["MAX_WIDTH", "PACK_ROWS", "PackedRows", "packed_rows"]
