"""One model over several processes: transformers' tensor parallel (``from_pretrained(..., tp_plan="auto")``).

``vocablens.load(spec, tp=True)`` under ``torchrun`` loads the model with the family's own
tensor-parallel plan (``config.base_model_tp_plan``): each rank holds 1/N of every block's
projections, and the plan's embedding and LM head are split by vocabulary rows (parameters become
``torch.distributed.tensor.DTensor``). Between blocks the residual stream is whole on every rank
(the row-parallel outputs are all-reduced), so the lens reads it as in one process; the head is
read vocab-parallel (:mod:`vocablens.lens.readout_path`). This module decides what may load this way
(one line naming why not) and holds the helpers that read a split tensor (this rank's part, the
whole); the readout check on load is :func:`vocablens.models.readout.find_readout`'s, its probe's
few logits gathered (:func:`gathered_linear`).

Rules every caller keeps (nnsight's tensor-parallel notes say the same): every rank runs the same
calls in the same order (a rank that skips one deadlocks the others), with the same seed.
"""

from __future__ import annotations

import os

import torch

from vocablens.errors import BadInput, UnsupportedArchitecture


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor (a parameter of a tensor-parallel load)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(t, DTensor)


def is_tensor_parallel(borders) -> bool:
    """Whether ``borders``' model was loaded with a tensor-parallel plan (its LM head is a DTensor)."""
    return is_dtensor(getattr(borders.lm_head, "weight", None))


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or the whole tensor of a DTensor (``full_tensor()``: a collective every rank runs)."""
    return t.full_tensor() if is_dtensor(t) else t


def local_rows(t: torch.Tensor) -> tuple[int, torch.Tensor]:
    """``(first global row, this rank's rows)`` of a matrix split by rows (``Shard(0)``), or ``(0, t)``.

    Raises:
        UnsupportedArchitecture: a DTensor split otherwise (the head must be split by vocabulary rows).
    """
    if not is_dtensor(t):
        return 0, t
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    pl = t.placements
    if len(pl) == 1 and isinstance(pl[0], Replicate):
        return 0, t.to_local()
    if len(pl) != 1 or not isinstance(pl[0], Shard) or pl[0].dim != 0:
        raise UnsupportedArchitecture("tensor parallel", [str(p) for p in pl],
                                      "the plan splits the LM head otherwise than by vocabulary rows")
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, pl)
    return int(offset[0]), t.to_local()


def gathered_linear(h: torch.Tensor, W, b=None) -> torch.Tensor:
    """``h [..., d] @ W.T (+ b)`` for W [V, d] split by rows over the ranks: each rank's [..., V_r]
    gathered into the whole [..., V] on every rank (for a few rows: the readout check's probe, an ad
    hoc read; the analyses read the head vocab-parallel instead, never gathering [T, V])."""
    from torch.distributed.tensor import DTensor, Replicate

    hd = DTensor.from_local(h, W.device_mesh, [Replicate()], run_check=False)
    return torch.nn.functional.linear(hd, W, b).full_tensor()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (``to_local()``), or ``t`` itself."""
    return t.to_local() if is_dtensor(t) else t


def sum_sharded(values: list[int], sharded: list[bool]) -> list[int]:
    """Per-tensor counts taken on this rank's parts, made whole: the entries of sharded tensors summed
    over the ranks (one all-reduce), the others (replicated: the same on every rank) kept."""
    import torch.distributed as dist

    t = torch.tensor([v if s else 0 for v, s in zip(values, sharded)], dtype=torch.float64)
    dist.all_reduce(t)
    return [int(x) if s else v for x, v, s in zip(t.tolist(), values, sharded)]


def rows_any(rows: torch.Tensor, start: int, V: int) -> torch.Tensor:
    """Bool [V] from this rank's bool rows [V_r] starting at global row ``start``: True where any rank
    marked the row (one all-reduce)."""
    import torch.distributed as dist

    t = torch.zeros(V, dtype=torch.float32)
    t[start:start + rows.shape[0]] = rows.float()
    dist.all_reduce(t)
    return t > 0


def tp_device() -> str:
    """Where transformers puts a tensor-parallel load's shards: ``cuda`` (``cuda:LOCAL_RANK``) when
    CUDA is available, else ``cpu`` (the process group then runs NCCL or gloo)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def tp_refusal(kind: str, read, max_memory, device_map=None) -> str | None:
    """Why a ``tp=True`` load cannot run here, in one line, or None.

    ``kind`` is :func:`~vocablens.models.files.spec.resolve_spec`'s (``gguf``, ``dir``, ``hub``)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return ("`tp` splits one model over the processes torchrun starts: run it as "
                "`torchrun --nproc-per-node N -m vocablens ... --tp` (WORLD_SIZE is 1 here)")
    if kind == "gguf":
        return ("`tp` loads through transformers' tensor-parallel plan; a .gguf file is dequantized into one "
                "process first: convert it to a model directory, or run without `tp`")
    if read is not None or max_memory not in (None, ""):
        return "`tp` loads the whole model split over the ranks; it does not read parts or stream blocks (`max_memory`)"
    if device_map not in (None, ""):
        return "`tp` and `device_map` are two ways of placing one model: give one of them"
    return None


def plan_refusal(config) -> str | None:
    """Why ``config``'s family cannot load tensor-parallel (it ships no plan), in one line, or None."""
    cfg = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    if getattr(cfg, "base_model_tp_plan", None):
        return None
    return (f"`tp`: the {getattr(cfg, 'model_type', '?')} family has no tensor-parallel plan in transformers "
            "(config.base_model_tp_plan is empty); run it without `tp` (one process, or `device_map`)")


def check_split(borders) -> None:
    """Refuse a tensor-parallel load whose plan split none of the blocks' weights (plan entries
    that name no module of this model): it would run replicated on every rank.

    Raises:
        UnsupportedArchitecture: no block parameter is split.
    """
    if not any(is_dtensor(p) and local(p).numel() < p.numel() for p in borders.blocks.parameters()):
        from vocablens.models.find import named_children

        raise UnsupportedArchitecture(borders.family, named_children(borders.model),
                                      "`tp`: the family's tensor-parallel plan splits none of the blocks' weights "
                                      "(its entries name no module here): it would run replicated on every rank")


def world_size() -> int:
    """Processes in the default torch.distributed group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


__all__ = ["check_split", "gathered_linear", "is_dtensor", "local", "rows_any", "sum_sharded", "tp_device", "is_tensor_parallel", "local_rows", "plan_refusal", "tp_refusal",
           "whole", "world_size"]
