"""Input checks shared by the ops (clear errors naming the shapes, never a silent wrong answer)."""

from __future__ import annotations

import torch

from vocablens.errors import BadInput, ShapeMismatch

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


def check_softcap(softcap: float | None) -> None:
    if softcap is not None and not (float(softcap) > 0):
        raise BadInput(f"softcap must be a positive number or None; got {softcap}")
