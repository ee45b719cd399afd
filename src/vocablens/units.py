"""Layer 0: how a count or a size reads in every table, note and message (no torch, no model).

* :func:`fmt_bytes` — memory in binary units (``768.00 MiB``, ``2.32 GiB``), the one convention of
  DESIGN.md (memory in bytes, rendered as KiB/MiB/GiB).
* :func:`plural` — a count with its noun in the right number (``1 token``, ``2 tokens``).
"""

from __future__ import annotations

_IRREGULAR = {"matrix": "matrices", "index": "indices", "vertex": "vertices", "this": "these", "is": "are",
              "was": "were", "has": "have"}


def fmt_bytes(n: float) -> str:
    """Bytes in binary units with two decimals: ``805306368`` -> ``'768.00 MiB'``, ``512`` -> ``'512 B'``."""
    n = float(n)
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{int(n):,} B"


def noun(n: int | float, word: str, many: str | None = None) -> str:
    """``word`` in the number ``n`` asks for: ``noun(1, 'token')`` -> ``'token'``, else ``'tokens'``
    (``many`` for an irregular plural; ``-s``/``-x``/``-ch``/``-sh`` take ``-es``, consonant + ``y``
    takes ``-ies``)."""
    if n == 1:
        return word
    if many is not None:
        return many
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def plural(n: int | float, word: str, many: str | None = None) -> str:
    """A count and its noun: ``plural(1, 'token')`` -> ``'1 token'``, ``plural(1234, 'row')`` ->
    ``'1,234 rows'`` (integers with thousands separators)."""
    shown = f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
    return f"{shown} {noun(n, word, many)}"


__all__ = ["fmt_bytes", "noun", "plural"]
