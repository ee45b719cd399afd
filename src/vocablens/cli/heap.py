"""The C heap of a command's process (glibc only; no-ops elsewhere): the one place vocablens sets it.

glibc's allocator settings are process-wide, so the library never touches them; the commands that
work in blocks set them here (:func:`tune_heap`), and a library caller who wants the same may call
:func:`tune_heap` itself, knowing it holds for the rest of its process (glibc cannot read these
settings back, so they cannot be restored).

Why: block-wise analyses (the readout in row blocks, the argmax scan's worker-thread passes)
allocate and free many arrays of 1-16 MiB. By default glibc raises its mmap threshold to the largest
block freed, after which such blocks come from the arenas (one per thread), which fragment and keep
the freed memory resident. With the threshold fixed, larger blocks are mapped and unmapped, so the
resident set stays at the live data plus a block. Fixing it also stops glibc's own raising of the
trim threshold; the argmax scan therefore sets that too (:data:`SCAN_TRIM_THRESHOLD`), so that its
2 MiB int8 product blocks are reused instead of faulted in again. Results never depend on these
settings. Figures: docs/performance-argmax.md.
"""

from __future__ import annotations

from typing import Callable

#: bytes from which a block is mapped, and unmapped when freed, in the block-wise commands
BLOCK_MMAP_THRESHOLD = 1 << 20
#: the same during an argmax scan (its 1-4 MiB products stay in the arenas, reused)
SCAN_MMAP_THRESHOLD = 4 << 20
#: free memory (bytes) an arena keeps at its top before giving it back to the OS, during a scan
SCAN_TRIM_THRESHOLD = 16 << 20
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1      # glibc's mallopt parameter numbers


def tune_heap(scan: bool = False) -> bool:
    """Fix glibc's mmap threshold at :data:`BLOCK_MMAP_THRESHOLD` bytes, or for an argmax scan
    (``scan``) at :data:`SCAN_MMAP_THRESHOLD` with the trim threshold at :data:`SCAN_TRIM_THRESHOLD`,
    for the rest of the process.

    Returns whether it took effect (False where glibc is not the allocator: nothing changed).
    """
    libc = _glibc()
    if libc is None or not libc.mallopt(_M_MMAP_THRESHOLD, SCAN_MMAP_THRESHOLD if scan else BLOCK_MMAP_THRESHOLD):
        return False
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, SCAN_TRIM_THRESHOLD)) if scan else True


def tuned_for_the_scan(progress: Callable[[str, int, int], None]) -> Callable[[str, int, int], None]:
    """``progress`` that first sets the scan's heap (:func:`tune_heap` with ``scan``) when the argmax
    scan reports its first stage (not when stored verdicts answer the command: no scan runs)."""
    done = []

    def report(stage: str, a: int, b: int) -> None:
        if not done and stage.startswith(("prepare", "gemm")):
            done.append(tune_heap(scan=True))
        progress(stage, a, b)

    return report


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


__all__ = ["BLOCK_MMAP_THRESHOLD", "SCAN_MMAP_THRESHOLD", "SCAN_TRIM_THRESHOLD", "trim_heap", "tune_heap",
           "tuned_for_the_scan"]
