"""One model over several processes: transformers' tensor parallel (``from_pretrained(..., tp_plan="auto")``).

``vocablens.load(spec, tp=True)`` under ``torchrun`` loads the model with the family's own
tensor-parallel plan (``config.base_model_tp_plan``): each rank holds 1/N of every block's
projections, and the plan's embedding and LM head are split by vocabulary rows (parameters become
``torch.distributed.tensor.DTensor``). Between blocks the residual stream is whole on every rank
(the row-parallel outputs are all-reduced), so the lens reads it as in one process; the head is
read vocab-parallel (:mod:`vocablens.parallel.tensor`). This module decides what may load this way
(one line naming why not) and checks the readout of the loaded model against its own logits.

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

    ``kind`` is :func:`~vocablens.models.spec.resolve_spec`'s (``gguf``, ``dir``, ``hub``)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return ("--tp splits one model over the processes torchrun starts: run it as "
                "`torchrun --nproc-per-node N -m vocablens ... --tp` (WORLD_SIZE is 1 here)")
    if kind == "gguf":
        return ("--tp loads through transformers' tensor-parallel plan; a .gguf file is dequantized into one "
                "process first: convert it to a model directory, or run without --tp")
    if read is not None or max_memory not in (None, ""):
        return "--tp loads the whole model split over the ranks; it does not read parts or stream blocks (--max-memory)"
    if device_map not in (None, ""):
        return "--tp and --device-map are two ways of placing one model: give one of them"
    return None


def plan_refusal(config) -> str | None:
    """Why ``config``'s family cannot load tensor-parallel (it ships no plan), in one line, or None."""
    cfg = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    if getattr(cfg, "base_model_tp_plan", None):
        return None
    return (f"--tp: the {getattr(cfg, 'model_type', '?')} family has no tensor-parallel plan in transformers "
            "(config.base_model_tp_plan is empty); run it without --tp (one process, or --device-map)")


@torch.no_grad()
def check_tp_readout(borders, spec: str) -> str:
    """The readout check of a tensor-parallel load (:func:`vocablens.models.readout.find_readout`'s
    for one process): the model's own logits of a probe of a few tokens against the vocab-parallel
    readout of its last block's output (this rank's rows of W_U, the softmax normalised across
    ranks), max |Δp| over the vocabulary reduced across ranks. Returns the provenance line.

    Raises:
        UnsupportedArchitecture: max |Δp| beyond :func:`~vocablens.models.readout.tolerance`.
    """
    from vocablens.models.find import named_children
    from vocablens.models.readout import ReadoutCheck, probe_ids, tolerance
    from vocablens.ops.vocab_parallel.comm import all_reduce
    from vocablens.ops.vocab_parallel.losses import vocab_parallel_log_softmax
    import torch.distributed as dist

    ids = probe_ids(borders)
    with borders.capture() as store:
        out = borders.model(input_ids=ids.to(borders.device), use_cache=False)
    start, W = local_rows(borders.W_U)
    _, b = local_rows(borders.b_U) if borders.b_U is not None else (0, None)
    U = borders.unembedding
    z = torch.nn.functional.linear(U.normed(store[borders.n_layers]).to(W.dtype), W, b).float()
    mine = vocab_parallel_log_softmax(U.transform(z), None).exp()
    theirs = torch.softmax(out.logits.float(), -1)[..., start:start + W.shape[0]]  # a probe: [1, 4, V] gathered
    dp = float(all_reduce((mine - theirs).abs().amax().reshape(1), dist.ReduceOp.MAX))
    tol = tolerance(W.dtype)
    if not dp <= tol:
        raise UnsupportedArchitecture(borders.family, named_children(borders.model),
                                      f"under --tp, vocablens's readout differs from the model's own logits: "
                                      f"max |Δp| = {dp:.2e} (tolerance {tol:.0e})")
    return ReadoutCheck(max_dp=dp, tolerance=tol, dtype=str(W.dtype).replace("torch.", ""),
                        tokens=int(ids.shape[-1]), final_norm=None, project_out=None,
                        logit_scale=float(borders.logit_scale), softcap=borders.softcap,
                        family=borders.family).line() + f", tensor parallel over {dist.get_world_size()} ranks"


__all__ = ["check_tp_readout", "is_dtensor", "local", "rows_any", "sum_sharded", "tp_device", "is_tensor_parallel", "local_rows", "plan_refusal", "tp_refusal",
           "whole"]
