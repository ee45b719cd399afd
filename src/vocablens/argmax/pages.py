"""Hand the resident pages of a read-only memory-mapped matrix back after a pass over its rows.

The exact argmax check makes several passes over the rows ``W`` [V, d] (whitening, the shared
ball of the proofs, the float64 re-check) while it holds the whitened rows ``Z`` [n, r]: with
``W`` resident too, the peak is two such matrices. When ``W`` is a read-only file mapping (as
:func:`vocablens.models.matrices.load_head_only` maps a safetensors checkpoint), the pages a
pass has read can be dropped from this process with ``madvise(MADV_DONTNEED)``: they stay in the
kernel's page cache, and a later read faults the same bytes back in from the file. The data can
never change: the mapping has no write permission, so no page of it was ever copied or written.

Anything else (anonymous memory: a tensor built in memory, a float32 copy of a bf16 checkpoint; a
writable or private mapping that could hold written pages; a platform without ``/proc/self/maps``)
is left alone: :class:`PageRelease` is then a no-op, and the peak is simply higher.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

MADV_DONTNEED = 4       # Linux
PAGE = mmap.PAGESIZE


def read_only_file_mapping(lo: int, hi: int) -> bool:
    """True when the address range ``[lo, hi)`` lies wholly in file mappings (a path, an inode)
    without write permission, according to ``/proc/self/maps``; False otherwise or unreadable."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    pos = lo
    for line in lines:                              # sorted by address
        f = line.split(maxsplit=5)
        if len(f) < 6:
            continue
        s, e = (int(x, 16) for x in f[0].split("-"))
        if e <= pos:
            continue
        if s > pos or "w" in f[1] or f[4] == "0" or not f[5].startswith("/"):
            return False
        pos = e
        if pos >= hi:
            return True
    return False


class PageRelease:
    """Drops the pages of rows of a C-contiguous numpy matrix [V, d] after they were read.

    ``release(start, stop)`` gives back the pages of rows ``[start, stop)``, ``release_all()``
    those of the whole matrix; they do nothing unless the whole matrix is a read-only file mapping
    (:func:`read_only_file_mapping`, checked once here). Results never change: a dropped page is
    read again from the file when it is next touched.
    """

    def __init__(self, a) -> None:
        self.base = 0
        self.row = self.n = self.nbytes = 0
        self.calls = 0
        if not isinstance(a, np.ndarray) or a.ndim != 2 or not a.flags.c_contiguous or a.nbytes < 2 * PAGE:
            return
        lo = a.ctypes.data
        if not read_only_file_mapping(lo, lo + a.nbytes):
            return
        try:
            self._madvise = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):  # pragma: no cover - not Linux
            return
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.base, self.row, self.n, self.nbytes = lo, a.strides[0], a.shape[0], a.nbytes

    @property
    def active(self) -> bool:
        """Whether releases reach the kernel (the matrix is a read-only file mapping)."""
        return self.base != 0

    def release(self, start: int, stop: int) -> None:
        """Drop the pages holding rows ``[start, stop)`` (clipped to the matrix; the pages at both
        ends may hold neighbouring rows too: those are read again when next touched)."""
        if not self.base:
            return
        start, stop = max(0, int(start)), min(self.n, int(stop))
        if stop <= start:
            return
        a = (self.base + start * self.row) // PAGE * PAGE
        b = -(-(self.base + stop * self.row) // PAGE) * PAGE
        self._madvise(a, b - a, MADV_DONTNEED)
        self.calls += 1

    def release_all(self) -> None:
        """Drop every resident page of the matrix (after a gather of scattered rows; one system
        call, whose cost is the page-table walk over the matrix: microseconds)."""
        self.release(0, self.n)


__all__ = ["PageRelease", "read_only_file_mapping"]
