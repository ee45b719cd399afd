"""Where predictions settle over a corpus, and what an early exit would save (Geva et al. 2022 §5.2).

For each position of a corpus, the first stream layer from which the lens's top-1 equals the model's
final top-1 and stays equal; its distribution; and an early exit that stops at the first layer whose
lens top-1 probability reaches a threshold (Geva et al. reported ~20% of layers saved): the fraction of
blocks saved, the net fraction of FLOPs saved once the lens's own cost at every checked layer is paid,
and the agreement with the full model kept. Any :class:`~vocablens.lens.logit.Translator` (a tuned
lens) can be used instead of the plain logit lens. Layers count the residual stream: 0 = the embedding
output, L = the last block's output. The lens is read through ``borders.unembedding`` and
:func:`vocablens.ops.token_logprobs` (chunked over V; the top-1 and its log-probability only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from vocablens.ops.vocab_parallel.comm import allreduce_sum, gather_columns, share, world
from vocablens.errors import BadInput
from vocablens.models.flops import block_flops
from vocablens.models.blocks_forward import blocks_forward
from vocablens.lens.logit import Translator, lens_kind
from vocablens.models import Borders
from vocablens.ops import token_logprobs
from vocablens.vocab_space.readout import CHUNK_BYTES

#: default early-exit confidence thresholds (lens top-1 probability)
DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class ExitPoint:
    """An early exit at one confidence threshold.

    Attributes:
        threshold: exit at the first layer whose lens top-1 probability is >= this.
        mean_exit_layer: mean stream layer at which positions exit (L = never exited early).
        saved_block_fraction: mean (L - exit layer) / L, the share of blocks skipped.
        saved_flops_fraction: FLOPs saved net of the lens run at every checked layer m..e:
            ``1 - mean(e·F_block + (e-m+1)·F_head) / (L·F_block + F_head)``; negative when checking costs
            more than the blocks skipped (a large vocabulary and a narrow model).
        agreement: fraction of positions whose exit top-1 equals the full model's top-1.
    """

    threshold: float
    mean_exit_layer: float
    saved_block_fraction: float
    saved_flops_fraction: float
    agreement: float


@dataclass(frozen=True)
class SettleResult:
    """Where predictions settle over a corpus (see :func:`settle`).

    Attributes:
        kind: the lens computed (:func:`~vocablens.lens.kinds.lens_kind`): ``logit``, ``tuned``, ...
        n_positions: positions read; n_layers: L.
        settle_layer: [N] int64, the first stream layer from which the lens top-1 equals the final top-1
            at every later layer (L when only the model's own output has it).
        histogram: [L+1] int64 counts of ``settle_layer``.
        settled_fraction: [L+1] float32, fraction of positions settled at or before each layer.
        top1_agreement: [L+1] float32, fraction of positions whose lens top-1 at a layer equals the final.
        exits: one :class:`ExitPoint` per threshold.
        min_layer: m, the first layer where exits were checked.
        block_flops: forward FLOPs of one block for one token (2 per multiply-add, weights plus attention
            over the mean context); head_flops: FLOPs of one lens read (2·V·d).
    """

    kind: str
    n_positions: int
    n_layers: int
    settle_layer: torch.Tensor
    histogram: torch.Tensor
    settled_fraction: torch.Tensor
    top1_agreement: torch.Tensor
    exits: list[ExitPoint]
    block_flops: float
    head_flops: float
    thresholds: tuple[float, ...] = field(default=DEFAULT_THRESHOLDS)
    min_layer: int = 0


def _lens_top1(U, h: torch.Tensor, layer: int, L: int, real: int, translator: Translator | None,
               chunk_rows: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lens's top-1 among the real tokens [P] int64 and its probability [P] float32, for the stream
    at one layer h [P, d_model] (the translator, if any, applies to layers < L)."""
    if translator is not None and layer < L:
        h = translator.translate(layer, h.float()).to(h.dtype)
    pad = U.vocab_size - real  # top-k over the padding rows too; the first real id is the top-1
    tl = token_logprobs(U.normed(h), U.weight, top_k=min(U.vocab_size, 1 + pad), chunk_tokens=chunk_rows,
                        chunk_bytes=CHUNK_BYTES, **U.head_kwargs())
    ids, lps = tl.topk_ids, tl.topk_logprobs
    if pad:
        first = (ids < real).int().argmax(1, keepdim=True)
        ids, lps = ids.gather(1, first), lps.gather(1, first)
    return ids[:, 0], lps[:, 0].exp()


def _read_batches(borders: Borders, batches, translator, chunk_rows, on_tokens):
    """The lens's top-1 and its probability at every stream layer of every position read:
    ``(top1 [L+1, N] int64, conf [L+1, N] float32, Σ over positions of the context length, N)``."""
    L = borders.n_layers
    real = borders.real_vocab_size
    U = borders.unembedding
    top1s, confs = [], []
    ctx_sum, n_tok = 0.0, 0
    with torch.no_grad():
        for ids in batches:
            if ids.numel() == 0:
                continue
            resid = blocks_forward(borders, ids, all_layers=True)  # [L+1, B, T, d]: no LM head in the forward
            B, T = ids.shape
            ctx_sum += B * T * (T + 1) / 2
            n_tok += B * T
            h = resid.reshape(L + 1, B * T, -1)
            t1 = torch.empty(L + 1, B * T, dtype=torch.long, device=h.device)
            cf = torch.empty(L + 1, B * T, device=h.device)
            for layer in range(L + 1):
                t1[layer], cf[layer] = _lens_top1(U, h[layer], layer, L, real, translator, chunk_rows)
                if on_tokens is not None:
                    on_tokens(n_tok - B * T + B * T * (layer + 1) / (L + 1))
            top1s.append(t1)
            confs.append(cf)
    top1 = torch.cat(top1s, 1) if top1s else torch.zeros(L + 1, 0, dtype=torch.long)  # [L+1, N]
    conf = torch.cat(confs, 1) if confs else torch.zeros(L + 1, 0)
    return top1, conf, ctx_sum, n_tok


def _exit_point(top1: torch.Tensor, conf: torch.Tensor, t: float, m: int, F_block: float,
                F_head: float) -> ExitPoint:
    """Exit at the first layer >= m whose lens confidence reaches ``t`` (else the last, L): its mean
    layer, the blocks and FLOPs saved (a lens read per layer checked) and the agreement with the model."""
    L = top1.shape[0] - 1
    base = L * F_block + F_head
    hit = conf >= t
    hit[:m] = False
    hit[L] = True
    e = hit.int().argmax(0)  # first layer reaching the threshold
    chosen = top1.gather(0, e[None])[0]
    ef = e.float()
    cost = ef * F_block + (ef - m + 1) * F_head
    # one host transfer per threshold (float64 on the host, as float() of each gave)
    mean_e, saved_b, saved_f, agree_t = torch.stack([
        ef.mean(), ((L - ef) / L).mean(), 1 - cost.mean() / base, (chosen == top1[L]).float().mean()]).tolist()
    return ExitPoint(threshold=t, mean_exit_layer=mean_e, saved_block_fraction=saved_b,
                     saved_flops_fraction=saved_f, agreement=agree_t)


def settle(borders: Borders, batches: Iterable[torch.Tensor] | torch.Tensor,
           thresholds: Sequence[float] = DEFAULT_THRESHOLDS, translator: Translator | None = None,
           kind: str | None = None, chunk_rows: int | None = None, min_layer: int = 0,
           split_ranks: bool = True, on_tokens: Callable[[float], None] | None = None) -> SettleResult:
    """Settling layers and early exits over a corpus (Geva et al. 2022 §5.2, with any lens).

    Args:
        borders: the model's borders.
        batches: token rows [N, T] int64 (or an iterable of [B, T] batches), e.g. from
            :func:`vocablens.corpus.pack_tokens`; every position of every row is read.
        thresholds: early-exit confidences in (0, 1].
        translator: a :class:`~vocablens.lens.logit.Translator` (tuned lens) or None (logit lens).
        kind: the result's ``kind``; default (and the only value accepted) the lens computed
            (:func:`vocablens.lens.logit.lens_kind`).
        chunk_rows: positions decoded at once (default: 64 MiB of logits).
        min_layer: the first stream layer where an exit is checked (0 = the embedding itself; with tied
            embeddings the logit lens there confidently predicts the input token, a poor exit).
        split_ranks: under an initialised process group of W > 1 ranks (torchrun), each rank reads its
            contiguous share of the batches (:func:`vocablens.ops.vocab_parallel.comm.share`); the per-position
            top-1s and confidences are gathered back in row order and the token counts summed, so
            every rank returns the one-process result. False: every rank reads every batch.
        on_tokens: progress, called as ``on_tokens(tokens read)`` after each layer of each batch (this
            rank's tokens; fractional within a batch), so the first estimate of the time left comes
            after one layer, not after the first batch.

    Returns:
        :class:`SettleResult`. Memory: one batch's residual stream plus one chunk of [c, V] logits.

    Raises:
        BadInput: no tokens, a threshold outside (0, 1], min_layer outside 0..L, a ``kind`` that
            does not name the lens computed.
    """
    kind = lens_kind(translator, kind)
    if not 0 <= int(min_layer) <= borders.n_layers:
        raise BadInput(f"min_layer must be in 0..{borders.n_layers}; got {min_layer}")
    m = int(min_layer)
    ths = tuple(float(t) for t in thresholds)
    if not ths or any(not 0 < t <= 1 for t in ths):
        raise BadInput(f"thresholds must be in (0, 1]; got {list(thresholds)}")
    if isinstance(batches, torch.Tensor):
        batches = [batches if batches.dim() == 2 else batches[None]]
    parallel = split_ranks and world()[1] > 1
    if parallel:
        batches = list(batches)
        start, stop = share(len(batches))
        batches = batches[start:stop]
    L = borders.n_layers
    real = borders.real_vocab_size
    top1, conf, ctx_sum, n_tok = _read_batches(borders, batches, translator, chunk_rows, on_tokens)
    if parallel:  # back in row order on every rank: the rest is the one-process computation
        top1, conf = gather_columns(top1), gather_columns(conf)
        ctx_sum, n_tok = (x.item() for x in allreduce_sum(torch.tensor([ctx_sum, n_tok], dtype=torch.float64)))
        n_tok = int(n_tok)
    if n_tok == 0:
        raise BadInput("no tokens to read: the corpus is empty")
    agree = top1 == top1[L]  # [L+1, N]
    stays = agree.flip(0).int().cumprod(0).flip(0)  # 1 where this and every later layer agree
    settle_layer = (L + 1) - stays.sum(0)
    hist = torch.bincount(settle_layer, minlength=L + 1)
    N = top1.shape[1]
    F_block = block_flops(borders, ctx_sum / n_tok)
    F_head = 2.0 * real * borders.d_emb
    exits = [_exit_point(top1, conf, t, m, F_block, F_head) for t in ths]
    return SettleResult(kind=kind, n_positions=N, n_layers=L,
                        min_layer=m,
                        settle_layer=settle_layer, histogram=hist,
                        settled_fraction=(hist.cumsum(0).float() / N), top1_agreement=agree.float().mean(1),
                        exits=exits, block_flops=F_block, head_flops=F_head, thresholds=ths)
