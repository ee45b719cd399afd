"""The C heap of a command's process: freed blocks back to the OS (glibc only; no-ops elsewhere).

Process-wide settings, so commands call them, never the library.
"""

from __future__ import annotations


def blocks_back_to_the_os(threshold: int = 2 ** 20) -> bool:
    """Have glibc's malloc serve every allocation of at least ``threshold`` bytes by its own
    ``mmap`` (and give it back on free), for the rest of the process.

    Block-wise analyses (the argmax scan, the readout in row blocks) allocate and free many
    block-sized arrays. By default glibc raises its mmap threshold to the largest block freed (up
    to 32 MiB), after which such blocks come from the heap, which fragments and keeps the freed
    memory resident: measured on the default model, argmax's resident set crept from 0.68 to 0.90 GB
    over the stages with the same live data. A fixed threshold keeps the resident set at the live
    data plus one block (a page-fault cost of about 1 ms per 16 MiB block). A process-wide setting,
    so commands call it (argmax, project). Returns False where glibc is not the allocator (nothing
    changed).
    """
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(-3, int(threshold)))    # -3: M_MMAP_THRESHOLD


def trim_heap() -> bool:
    """Give glibc's free heap pages back to the OS (``malloc_trim(0)``), e.g. the loaders' scratch
    after a model is read (``neighbors``: 467 -> 435 MiB peak); False where glibc is not there."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def _glibc():
    """glibc through ctypes, or None (another C library, or no ``mallopt``/``malloc_trim``)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None
