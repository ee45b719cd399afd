"""Pages of a memory-mapped checkpoint back to the OS once an analysis has read them (Linux).

:func:`vocablens.models.lazy.load_borders_only` leaves the tensors it reads memory-mapped from the
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
"""

from __future__ import annotations

import functools
import os
import sys

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
    import numpy as np

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


__all__ = ["read_once", "release_after_reading", "release_pages"]
