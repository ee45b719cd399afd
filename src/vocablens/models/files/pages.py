"""Pages of a memory-mapped checkpoint back to the OS once an analysis has read them (Linux).

:func:`vocablens.models.files.partial.materialize_parts` leaves the tensors it reads memory-mapped from the
checkpoint's safetensors file (a private file mapping): a page enters the process's resident set when
an analysis first reads it and stays there, so a pass over the head in row blocks ends with the
whole [V, d] matrix resident although it only ever needed one block. :func:`release_pages` hands the
pages of a tensor that has been read back (``madvise(MADV_DONTNEED)``); a later read maps them again
from the page cache (a minor fault per page, or a disk read if the kernel dropped them meanwhile).

It only ever drops pages that equal the file: each page is checked in ``/proc/self/pagemap`` first,
and the range is left alone unless every present page is a file page (a page written in place, e.g.
by an edit of the weights, is private anonymous memory and would be lost; a tensor in ordinary
memory is anonymous too, so nothing happens to it). Process-wide and off unless a command turns it on
(:func:`release_after_reading`): a library caller that reads the same matrix again and again keeps its
pages.

:class:`PageRelease` serves the exact argmax check, which makes many passes over the rows of a
numpy matrix ``W`` [V, d] while it holds the whitened rows: when the whole matrix lies in file
mappings (``/proc/self/maps``) and none of its pages differs from the file when the pass begins
(read-only mappings cannot differ; a copy-on-write mapping, as ``safe_open`` and
:func:`vocablens.models.files.partial.load_head_only` hand it out, is checked page by page once), each
release is one system call. The scan only reads ``W``, so no page can become a private copy while
it runs.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import torch

_ON = False
_MADV_DONTNEED = 4
_PRESENT, _SWAPPED, _FILE = 1 << 63, 1 << 62, 1 << 61  # /proc/self/pagemap entry bits


def release_after_reading(on: bool = True) -> None:
    """Turn :func:`release_pages` on (or off) for the rest of the process. Commands that read each
    memory-mapped tensor in one or a few passes (``project``) call it; off by default."""
    global _ON
    _ON = bool(on)


def release_pages(t: torch.Tensor | None) -> int:
    """Give back the resident pages that lie wholly inside ``t``'s memory, if they are file pages.

    ``t``: a CPU tensor whose elements are one dense span (contiguous, or the transpose of a
    contiguous matrix, e.g. ``W[a:b]`` of a row-major ``W``). Pages shared with memory outside the
    span (its first and last, when unaligned) stay.

    Returns:
        Bytes of address range advised (0 when off, not Linux, not a dense CPU span, or when any page
        of the range is anonymous or swapped: then nothing is dropped). Never raises.
    """
    if not _ON or t is None or not sys.platform.startswith("linux") or t.device.type != "cpu" or t.numel() == 0:
        return 0
    if not (t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())):
        return 0
    page = _page_size()
    start = t.data_ptr()
    lo = -(-start // page) * page
    hi = (start + t.numel() * t.element_size()) // page * page
    if hi <= lo or not _all_file_pages(lo, hi, page):
        return 0
    libc = _libc()
    if libc is None or libc.madvise(lo, hi - lo, _MADV_DONTNEED) != 0:
        return 0
    return hi - lo


def read_once(chunks):
    """Yield each tensor of ``chunks`` (e.g. ``W.split(n)``), then :func:`release_pages` it once the
    consumer asks for the next: a scan over a memory-mapped tensor keeps one chunk resident."""
    for c in chunks:
        yield c
        release_pages(c)


def _all_file_pages(lo: int, hi: int, page: int) -> bool:
    """Whether every present page of [lo, hi) is a file page and none is swapped out."""
    n = (hi - lo) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(lo // page * 8)
            raw = f.read(n * 8)
    except OSError:
        return False
    if len(raw) != n * 8:
        return False
    e = np.frombuffer(raw, dtype="<u8")
    present = (e & np.uint64(_PRESENT)) != 0
    bad = ((e & np.uint64(_SWAPPED)) != 0) | (present & ((e & np.uint64(_FILE)) == 0))
    return not bool(bad.any())


@functools.lru_cache(maxsize=1)
def _page_size() -> int:
    return int(os.sysconf("SC_PAGE_SIZE"))


@functools.lru_cache(maxsize=1)
def _libc():
    """glibc's (or musl's) ``madvise`` through ctypes, or None."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return libc


# ---------------------------------------------------------------- rows of a file mapping
def read_only_file_mapping(lo: int, hi: int) -> bool:
    """True when the address range ``[lo, hi)`` lies wholly in file mappings (a path, an inode)
    without write permission, according to ``/proc/self/maps``; False otherwise or unreadable."""
    return _file_mapping(lo, hi, writable=False)


def file_pages_only(lo: int, hi: int) -> bool:
    """True when ``[lo, hi)`` lies wholly in file mappings (read-only, or copy-on-write) and every
    present page of it is the file's page (none written, none swapped out): dropping any of them
    loses nothing. False otherwise or unreadable."""
    if not _file_mapping(lo, hi, writable=True):
        return False
    if read_only_file_mapping(lo, hi):
        return True
    page = _page_size()
    a, b = lo // page * page, -(-hi // page) * page
    return _all_file_pages(a, b, page)


def _file_mapping(lo: int, hi: int, writable: bool) -> bool:
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
        if s > pos or ("w" in f[1] and not writable) or f[4] == "0" or not f[5].startswith("/"):
            return False
        pos = e
        if pos >= hi:
            return True
    return False


class PageRelease:
    """Drops the pages of rows of a C-contiguous numpy matrix [V, d] after they were read.

    ``release(start, stop)`` gives back the pages of rows ``[start, stop)``, ``release_all()``
    those of the whole matrix; they do nothing unless the whole matrix is a file mapping whose
    pages are all the file's (:func:`file_pages_only`, checked once here: the caller only reads the
    matrix afterwards). Results never change: a dropped page is read again from the file when it
    is next touched.
    """

    def __init__(self, a) -> None:
        self.base = 0
        self.row = self.n = self.nbytes = 0
        self.calls = 0
        if not isinstance(a, np.ndarray) or a.ndim != 2 or not a.flags.c_contiguous or a.nbytes < 2 * _page_size():
            return
        lo = a.ctypes.data
        if not file_pages_only(lo, lo + a.nbytes):
            return
        libc = _libc()
        if libc is None:  # pragma: no cover - not Linux
            return
        self._madvise = libc.madvise
        self.base, self.row, self.n, self.nbytes = lo, a.strides[0], a.shape[0], a.nbytes

    @property
    def active(self) -> bool:
        """Whether releases reach the kernel (the matrix is a file mapping of unwritten pages)."""
        return self.base != 0

    def release(self, start: int, stop: int) -> None:
        """Drop the pages holding rows ``[start, stop)`` (clipped to the matrix; the pages at both
        ends may hold neighbouring rows too: those are read again when next touched)."""
        if not self.base:
            return
        start, stop = max(0, int(start)), min(self.n, int(stop))
        if stop <= start:
            return
        page = _page_size()
        a = (self.base + start * self.row) // page * page
        b = -(-(self.base + stop * self.row) // page) * page
        self._madvise(a, b - a, _MADV_DONTNEED)
        self.calls += 1

    def release_all(self) -> None:
        """Drop every resident page of the matrix (after a gather of scattered rows; one system
        call, whose cost is the page-table walk over the matrix: microseconds)."""
        self.release(0, self.n)


__all__ = ["PageRelease", "file_pages_only", "read_once", "read_only_file_mapping", "release_after_reading", "release_pages"]
