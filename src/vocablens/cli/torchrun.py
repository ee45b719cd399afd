"""The command line under torchrun: which commands split over ranks, this process's rank, and leaving
the process group at the end of a command."""

from __future__ import annotations

import os
import sys

#: commands that split their work over torchrun ranks (the others run on rank 0 alone)
DISTRIBUTED = {("argmax",), ("lens", "eval"), ("lens", "train"), ("lens", "fit-jacobian"), ("settle",), ("score",), ("generate",)}


def torchrun_rank() -> int | None:
    """This process's rank under torchrun (``WORLD_SIZE`` > 1), else None."""
    try:
        return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    except ValueError:
        return None


def leave_process_group(ok: bool) -> None:
    """Tear down the torch.distributed group a command joined (the CLI owns the whole process here).

    A process that exits with its gloo group still up can abort at interpreter shutdown ("terminate
    called without an active exception", SIGABRT; pytorch/pytorch#179291), and torchrun then reports
    a failure for a command that succeeded. After a command that ended well on every rank, a barrier
    first, so no rank closes its pairs while another still uses them; after an error, no barrier (the
    other ranks may be gone, and torchrun stops them)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if ok:
        dist.barrier()
    dist.destroy_process_group()


#: commands that run tensor-parallel with ``--tp`` (every rank runs them; the head is read vocab-parallel)
TENSOR_PARALLEL = {("lens", "show"), ("lens", "eval"), ("score",), ("generate",)}
#: ``lens`` subcommands (``lens PROMPT`` is ``lens show PROMPT``)
LENS_COMMANDS = {"show", "train", "eval", "anomaly", "fit-jacobian", "backward"}


def tp_refusal(words: list[str], argv: list[str]) -> str | None:
    """One line refusing ``--tp`` on a command that does not run tensor-parallel (``words``: its first
    one or two words), or on ``lens eval`` with lenses other than the logit and tuned ones; None when
    it runs (or no ``--tp`` was given)."""
    if "--tp" not in argv or not words:
        return None
    cmd = ("lens", "show") if words[0] == "lens" and (len(words) < 2 or words[1] not in LENS_COMMANDS) \
        else tuple(words[:2]) if words[0] == "lens" else (words[0],)
    if cmd not in TENSOR_PARALLEL:
        return (f"`vocablens {' '.join(cmd)}` does not run tensor-parallel (--tp): it reads the whole matrices or "
                "trains through the model in one process; tensor-parallel commands: lens, lens eval, score, generate")
    kinds = argv[argv.index("--kind") + 1] if cmd == ("lens", "eval") and "--kind" in argv[:-1] else "logit,tuned"
    if sorted(k.strip() for k in kinds.split(",")) not in (["logit", "tuned"], ["both"]):
        return "--tp: lens eval scores the logit and tuned lenses (the default --kind) tensor-parallel; run other kinds without --tp"
    if torchrun_rank() is None:  # before anything loads: the loader's own line
        from vocablens.models.tensor_parallel import tp_refusal as load_refusal

        return load_refusal("dir", None, None)
    return None


def group_device(tp: bool, device: str) -> str:
    """The device whose backend the torchrun process group runs (gloo for ``cpu``, NCCL for CUDA):
    with ``--tp`` where transformers puts the shards (:func:`vocablens.models.tensor_parallel.tp_device`),
    else ``device``."""
    if not tp:
        return device
    from vocablens.models.tensor_parallel import tp_device

    return tp_device()


def splits_over_ranks(words: list[str]) -> bool:
    """Whether the command named by ``words`` (its first one or two words) splits over ranks."""
    return (words[0],) in DISTRIBUTED or tuple(words[:2]) in DISTRIBUTED
