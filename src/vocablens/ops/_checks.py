"""Input checks shared by the ops (clear errors naming the argument and shapes, never a silent wrong answer).

Every public function of :mod:`vocablens.ops` validates its arguments here before any work (and, in
the vocab-parallel ops, before any collective): tensors by dtype and shape (:class:`ShapeMismatch`),
plain arguments by type and range (:class:`BadInput` naming the argument).
"""

from __future__ import annotations

import math
import numbers

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import check_transform

#: the reductions every loss of :mod:`vocablens.ops` accepts.
REDUCTIONS = ("mean", "sum", "none")

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_float(name: str, t: torch.Tensor) -> None:
    """Raise ShapeMismatch unless ``t`` is a floating tensor of a supported dtype."""
    if not isinstance(t, torch.Tensor):
        raise ShapeMismatch(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeMismatch(f"{name} must be float32/bfloat16/float16/float64; got {t.dtype} {tuple(t.shape)}")


def check_ids(name: str, ids: torch.Tensor, V: int, *, ignore_index: int | None = None) -> None:
    """Raise ShapeMismatch for non-integer ids, BadInput for ids outside [0, V) (except ignore_index)."""
    if not isinstance(ids, torch.Tensor):
        raise ShapeMismatch(f"{name} must be a torch.Tensor of integer ids; got {type(ids).__name__}")
    if ids.dtype not in INT_DTYPES:
        raise ShapeMismatch(f"{name} must hold integer ids (int64/int32); got {ids.dtype} {tuple(ids.shape)}")
    if ids.numel() == 0:
        return
    check = ids if ignore_index is None else ids[ids != ignore_index]
    if check.numel() == 0:
        return
    lo, hi = int(check.min()), int(check.max())
    if lo < 0 or hi >= V:
        bad = lo if lo < 0 else hi
        extra = f" (ignore_index={ignore_index} is allowed)" if ignore_index is not None else ""
        raise BadInput(f"{name} {tuple(ids.shape)} holds id {bad} outside [0, {V}) for a vocabulary of {V} rows{extra}")


def check_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, hname: str = "hidden") -> None:
    """Check hidden [..., d] against weight [V, d] and bias [V]; raise ShapeMismatch naming the shapes."""
    check_float(hname, hidden)
    check_float("weight", weight)
    if weight.dim() != 2:
        raise ShapeMismatch(f"weight must be [V, d]; got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ShapeMismatch(f"{hname} {tuple(hidden.shape)} and weight {tuple(weight.shape)}: "
                            f"last dim of {hname} must equal d={weight.shape[1]}")
    if weight.shape[0] == 0:
        raise ShapeMismatch(f"weight {tuple(weight.shape)} has no rows (V=0)")
    if hidden.dtype != weight.dtype:
        raise ShapeMismatch(f"{hname} dtype {hidden.dtype} differs from weight dtype {weight.dtype}; cast one of them")
    if bias is not None:
        check_float("bias", bias)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ShapeMismatch(f"bias {tuple(bias.shape)} must be [V]=({weight.shape[0]},) for weight {tuple(weight.shape)}")
    if hidden.device != weight.device:
        raise ShapeMismatch(f"{hname} is on {hidden.device} but weight is on {weight.device}")


def check_nonempty(name: str, t: torch.Tensor) -> None:
    """Raise BadInput for an empty tensor (no tokens)."""
    if t.numel() == 0:
        raise BadInput(f"{name} {tuple(t.shape)} is empty: no tokens to compute")


def check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi] (either bound may be None).

    Raises:
        BadInput: ``value`` is not an integer (bool, float, str, None and tensors are refused, so
        ``top_k=True`` or ``k=2.0`` never slips through), or lies outside [lo, hi]; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadInput(f"{name} must be an int; got {value!r} ({type(value).__name__})")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise BadInput(f"{name} must be in [{lo_s}, {hi_s}]; got {v}")
    return v


def check_size(name: str, value) -> int | None:
    """An optional chunk size: None (derived automatically) or an int >= 1.

    Raises:
        BadInput: anything else (0, negative, float, bool, str, tensor), naming ``name``.
    """
    return None if value is None else check_int(name, value, 1)


def check_real(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` as a finite float in [lo, hi] (int or float; bool, str, None and tensors are refused).

    Raises:
        BadInput: not a real number, not finite, or outside [lo, hi]; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise BadInput(f"{name} must be a finite number; got {value!r} ({type(value).__name__})")
    v = float(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadInput(f"{name} must be in [{lo}, {hi}]; got {v}")
    return v


def check_choice(name: str, value, choices: tuple) -> None:
    """Raise BadInput naming ``name`` unless ``value`` is one of ``choices`` (compared by equality)."""
    if not isinstance(value, str) or value not in choices:
        raise BadInput(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_bool(name: str, value) -> bool:
    """Raise BadInput naming ``name`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise BadInput(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return value


def check_head_transform(logit_scale, softcap) -> tuple[float, float | None]:
    """``(logit_scale, softcap)`` as floats, checked by :func:`vocablens.logit_transform.check_transform`.

    Raises:
        BadInput: ``logit_scale`` not a finite non-zero number, ``softcap`` not None and not a
        finite positive number.
    """
    check_transform(logit_scale, softcap)
    return float(logit_scale), None if softcap is None else float(softcap)
