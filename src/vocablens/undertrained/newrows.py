"""The under-training indicator of rows that are not in the model yet (``expand``'s new rows).

A new row initialised well should read like a trained token, not like one training never reached.
:func:`new_row_indicators` places each new row on the model's own indicator scale: the same
indicator :mod:`~vocablens.undertrained.analysis` chooses (unembedding cosine distance to the
known-unused mean with the first principal component removed when tied, the input-embedding norm
when untied), measured against the old vocabulary's principal component and reference set, and
ranked among the old testable tokens. A new row at or below the paper's candidate threshold (the
lowest 2% of the old testable tokens) looks under-trained; so does an all-zero row (``--init
zeros``): it has no direction, so the cosine indicator puts it at distance 1 (far from the unused
mean), yet it is exactly an initialisation training never moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput


@dataclass(frozen=True, eq=False)
class NewRowIndicators:
    """The indicator of new rows on an existing model's scale.

    Attributes:
        name: the indicator (``unembedding_cosine`` or ``embedding_norm``); why: why it is used.
        values: float32 [n], the new rows' indicator (low = looks under-trained).
        percentile: float32 [n], share of the old testable tokens with a lower indicator (0..1).
        threshold: the old vocabulary's candidate threshold (indicator of the lowest 2%'s last token).
        looks_undertrained: bool [n], values <= threshold, or the row is all zeros.
        old_median: the old testable tokens' median indicator (a trained token's typical value).
    """

    name: str
    why: str
    values: torch.Tensor
    percentile: torch.Tensor
    threshold: float
    looks_undertrained: torch.Tensor
    old_median: float

    def rows(self) -> list[dict]:
        """One dict per new row: ``value``, ``percentile``, ``looks_undertrained``."""
        return [{"value": float(v), "percentile": float(p), "looks_undertrained": bool(u)}
                for v, p, u in zip(self.values.tolist(), self.percentile.tolist(), self.looks_undertrained.tolist())]

    def to_dict(self) -> dict:
        return {"name": self.name, "why": self.why, "threshold": self.threshold, "old_median": self.old_median}


def new_row_indicators(borders, tokenizer, rows_E: torch.Tensor, rows_U: torch.Tensor | None = None,
                       base=None) -> NewRowIndicators:
    """The indicator of new rows against the model of ``borders`` (the model before the rows were added).

    Args:
        borders: the old model's :class:`~vocablens.models.Borders`; tokenizer: its tokenizer.
        rows_E: [n, d] the new input-embedding rows; rows_U: [n, d] the new head rows (None when tied:
            the same rows).
        base: an ``UndertrainedResult`` of the old model (``verify=False`` is enough); default: computed
            (the tokenizer classes and indicators, O(V·d)).

    Returns:
        :class:`NewRowIndicators`.

    Raises:
        BadInput: rows of the wrong width.
    """
    from vocablens.undertrained.analysis import testable, undertrained
    from vocablens.undertrained.classes import PADDING
    from vocablens.undertrained.indicators import cosine_to_reference, first_principal_component

    d = borders.unembedding.weight.shape[1]
    rows_U = rows_E if rows_U is None else rows_U
    if rows_E.dim() != 2 or rows_E.shape[1] != d or rows_U.shape != rows_E.shape:
        raise BadInput(f"new rows must be [n, {d}]; got {tuple(rows_E.shape)} and {tuple(rows_U.shape)}")
    res = base if base is not None else undertrained(borders, tokenizer, verify=False)
    ind = res.indicators
    if ind.name == "embedding_norm":
        values = rows_E.detach().float().norm(dim=1)
    else:
        W = borders.unembedding.weight.detach()
        usable = res.classes.cls != PADDING
        pc, _ = first_principal_component(W, rows=usable)
        ref = W[ind.reference].float()
        both = torch.cat([ref, rows_U.detach().float().to(ref.device)])
        values = cosine_to_reference(both, torch.arange(ref.shape[0]), pc)[ref.shape[0]:]
    old = ind.values[testable(res.classes)]
    percentile = (old[None, :] < values[:, None]).float().mean(1)
    thr = float(res.indicator_threshold)
    zero = (rows_E.detach().float().abs().amax(1) == 0) | (rows_U.detach().float().abs().amax(1) == 0)
    return NewRowIndicators(name=ind.name, why=ind.why, values=values.float(), percentile=percentile,
                            threshold=thr, looks_undertrained=(values <= thr) | zero.cpu(),
                            old_median=float(old.median()))


__all__ = ["NewRowIndicators", "new_row_indicators"]
