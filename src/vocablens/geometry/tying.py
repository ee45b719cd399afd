"""Tied embeddings, checked by storage and by value (layer 3).

Press & Wolf (2016, "Using the Output Embedding to Improve Language Models") and Inan et al. (2016)
tie the LM head to the embedding: W_U = W_E. A config flag says what the model *should* do; only the
storage says what it does. :func:`tie_check` reports both, and for untied models how far apart the
two matrices are. A config that ties with a checkpoint that stores a different head is untied (as
transformers loads it; the rule is in :mod:`vocablens.models.files.tie`): ``consistent`` is then False.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.models import Borders


@dataclass(frozen=True)
class TieCheck:
    """Whether the LM head shares the embedding.

    Attributes:
        tied: W_U and W_E share storage (the same data pointer and shape).
        config_says_tied: ``config.tie_word_embeddings`` (None when the config has no such flag).
        consistent: storage and config agree (a mismatch means a loader un-tied or tied silently).
        max_abs_diff: max |W_U - W_E| (0.0 when tied), float.
        mean_row_cosine: mean over real tokens of cos(W_U[i], W_E[i]) (1.0 when tied).
        saved_params: parameters tying saves (V·d when tied, else 0).
    """

    tied: bool
    config_says_tied: bool | None
    consistent: bool
    max_abs_diff: float
    mean_row_cosine: float
    saved_params: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def tie_check(borders: Borders, chunk: int = 8192) -> TieCheck:
    """Check tying by storage and by value; rows beyond the tokenizer are left out of the cosine.

    Cost: one pass over both [V, d] matrices in chunks of ``chunk`` rows (float32).

    Returns:
        :class:`TieCheck`; ``saved_params`` is V·d_emb when tied, else 0.
    """
    cfg = borders.config
    flag = getattr(cfg, "tie_word_embeddings", None) if cfg is not None else None
    WE, WU = borders.input_embedding.weight, borders.unembedding.weight
    real = borders.real_vocab_size
    if borders.tied:
        diff, cos = 0.0, 1.0
    else:
        diff, cos_sum = 0.0, 0.0
        with torch.no_grad():
            for s in range(0, real, chunk):
                a = WE[s:s + chunk].float()
                b = WU[s:s + chunk].float()
                diff = max(diff, float((a - b).abs().max()))
                cos_sum += float(torch.nn.functional.cosine_similarity(a, b, dim=1).sum())
        cos = cos_sum / max(real, 1)
    return TieCheck(
        tied=borders.tied,
        config_says_tied=None if flag is None else bool(flag),
        consistent=flag is None or bool(flag) == borders.tied,
        max_abs_diff=diff,
        mean_row_cosine=cos,
        saved_params=borders.vocab_size * borders.d_emb if borders.tied else 0,
    )
