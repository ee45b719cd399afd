"""Which positions of a prompt a lens reads: one parser for every surface (``positions=`` of
:meth:`vocablens.Model.lens`, ``--positions`` of ``vocablens lens``) and the check against a prompt."""

from __future__ import annotations

import numbers
from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.units import plural


def parse_positions(value, what: str = "positions") -> str | list[int]:
    """What a caller gave for positions -> ``"last"``, ``"all"`` or a list of ints (negative from the
    end), by THE rule of every surface: the strings ``last``, ``all`` or comma-separated integers
    (``"12"``, ``"1,2"``, ``"-1"``), an int, or a list / integer tensor of ints. ``None`` is ``last``.
    A list of such specs (strings or lists) is one spec per prompt of a batch.

    Args:
        what: the parameter as the caller wrote it (``positions`` from Python, ``--positions`` on the CLI).

    Raises:
        BadInput: anything else (a float, a bool, a word other than last/all, an empty list), in one
            line naming ``what``.
    """
    usage = f"{what} takes last, all, or positions as comma-separated integers (negative from the end)"
    if value is None:
        return "last"
    if isinstance(value, str):
        s = value.strip()
        if s in ("last", "all"):
            return s
        try:
            got = [int(x) for x in s.split(",")]
        except ValueError:
            raise BadInput(f"{usage}; got {value!r}") from None
        return got
    if torch.is_tensor(value):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex() or value.dim() > 1:
            raise BadInput(f"{usage}; got a {str(value.dtype).replace('torch.', '')} tensor of shape "
                           f"{list(value.shape)}")
        value = value.reshape(-1).tolist()
    if _is_int(value):
        return [int(value)]
    if isinstance(value, (list, tuple)) and value and all(_is_int(p) for p in value):
        return [int(p) for p in value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, (str, list, tuple)) or torch.is_tensor(p)
                                                          for p in value):  # one spec per prompt of a batch
        return [parse_positions(p, f"{what}[{i}]") for i, p in enumerate(value)]
    raise BadInput(f"{usage}; got {value!r}")


def _is_int(p) -> bool:
    if torch.is_tensor(p):
        return p.dim() == 0 and not (p.dtype == torch.bool or p.is_floating_point() or p.is_complex())
    return isinstance(p, numbers.Integral) and not isinstance(p, bool)


def resolve_positions(T: int, positions: str | int | Sequence[int] | None) -> torch.Tensor:
    """``None``/``"last"`` -> [T-1]; ``"all"`` -> 0..T-1; ints (negative from the end) -> checked
    (anything else is read by :func:`parse_positions` first): one prompt's spec (a batch's per-prompt
    specs are split by :func:`~vocablens.lens.logit.lens_batches`).

    Returns:
        [P] int64 positions in 0..T-1.

    Raises:
        BadInput: a position outside [-T, T); what :func:`parse_positions` refuses.
    """
    positions = parse_positions(positions)
    # cpu: position labels, indices the readout moves to the stream's device
    if positions == "last":
        return torch.tensor([T - 1])  # cpu: a label
    if positions == "all":
        return torch.arange(T)  # cpu: labels
    out = []
    for p in positions:
        if not -T <= p < T:
            raise BadInput(f"position {p} is outside the prompt's {plural(T, 'token')}")
        out.append(p % T)
    return torch.tensor(out, dtype=torch.long)  # cpu: labels


__all__ = ["parse_positions", "resolve_positions"]
