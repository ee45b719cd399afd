"""Exact int8 products against the rows of Q: the one kernel every int8 stage of the scan uses.

Every int8 stage of the scan (the all-pairs stage, the reflect stage's scores, the tilt's weight
test) multiplies blocks of directions ``A`` (int8 [m, r]) by blocks of Q's rows (int8 [k, r]) and
needs the exact integer sums. Three kernels can give them, and which is fastest, or even exact,
depends on the CPU, so :func:`exact_products` checks each against int64 products and times it once
per scan:

- oneDNN's matmul primitive on Q packed once, in chunks of :data:`PACK_ROWS`
  (``torch.ops.onednn.qlinear_prepack``, the one PyTorch's x86 int8 inference uses; unit scales,
  zero offsets, int32 accumulation on AMX tiles or VNNI, the sum written as float32);
- ``torch._int_mm`` (oneDNN's older s8s8s32 GEMM, which re-packs its right operand on every call);
- float32 GEMMs on the grid values.

Exactness: each product of two grid values is at most 127^2 in magnitude, so every sum over
``r <= 1,040`` columns (:data:`MAX_WIDTH`) is an integer below 2^24 and float32 holds it exactly
whatever the summation order; wider rows are not packed, and the float32 kernel sums slices of that
width in int32. The int8 kernels are not exact everywhere: on an AVX2-only CPU (no VNNI) oneDNN's
int8 path saturates 16-bit intermediate sums, and the check finds it.
"""

from __future__ import annotations

import math
import time

import torch

from vocablens.argmax.blocks import run_in_workers

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


def fp32_exact_mm(r: int):
    """``(A, B) -> A @ B^T`` for int8 blocks (or their float32 copies) by float32 GEMMs: exact.

    Each product is <= 127^2, so with at most :data:`MAX_WIDTH` columns every partial sum is an
    integer below 2^24, which float32 holds exactly in any summation order: one GEMM, float32 result
    (exact integers). Wider rows are cut into column slices of that width whose exact partial
    results are summed in int32 (int32 result).
    """
    step = max(1, min(r, MAX_WIDTH))
    if step >= r:
        return lambda A, B: A.float() @ B.float().T

    def f(A, B):
        out = None
        for c in range(0, r, step):
            part = (A[:, c:c + step].float() @ B[:, c:c + step].float().T).int()
            out = part if out is None else out.add_(part)
        return out
    return f


class Products:
    """Exact integer products ``A @ Q[a:b]^T`` of int8 directions ``A`` [m, r] against ranges of the
    rows of ``Q`` (int8 [n, r]) on the CPU, by one of three kernels (``kind``):

    - ``"onednn"``: Q packed once for oneDNN's matmul primitive (:class:`PackedRows`; AMX or VNNI);
    - ``"int_mm"``: ``torch._int_mm`` (int8 products, int32 sums);
    - ``"float32"``: float32 GEMMs on the grid values (exact integers, :func:`fp32_exact_mm`), the one that
      runs everywhere.

    ``mm(A, a, b)`` returns float32 or int32 [m, b - a] holding the exact integers (``A`` may be
    int8 or its float32 copy for the float32 kernel). ``align``: products over ranges starting and
    ending at multiples of it cost no more than their rows (the packed chunks).
    """

    def __init__(self, Q: torch.Tensor, kind: str, packed: PackedRows | None = None, timing: dict | None = None):
        self.Q, self.kind, self.packed = Q, kind, packed
        self.timing = dict(timing or {})            # ms per probe product of each kernel that was timed
        self.n, self.r = Q.shape
        self.align = packed.rows if packed is not None else 1
        self._fp = fp32_exact_mm(self.r)

    def mm(self, A: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """``A @ Q[a:b]^T`` as float32 or int32 [m, b - a], exact integers."""
        if self.kind == "onednn":
            return self.packed.mm(A, a, b)
        if self.kind == "int_mm":
            return torch._int_mm(A.contiguous(), self.Q[a:b].T)
        return self._fp(A, self.Q[a:b])


def _int_mm_pair(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch._int_mm(A.contiguous(), B.T)


def _equal_int64(mm, A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether ``mm(A, B)`` equals the int64 product ``A B^T`` (False on a RuntimeError)."""
    try:
        return torch.equal(mm(A, B).long(), A.long() @ B.long().T)
    except (RuntimeError, AttributeError):
        return False


def _extremes(r: int) -> torch.Tensor:
    """int8 [4, r]: rows at the grid's extremes (all 127, all -127, alternating, and the first
    column alone), whose products reach the largest sums any grid rows can."""
    ext = torch.full((4, r), 127, dtype=torch.int8)
    ext[1] = -127
    ext[2, ::2] = -127
    ext[3, 1:] = 0
    return ext


def _slower_than(f, X: torch.Tensor, Y: torch.Tensor, limit_s: float) -> bool:
    """Whether ``f(X, Y)`` takes more than ``limit_s`` seconds, found on leading slices of X's rows
    (1, 8, 64, 512, then all): a kernel thousands of times slower than another (oneDNN's int8 path on
    some CPUs) is found in milliseconds instead of being timed whole (seconds to tens of seconds)."""
    for m in sorted({min(k, len(X)) for k in (1, 8, 64, 512)} | {len(X)}):
        t = time.perf_counter()
        f(X[:m], Y)
        if time.perf_counter() - t > limit_s:
            return True
    return False


def _add_onednn(ok: dict, sample, A, B, ext, X, Y) -> None:
    """Add the oneDNN kernel (on ``sample`` packed) to the exact kernels ``ok`` where it is exact on
    ``A`` x ``B`` and the grid's extremes ``ext``, unless it is already 3x slower on ``X`` x ``Y`` than
    the fastest of ``ok`` (then it could not be picked, and its check is not worth its time)."""
    try:
        probe_pk = PackedRows(sample)
        pe = PackedRows(ext, rows=2)

        def f(X_, _B):
            return probe_pk.mm(X_, 0, min(len(sample), PACK_ROWS))
        best = math.inf
        for g in ok.values():
            t = time.perf_counter()
            g(X, Y)
            best = min(best, time.perf_counter() - t)
        if (not _slower_than(f, X, Y, 3 * best)
                and _equal_int64(lambda X_, _B: probe_pk.mm(X_, 1, len(sample)), A, B)
                and _equal_int64(lambda X_, _B: pe.mm(X_, 0, len(ext)), ext, ext)):
            ok["onednn"] = f
    except (RuntimeError, ValueError):
        pass


def _best_of_three(ok: dict, X: torch.Tensor, Y: torch.Tensor) -> dict:
    """Seconds of each kernel of ``ok`` on ``X`` x ``Y``: the best of three interleaved timings; a
    kernel 3x slower than the best sits out the later rounds."""
    times = {k: math.inf for k in ok}
    for rnd in range(3):
        for k, f in ok.items():
            if rnd and times[k] > 3 * min(times.values()):
                continue
            t = time.perf_counter()
            f(X, Y)
            times[k] = min(times[k], time.perf_counter() - t)
    return times


def exact_products(Q: torch.Tensor | None, device: str = "cpu") -> Products | None:
    """The exact int8 product kernel for the rows of ``Q`` (int8 [n, r]), or None where no kernel
    can serve: Q absent, not int8 or not on the CPU, the scan's products on a GPU (``device``),
    fewer than 64 rows. Stage gemm picks it once per scan (:mod:`~vocablens.argmax.certificates`).

    Each candidate kernel (:class:`Products`) counts only where it reproduces int64 products on
    Q's own rows and on rows at the grid's extremes (on some CPUs oneDNN's int8 path saturates
    16-bit intermediate sums; ``torch._int_mm`` is wrong for some shapes); the
    fastest of those that do, timed on one thread on the scan's shapes (a 1,024-row block against
    512 rows), is used; oneDNN is checked and timed whole only where a few of its rows do not already
    take 3x the fastest other kernel's time. float32 GEMMs are always a candidate, so a kernel exists wherever Q is
    resident. Which kernel wins differs by CPU by up to 30x (docs/performance-argmax.md).
    """
    if (Q is None or Q.device.type != "cpu" or Q.dtype != torch.int8 or Q.shape[0] < 64
            or str(device or "cpu") != "cpu"):
        return None
    n, r = Q.shape
    sample = Q[: min(n, 2 * PACK_ROWS + 3)]             # across a chunk boundary
    A, B = Q[: min(n, 64)], sample[1:]
    ext = _extremes(r)
    X, Y = Q[: min(n, 1024)], Q[: min(n, PACK_ROWS)]
    cands = {"float32": fp32_exact_mm(r)}
    if hasattr(torch, "_int_mm") and r % 8 == 0:
        cands["int_mm"] = _int_mm_pair
    ok = {k: f for k, f in cands.items() if _equal_int64(f, A, B) and _equal_int64(f, ext, ext)}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)                        # timed as the workers run it
        if _op() is not None and r <= MAX_WIDTH:
            _add_onednn(ok, sample, A, B, ext, X, Y)
        times = _best_of_three(ok, X, Y)
    finally:
        torch.set_num_threads(threads)
    if not times:
        return None
    kind = min(times, key=times.get)
    packed = None
    if kind == "onednn":
        packed = PackedRows(Q, workers=threads)
    return Products(Q, kind, packed, {k: (round(v * 1e3, 3)) for k, v in times.items()})


__all__ = ["MAX_WIDTH", "PACK_ROWS", "PackedRows", "Products", "exact_products", "fp32_exact_mm"]
