"""Reading residual-space vectors in vocabulary space: the readout matrix, the input embedding, chunks.

The readout is :meth:`vocablens.models.unembed.Unembedding.readout` with the logit scale folded in
(``scaled=True``) and, optionally, the final norm's gain (``fold_norm_gain``): row t of the readout R
[V, d_model] gives ``R[t]·u`` = the logit a residual-space vector u adds to token t, up to the final
norm's per-position scale (Dar et al. 2022 §3; Geva et al. 2022 §2). Nothing here re-derives the head.
"""

from __future__ import annotations

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import linear_weight

_CHUNK_ELEMS = 1 << 24  # at most 16M float32 scores (64 MiB) per chunk
#: the same budget in bytes, for the chunked ops (:func:`vocablens.ops.token_logprobs`)
CHUNK_BYTES = 4 * _CHUNK_ELEMS


def rows_per_chunk(V: int, rows: int | None = None) -> int:
    """Vectors scored per chunk: ``rows``, or as many as keep one [rows, V] float32 chunk within 64 MiB."""
    return max(1, rows or _CHUNK_ELEMS // max(V, 1))


def readout(borders: Borders, apply_norm_gain: bool = True) -> torch.Tensor:
    """The readout of the real vocabulary, [real V, d_model] float32 on the head's device.

    ``logit_scale · W_U · P_out`` (``P_out`` = OPT's ``project_out``, when present), each column times
    the final norm's gain g when ``apply_norm_gain``; ``u @ readout().T`` scores u [n, d_model] against
    every real token (logits per unit of u, before any softcap).
    """
    R = borders.unembedding.readout(fold_norm_gain=apply_norm_gain, scaled=True)
    return R[: borders.real_vocab_size]


def input_embedding(borders: Borders, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Token embeddings as they enter the residual stream (input scale, ``project_in``; no positions),
    [V or n, d_model] float32."""
    W = borders.W_E.detach() if ids is None else borders.W_E.detach()[ids]
    E = W.float() * borders.embed_scale
    if borders.project_in is not None:
        E = E @ linear_weight(borders.project_in).detach().float().t()
    return E


def top_bottom(scores: torch.Tensor, k: int):
    """``(top ids, top values, bottom ids, bottom values)`` of scores [n, V] along V, k each."""
    top = torch.topk(scores, k, dim=-1)
    bot = torch.topk(scores, k, dim=-1, largest=False)
    return top.indices, top.values, bot.indices, bot.values


def check_k(k: int, V: int) -> None:
    """Raise :class:`BadInput` unless 1 <= k <= V (k an int)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise BadInput(f"-k must be an integer between 1 and the vocabulary size {V}; got {k!r}")


def check_block(borders: Borders, block: int) -> None:
    """Raise :class:`BadInput` unless ``block`` is a block index 0..L-1."""
    L = borders.n_layers
    if not 0 <= int(block) < L:
        raise BadInput(f"block {block} is out of range: this model has blocks 0..{L - 1}")


def check_token(borders: Borders, token_id: int) -> int:
    """``token_id`` as an int, or :class:`BadInput` when it is outside the real vocabulary."""
    real = borders.real_vocab_size
    if not 0 <= int(token_id) < real:
        raise BadInput(f"token id {token_id} is outside the vocabulary 0..{real - 1}")
    return int(token_id)
