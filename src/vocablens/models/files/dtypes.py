"""The one dtype table: names users type (``bf16``, ``float32`` ...) -> torch dtype and bytes.

Every option or argument that takes a dtype name (``--dtype``, the logits dtype of ``anatomy``, a
lens's save dtype) resolves it here.
"""

from __future__ import annotations

from vocablens.errors import BadInput

#: name -> (canonical name, bytes per element); the canonical name is torch's (``bfloat16``).
DTYPES: dict[str, tuple[str, int]] = {
    "float32": ("float32", 4), "fp32": ("float32", 4), "float": ("float32", 4),
    "bfloat16": ("bfloat16", 2), "bf16": ("bfloat16", 2),
    "float16": ("float16", 2), "fp16": ("float16", 2), "half": ("float16", 2),
    "float64": ("float64", 8), "fp64": ("float64", 8), "double": ("float64", 8),
}


def canonical_dtype(name, what: str = "dtype") -> str:
    """``bf16`` -> ``bfloat16``; accepts a ``torch.dtype`` or a name (case-insensitive, ``torch.`` ok).

    Raises:
        BadInput: an unknown name (the message names ``what``, e.g. ``--dtype``).
    """
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPES:
        raise BadInput(f"unknown {what} {name!r}; use float32, bfloat16, float16 or float64")
    return DTYPES[key][0]


def dtype_bytes(name) -> int:
    """Bytes per element of a dtype name (``bf16`` -> 2).

    Raises:
        BadInput: an unknown name.
    """
    return DTYPES[canonical_dtype(name).lower()][1]


def torch_dtype(name, what: str = "dtype"):
    """The ``torch.dtype`` for a name (``None`` and a ``torch.dtype`` pass through).

    Raises:
        BadInput: an unknown name.
    """
    import torch

    if name is None or isinstance(name, torch.dtype):
        return name
    return getattr(torch, canonical_dtype(name, what))


__all__ = ["DTYPES", "canonical_dtype", "dtype_bytes", "torch_dtype"]
