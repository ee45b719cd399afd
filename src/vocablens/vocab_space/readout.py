"""Reading residual-space vectors in vocabulary space: the readout matrix, the input embedding, chunks.

The readout is :meth:`vocablens.models.unembed.Unembedding.readout` with the logit scale folded in
(``scaled=True``) and, optionally, the final norm's gain (``fold_norm_gain``): row t of the readout R
[V, d_model] gives ``R[t]·u`` = the logit a residual-space vector u adds to token t, up to the final
norm's per-position scale (Dar et al. 2022 §3; Geva et al. 2022 §2). Nothing here re-derives the head.
"""

from __future__ import annotations

from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.files.pages import release_pages
from vocablens.ops.topk import merge_topk, topk_lowest_id

_CHUNK_ELEMS = 1 << 24  # at most 16M float32 scores (64 MiB) per chunk
#: the same budget in bytes, for the chunked ops (:func:`vocablens.ops.token_logprobs`)
CHUNK_BYTES = 4 * _CHUNK_ELEMS


def rows_per_chunk(V: int, rows: int | None = None) -> int:
    """Vectors scored per chunk: ``rows``, or as many as keep one [rows, V] float32 chunk within 64 MiB."""
    return max(1, rows or _CHUNK_ELEMS // max(V, 1))


#: bytes of one float32 block of readout (or embedding) rows when the vocabulary is streamed
BLOCK_BYTES = 8 * 2**20


def readout(borders: Borders, apply_norm_gain: bool = True) -> torch.Tensor:
    """The readout of the real vocabulary, [real V, d_model] float32 on the head's device.

    ``logit_scale · W_U · P_out`` (``P_out`` = OPT's ``project_out``, when present), each column times
    the final norm's gain g when ``apply_norm_gain``; ``u @ readout().T`` scores u [n, d_model] against
    every real token (logits per unit of u, before any softcap). A float32 copy of the whole head
    (4·V·d bytes): the analyses here stream it instead (:func:`readout_rows`, :func:`vocab_blocks`).
    """
    return borders.unembedding.readout_rows(slice(0, borders.real_vocab_size), apply_norm_gain, scaled=True)


def readout_rows(borders: Borders, rows: slice | Sequence[int], apply_norm_gain: bool = True) -> torch.Tensor:
    """Some rows of :func:`readout`, [n, d_model] float32: a slice (read from a view of W_U) or token
    ids (gathered). The same values as the whole matrix's rows bit for bit (the same elementwise
    float32 operations per row; with ``project_out``, up to its GEMM's rounding)."""
    return borders.unembedding.readout_rows(rows, apply_norm_gain, scaled=True)


def input_embedding(borders: Borders, ids: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Token embeddings as they enter the residual stream (input scale, input norm, ``project_in``; no
    positions), [V or n, d_model] float32; ``ids`` a tensor of ids or a slice of rows (a view, no
    gather): :meth:`Embedding.rows <vocablens.models.embed.Embedding.rows>` of ``borders.input_embedding``."""
    return borders.input_embedding.rows(ids, torch.float32)


def vocab_blocks(V: int, width: int, block_bytes: int | None = None) -> list[tuple[int, int]]:
    """Contiguous row ranges ``[(start, stop), ...]`` covering 0..V, each a float32 [rows, width] block
    of about ``block_bytes`` (default :data:`BLOCK_BYTES`, 8 MiB: 3,640 rows of width 576)."""
    n = max(1, int(block_bytes or BLOCK_BYTES) // (4 * max(int(width), 1)))
    return [(a, min(V, a + n)) for a in range(0, V, n)]


def stream_rows(borders: Borders, V: int, kind: str = "value", apply_norm_gain: bool = True):
    """Yield ``(start, stop, rows)`` over the first V rows of the readout (``kind='value'``) or of the
    input embedding (``kind='key'``), one :func:`vocab_blocks` block of float32 rows [stop - start, d] at
    a time: the per-row values of :func:`readout` / :func:`input_embedding`, never the whole matrix.
    Once a block is used, the pages of its checkpoint rows leave the resident set where the command
    allows it (:func:`vocablens.models.files.pages.release_pages`)."""
    d = int(borders.d_model)
    src = (borders.unembedding.weight if kind == "value" else borders.input_embedding.weight).detach()
    for a, b in vocab_blocks(V, d):
        yield a, b, (readout_rows(borders, slice(a, b), apply_norm_gain) if kind == "value"
                     else input_embedding(borders, slice(a, b)))
        release_pages(src[a:b])


class TopBottom:
    """The k largest and k smallest scores of n rows, merged over blocks of columns (vocabulary ids).

    :meth:`add` takes the scores [n, stop - start] of columns start..stop-1; :meth:`result` returns
    ``(top ids, top values, bottom ids, bottom values)``, each [n, k], values in torch.topk's order
    (descending top, ascending bottom) and, among equal values, the lowest id first
    (:func:`vocablens.ops.topk.topk_lowest_id`, :func:`~vocablens.ops.topk.merge_topk`), so the result
    does not depend on the blocks.
    """

    def __init__(self, k: int) -> None:
        self.k = int(k)
        self.top: tuple[torch.Tensor, torch.Tensor] | None = None
        self.bot: tuple[torch.Tensor, torch.Tensor] | None = None

    def add(self, scores: torch.Tensor, start: int) -> None:
        kk = min(self.k, scores.shape[1])
        tv, ti = topk_lowest_id(scores, kk)
        bv, bi = topk_lowest_id(-scores, kk)  # negation is exact: the bottom as a top
        ti, bi = ti + start, bi + start
        self.top = (tv, ti) if self.top is None else merge_topk(*self.top, tv, ti, self.k)
        self.bot = (bv, bi) if self.bot is None else merge_topk(*self.bot, bv, bi, self.k)

    def result(self):
        assert self.top is not None and self.bot is not None, "no block added"
        return self.top[1], self.top[0], self.bot[1], -self.bot[0]


def top_bottom(scores: torch.Tensor, k: int):
    """``(top ids, top values, bottom ids, bottom values)`` of scores [n, V] along V, k each (see
    :class:`TopBottom`: lowest id first among equal values)."""
    tb = TopBottom(k)
    tb.add(scores, 0)
    return tb.result()


def check_k(k: int, V: int) -> None:
    """Raise :class:`BadInput` unless 1 <= k <= V (k an int)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise BadInput(f"`k` must be an integer between 1 and the vocabulary size {V}; got {k!r}")


def check_block(borders: Borders, block: int) -> None:
    """Raise :class:`BadInput` unless ``block`` is a block index 0..L-1 (:meth:`Borders.check_block`)."""
    borders.check_block(block)


def check_token(borders: Borders, token_id: int) -> int:
    """``token_id`` as an int, or :class:`BadInput` when it is outside the real vocabulary."""
    real = borders.real_vocab_size
    if not 0 <= int(token_id) < real:
        raise BadInput(f"token id {token_id} is outside the vocabulary 0..{real - 1}")
    return int(token_id)
