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


def splits_over_ranks(words: list[str]) -> bool:
    """Whether the command named by ``words`` (its first one or two words) splits over ranks."""
    return (words[0],) in DISTRIBUTED or tuple(words[:2]) in DISTRIBUTED
