"""The C heap of a command's process (glibc only; no-ops elsewhere): the one place vocablens sets it.

glibc's allocator settings are process-wide, so the library never touches them; the CLI sets them
once per command (:func:`tune_heap`, from the app's callback), and a library caller who wants the
same may call :func:`tune_heap` itself, knowing it holds for the rest of its process (glibc cannot
read these settings back, so they cannot be restored).

Why: block-wise analyses (the argmax scan's worker-thread passes, the readout in row blocks)
allocate and free many arrays of 1-16 MiB. By default glibc raises its mmap threshold to the largest
block freed, after which such blocks come from the arenas (one per thread), which fragment and keep
the freed memory resident. With the threshold fixed, blocks of at least :data:`MMAP_THRESHOLD` are
mapped and unmapped, so the resident set stays at the live data plus a block; fixing it also stops
glibc's own raising of the trim threshold, which is therefore set too (:data:`TRIM_THRESHOLD`), so
that smaller freed blocks (the int8 kernels' 2 MiB products) are reused instead of faulted in again.
Results never depend on these settings. Figures: docs/performance-argmax.md.
"""

from __future__ import annotations

#: blocks at least this large (bytes) are mapped, and unmapped when freed, instead of taken from an arena
MMAP_THRESHOLD = 4 << 20
#: free memory (bytes) an arena keeps at its top before giving it back to the OS
TRIM_THRESHOLD = 16 << 20
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1      # glibc's mallopt parameter numbers


def tune_heap() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` and its trim threshold at
    :data:`TRIM_THRESHOLD` bytes, for the rest of the process.

    Returns whether it took effect (False where glibc is not the allocator: nothing changed).
    """
    libc = _glibc()
    if libc is None or not libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return False
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def trim_heap() -> bool:
    """Give glibc's free heap pages back to the OS (``malloc_trim(0)``), e.g. the loaders' scratch
    after a model is read; False where glibc is not there."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def _glibc():
    """glibc through ctypes, or None (another C library, or no ``mallopt``/``malloc_trim``)."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "trim_heap", "tune_heap"]
