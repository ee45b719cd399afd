"""Keep the C heap from growing during a scan's worker-thread passes (glibc only).

The scan's passes run on Python worker threads (:func:`~vocablens.argmax.state.run_in_workers`)
that allocate blocks of 1-16 MiB (products, masks, index arrays) and free them at once. glibc
serves each thread from its own arena and, after the first large block is freed, raises its mmap
threshold to that block's size, so later blocks come from the arenas and freed ones stay there:
measured on the trained-like benchmark head (151,936 x 896), the resident set grew by ~300 KiB per
row the reflect stage handled, 13 GiB in all, against 1.2 GiB for the arrays themselves; with the
threshold fixed, blocks of a few MiB are mapped and unmapped and the growth is gone (49,152 x 576:
+190 MiB instead of +940 MiB over the reflect stage). Results are unchanged; allocation is a page
fault per page instead of a reuse, ~1 ms per 16 MiB block against ~25 ms of product per block.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: blocks at least this large are mapped (and unmapped when freed) instead of taken from an arena
MMAP_THRESHOLD = 4 << 20
#: free memory an arena keeps at its top before giving it back. Fixing the mmap threshold also
#: stops glibc's own raising of this one (default 128 KiB), so every freed 2 MiB block of products
#: went back to the system and the next one faulted its pages in again: with it at 16 MiB, one
#: [1,024 x 512] int8 product through oneDNN (:mod:`~vocablens.argmax.kernels`) took 0.4-0.6 ms
#: instead of 1.0-2.5 ms (measured, one thread). Bounded: at most this much per arena.
TRIM_THRESHOLD = 16 << 20
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1      # glibc's mallopt parameter numbers
_done = False


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` and its trim threshold at
    :data:`TRIM_THRESHOLD` (once per process; a no-op and False off Linux/glibc). Returns whether
    it took effect."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _done = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        if _done:
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        _done = False
    return _done


__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]
