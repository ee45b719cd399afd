"""``trim --drop-undertrained``: trim away the verified under-trained tokens along with the unused ones.

The tokens ``vocablens undertrained`` verifies (the model, prompted to repeat one, gives it below
0.01) are taken out of the ids to keep before the trim is planned (:func:`drop_undertrained`). The
plan's closure may still need some of them (a base byte, a part of a kept token's merge, a special
or config id): those stay, and are reported as kept anyway. A corpus document that holds a dropped
token is spelled with other tokens by the trimmed tokenizer (the merge that made it is gone; the
text is the same): such documents are counted and left out of the equality check, which runs on
the documents that hold none (:func:`documents_with`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class UndertrainedDrop:
    """What ``--drop-undertrained`` removed.

    Attributes:
        candidates: lowest-indicator tokens prompted. verified: those verified under-trained.
        seeds_dropped: verified ids that were to be kept (used by the corpus or the token list).
        dropped: verified ids the trimmed vocabulary does not hold (whether used or not).
        kept_anyway: verified ids the trim keeps all the same (bytes, merge parts, specials, config ids).
        rows_dropped: rows removed because of the flag (the plan without it keeps them: the dropped
            used tokens and the merge parts only they needed).
        documents_respelled: corpus documents holding a dropped token (left out of the check).
        indicator: the indicator used; seconds: the verification's wall time.
    """

    candidates: int
    verified: tuple[int, ...]
    seeds_dropped: tuple[int, ...]
    dropped: tuple[int, ...]
    kept_anyway: tuple[int, ...]
    rows_dropped: int
    documents_respelled: int
    indicator: str
    seconds: float

    def to_dict(self) -> dict:
        return {"candidates": self.candidates, "n_verified": len(self.verified), "verified_ids": list(self.verified),
                "used_and_dropped": len(self.seeds_dropped), "dropped_ids": list(self.dropped),
                "kept_anyway_ids": list(self.kept_anyway), "rows_dropped": self.rows_dropped,
                "documents_respelled": self.documents_respelled, "indicator": self.indicator,
                "verification_s": round(self.seconds, 3)}


def verified_undertrained(borders, tokenizer, candidates: int, progress=None):
    """:func:`vocablens.undertrained` with ``candidates`` verified: the result (its ``verified``
    int64 [k] are the ids to drop)."""
    from vocablens.undertrained import undertrained

    return undertrained(borders, tokenizer, candidates=candidates, progress=progress)


def planned_keep(model, tokenizer, used: Iterable[int]) -> list[int]:
    """The old ids :func:`~vocablens.surgery.trim.trim_vocab` keeps for ``used`` (its plan alone, no
    matrices touched): used ids, config ids, added tokens, the alphabet and the merge closure."""
    from vocablens.surgery.bpe_plan import backend_json, plan_bpe_trim
    from vocablens.surgery.trim import config_ids

    n = len(tokenizer)
    keep = {int(i) for i in used} | {i for i in config_ids(model.config) if i < n}
    keep |= {i for i in config_ids(getattr(model, "generation_config", None)) if i < n}
    return plan_bpe_trim(backend_json(tokenizer), keep)[0]


def drop_undertrained(model, tokenizer, used: set[int], verified: Sequence[int]) -> tuple[set[int], set[int]]:
    """``(seeds, rows_without)``: the ids to keep once the verified ones are taken out of ``used``,
    and the rows the trim would keep without the flag (to count what the flag removed)."""
    ver = {int(i) for i in verified}
    return used - ver, set(planned_keep(model, tokenizer, used))


def documents_with(tokenizer, texts: Sequence[str], ids: Iterable[int]) -> list[bool]:
    """For each text: whether the (old) tokenizer's encoding holds one of ``ids``."""
    bad = {int(i) for i in ids}
    out: list[bool] = []
    for a in range(0, len(texts), 64):
        for enc in tokenizer(list(texts[a:a + 64]), add_special_tokens=False).input_ids:
            out.append(bool(bad.intersection(enc)))
    return out


def check_documents(tokenizer, texts: Sequence[str], gone: Iterable[int]) -> tuple[list[str], int]:
    """``(clean, respelled)``: the documents holding none of the dropped ids ``gone`` (the trim is
    checked on them) and how many hold one.

    Raises:
        BadInput: there are documents and every one holds a dropped token (nothing left to check on).
    """
    from vocablens.errors import BadInput

    holds = documents_with(tokenizer, texts, gone)
    clean = [t for t, h in zip(texts, holds) if not h]
    if texts and not clean:
        raise BadInput(f"every one of the {len(texts)} corpus documents holds a verified under-trained token: "
                       "nothing is left to check the trim on (verify fewer with `undertrained_candidates`, or "
                       "give a larger corpus); nothing written")
    return clean, sum(holds)


def summarize(res, used: set[int], kept: Sequence[int], rows_without: set[int], respelled: int) -> UndertrainedDrop:
    """The :class:`UndertrainedDrop` of a trim planned with the verified ids of ``res`` (an
    ``UndertrainedResult``) taken out of ``used``; ``kept`` the trim's kept old ids."""
    ver = [int(i) for i in res.verified.tolist()]
    k = set(int(i) for i in kept)
    v = res.verification
    return UndertrainedDrop(
        candidates=int(res.candidates.numel()), verified=tuple(ver),
        seeds_dropped=tuple(i for i in ver if i in used), dropped=tuple(i for i in ver if i not in k),
        kept_anyway=tuple(i for i in ver if i in k), rows_dropped=len(rows_without - k),
        documents_respelled=int(respelled), indicator=res.indicators.name,
        seconds=0.0 if v is None else float(v.seconds))


__all__ = ["UndertrainedDrop", "verified_undertrained", "planned_keep", "drop_undertrained", "documents_with",
           "check_documents", "summarize"]
