"""Under-training beside the argmax geometry: "never trained" is not "cannot win".

A row inside the convex hull of the head's rows can never be the top prediction whatever its
training (Demeter et al. 2020; ``vocablens argmax``); an under-trained row may well be a hull vertex.
:func:`argmax_verdicts` reads an argmax scan's verdicts (a :class:`~vocablens.argmax.model.ModelArgmax`,
an :class:`~vocablens.argmax.result.ArgmaxResult`, or the dict that ``vocablens argmax --json``
prints); :func:`overlap` counts the two sets against each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput

#: the verdict of a row when no argmax scan is at hand
NO_SCAN = "no scan"
#: verdicts of rows that can never be the strict top prediction
CANNOT_WIN = ("unargmaxable", "duplicate")


def argmax_verdicts(scan, vocab_size: int) -> list[str]:
    """Verdict name per row [V] from an argmax scan.

    Args:
        scan: a ``ModelArgmax`` / ``ArgmaxResult``, or the ``vocablens argmax --json`` dict (its
            ``per_token`` when present; else ``unargmaxable``, ``undecided``, ``duplicates`` and the
            ``reserved`` group's flagged lists, every other real row ``argmaxable``, rows beyond the
            scan's ``padding_rows`` ``padding``).
        vocab_size: V of the model the verdicts are shown beside.

    Raises:
        BadInput: the scan is of another vocabulary size, or the dict is not an argmax result.
    """
    res = getattr(scan, "result", scan)
    if hasattr(res, "verdict") and not isinstance(res, dict):
        from vocablens.argmax.result import VERDICTS

        v = res.verdict
        if int(v.numel()) != vocab_size:
            raise BadInput(f"the argmax scan has {int(v.numel())} rows, the model {vocab_size}")
        return [VERDICTS[int(x)] for x in v.tolist()]
    if not isinstance(scan, dict) or "counts" not in scan or "vocab_size" not in scan:
        raise BadInput("not an argmax result: expected the JSON of `vocablens argmax --json`")
    if int(scan["vocab_size"]) != vocab_size:
        raise BadInput(f"the argmax scan is of a vocabulary of {scan['vocab_size']} rows, the model has {vocab_size}")
    per = scan.get("per_token")
    if per and "verdict" in per:
        names = per["verdict_names"]
        return [names[int(x)] for x in per["verdict"]]
    out = ["argmaxable"] * vocab_size
    n_pad = int(scan.get("padding_rows") or 0)
    for i in range(vocab_size - n_pad, vocab_size):
        out[i] = "padding"
    for g in scan.get("duplicates") or []:
        for i in g.get("ids", [])[1:]:  # the first of a group of identical rows stands for it
            out[int(i)] = "duplicate"
    groups = [scan, scan.get("reserved") or {}]
    for g in groups:
        for verdict in ("unargmaxable", "undecided"):
            for item in g.get(verdict) or []:
                out[int(item["id"])] = verdict
    return out


@dataclass(frozen=True)
class Overlap:
    """Verified under-trained tokens against tokens that cannot win (argmax).

    Attributes:
        verified: verified under-trained tokens. cannot_win: tokens the scan found unargmaxable or exact duplicates (:data:`CANNOT_WIN`).
        both: in both sets. verified_but_argmaxable: verified under-trained yet able to win.
        cannot_win_but_trained: cannot win, tested and repeated (p >= 0.01).
        cannot_win_not_tested: cannot win and not among the candidates.
        ids_both: the ids in both sets.
    """

    verified: int
    cannot_win: int
    both: int
    verified_but_argmaxable: int
    cannot_win_but_trained: int
    cannot_win_not_tested: int
    ids_both: tuple[int, ...]


def overlap(result, verdicts: list[str]) -> Overlap:
    """Count verified under-trained tokens (``result``, an
    :class:`~vocablens.undertrained.analysis.UndertrainedResult`) against the argmax verdicts."""
    ver = set(result.verified.tolist())
    tested = set(result.candidates.tolist())
    cw = {i for i, v in enumerate(verdicts) if v in CANNOT_WIN}
    both = ver & cw
    return Overlap(verified=len(ver), cannot_win=len(cw), both=len(both),
                   verified_but_argmaxable=sum(1 for i in ver if verdicts[i] == "argmaxable"),
                   cannot_win_but_trained=len((cw & tested) - ver), cannot_win_not_tested=len(cw - tested),
                   ids_both=tuple(sorted(both)))


def verdict_tensor(verdicts: list[str] | None, ids: torch.Tensor) -> list[str]:
    """The verdict of each id of ``ids``, :data:`NO_SCAN` without a scan."""
    if verdicts is None:
        return [NO_SCAN] * int(ids.numel())
    return [verdicts[int(i)] for i in ids.tolist()]


__all__ = ["NO_SCAN", "Overlap", "argmax_verdicts", "overlap", "verdict_tensor"]
