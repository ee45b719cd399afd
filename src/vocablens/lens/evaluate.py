"""Evaluating a tuned lens against the logit lens on held-out text (Belrose et al. 2023, §4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from vocablens.ops.vocab_parallel.comm import allreduce_sum, share, world
from vocablens.errors import BadInput
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders


@dataclass(frozen=True)
class LensEval:
    """Per-layer quality of the logit lens and the tuned lens on held-out text (layers 0..L).

    All arrays are [L+1] float64 means over the counted positions; layer L is the model itself
    (KL 0, agreement 1) for both lenses.

    Attributes:
        n_layers: L.
        tokens: positions scored for KL / entropy / agreement.
        ce_tokens: positions scored for CE (those with a next token).
        n_bytes: UTF-8 bytes of the predicted text (for bits per byte), or 0 when unknown.
        logit_kl, tuned_kl: KL(final ‖ lens), nats.
        logit_ce, tuned_ce: cross-entropy against the actual next token, nats.
        logit_bpb, tuned_bpb: the same in bits per byte (nan when n_bytes is 0).
        logit_entropy, tuned_entropy: entropy of the lens distribution, nats.
        logit_top1, tuned_top1: fraction of positions whose top-1 equals the final layer's.
    """

    n_layers: int
    tokens: int
    ce_tokens: int
    n_bytes: int
    logit_kl: list[float]
    tuned_kl: list[float]
    logit_ce: list[float]
    tuned_ce: list[float]
    logit_bpb: list[float]
    tuned_bpb: list[float]
    logit_entropy: list[float]
    tuned_entropy: list[float]
    logit_top1: list[float]
    tuned_top1: list[float]

    def to_dict(self) -> dict:
        """JSON-ready: ``{"n_layers", "tokens", ..., "layers": [{"layer", "logit": {...}, "tuned": {...}}]}``."""
        layers = []
        for i in range(self.n_layers + 1):
            layers.append({"layer": i,
                           "logit": {"kl": self.logit_kl[i], "ce": self.logit_ce[i], "bpb": self.logit_bpb[i],
                                     "entropy": self.logit_entropy[i], "top1_agreement": self.logit_top1[i]},
                           "tuned": {"kl": self.tuned_kl[i], "ce": self.tuned_ce[i], "bpb": self.tuned_bpb[i],
                                     "entropy": self.tuned_entropy[i], "top1_agreement": self.tuned_top1[i]}})
        return {"n_layers": self.n_layers, "tokens": self.tokens, "ce_tokens": self.ce_tokens,
                "n_bytes": self.n_bytes,
                "tuned_below_logit_every_layer": all(self.tuned_kl[i] < self.logit_kl[i] for i in range(self.n_layers)),
                "layers": layers}


#: readouts per row (each a group of the 2L lens-layer rows): the progress steps within a row
READ_GROUPS = 4


def evaluate(borders: Borders, lens: TunedLens, rows: torch.Tensor, n_bytes: int = 0,
             chunk_rows: int | None = None, real_vocab_only: bool = True,
             on_row: Callable[[int, int], None] | None = None, split_ranks: bool = True) -> LensEval:
    """Score the logit lens and the tuned lens at every layer on held-out chunks (float32 throughout).

    Belrose et al. (2023, §4, Fig. 3 and 4): KL to the final distribution, cross-entropy, and
    agreement per layer. Each row is one forward pass; both lenses read the same residual stream,
    and all their layers go through one :func:`vocablens.ops.kl_readout` call per row: one LM-head
    GEMM per (lens, layer < L, token), nothing else over V; layer L is read off the model's own
    logits (:func:`vocablens.ops.logits_readout`). Cost per token: one forward plus 2L·2·V·d FLOPs.

    Args:
        borders: the model.
        lens: the tuned lens (checked against the model).
        rows: [N, T] int64 held-out token chunks.
        n_bytes: UTF-8 bytes of the text predicted (the tokens at positions 1..T-1 of each row), for
            bits per byte; 0 = unknown.
        chunk_rows: (layer, token) rows per LM-head GEMM (default: a 96 MiB float32 buffer, :data:`vocablens.ops.kl.READOUT_CHUNK_BYTES`).
        real_vocab_only: top-1 agreement over real tokens only (padding rows excluded).
        on_row: called as ``on_row(done, total)`` after each readout of :data:`READ_GROUPS` per row
            (progress in rows, fractional within a row; this rank's rows): a first estimate of the
            time left comes after a part of the first row.
        split_ranks: under an initialised process group of W > 1 ranks (torchrun), each rank scores its
            contiguous share of the rows (:func:`vocablens.ops.vocab_parallel.comm.share`) and the float64 sums and
            counts are all-reduced: every rank returns the one-process result up to float rounding.
            False: every rank scores all rows (always so for a tensor-parallel load, whose ranks
            run every forward together and split the head's rows instead).

    Returns:
        :class:`LensEval`.

    Raises:
        BadInput: empty rows.
        CheckpointMismatch: the lens belongs to another model.
    """
    if rows.dim() != 2 or rows.numel() == 0 or rows.shape[1] < 2:
        raise BadInput(f"evaluation needs token rows [N >= 1, T >= 2]; got {list(rows.shape)}")
    from vocablens.lens.readout_path import TensorParallel, readout_path

    lens.check_model(borders)
    path = readout_path(borders)  # tensor parallel: every rank reads every row, V split over the ranks
    split_ranks = split_ranks and not isinstance(path, TensorParallel)
    U = path.U
    L = borders.n_layers
    dev = U.weight.device
    # [logit 0..L-1, tuned 0..L-1, layer L] x [KL, CE, H, top1]
    sums = torch.zeros(2 * L + 1, 4, dtype=torch.float64, device=dev)
    n_tok = n_ce = 0
    real = borders.real_vocab_size if real_vocab_only else borders.vocab_size
    if split_ranks:
        start, stop = share(rows.shape[0])
        rows = rows[start:stop]
    with torch.no_grad():
        for r in range(rows.shape[0]):
            def progress(done: float, r=r) -> None:
                if on_row is not None:
                    on_row(r + done, int(rows.shape[0]))
            T = _score_row(borders, lens, path, rows[r: r + 1], real, chunk_rows, sums, progress)
            n_tok += T
            n_ce += T - 1
    if split_ranks and world()[1] > 1:
        sums = allreduce_sum(sums)
        n_tok, n_ce = (int(x) for x in allreduce_sum(torch.tensor([n_tok, n_ce], dtype=torch.float64)))
    sums = sums.cpu()  # cpu: the sums, once, after the last row (and the all-reduce)
    return _from_sums(sums, L, n_tok, n_ce, n_bytes)


def _score_row(borders: Borders, lens: TunedLens, path, ids: torch.Tensor, real: int,
               chunk_rows: int | None, sums: torch.Tensor, progress: Callable[[float], None]) -> int:
    """Add one row's sums (KL, CE, entropy, top-1 agreement) into ``sums`` [2L+1, 4] float64 (rows:
    logit lens at layers 0..L-1, tuned lens at 0..L-1, layer L): one forward, the model's own logits
    for layer L, the 2L lens rows in :data:`READ_GROUPS` readouts with ``progress(fraction of the
    row)`` after each. ``ids`` [1, T]; ``path``: :func:`~vocablens.lens.readout_path.readout_path`;
    returns T."""
    L, U = borders.n_layers, path.U
    dev = U.weight.device
    T = ids.shape[1]
    resid, logits = path.stream(ids)
    H = resid[:, 0].float()  # [L+1, T, d]
    ref = logits[0]  # [T, V] the model's own output (tensor parallel: this rank's [T, V_r])
    final_top = path.argmax(ref, real)
    targets = torch.zeros(T, dtype=torch.long, device=dev)
    targets[:-1] = ids[0, 1:]
    valid = torch.ones(T, dtype=torch.float64, device=dev)
    valid[-1] = 0
    X = U.normed(torch.cat([H[:L], lens.translate_all(H[:L])]), torch.float32)
    stats = dict(targets=targets, top_k=1, topk_cols=real, entropy=True)
    fin = path.final(ref, **stats)  # layer L: the model's own logits, no GEMM
    parts = [(2 * L, lambda: fin)]
    # the 2L (lens, layer) rows in READ_GROUPS readouts: progress after each, not only per row
    step = -(-2 * L // READ_GROUPS)
    parts += [(slice(a, min(2 * L, a + step)), lambda a=a: path.kl(
        X[a:a + step], ref, float32=True, chunk_rows=chunk_rows, **stats, **U.head_kwargs())) for a in range(0, 2 * L, step)]
    for rows_, read in parts:
        r_ = read()
        sums[rows_, 0] += r_.kl.double().sum(-1)
        sums[rows_, 1] += (-r_.target_logprob.double() * valid).sum(-1)
        sums[rows_, 2] += r_.entropy.double().sum(-1)
        sums[rows_, 3] += (r_.topk_ids[..., 0] == final_top).double().sum(-1)
        if isinstance(rows_, slice):
            progress(rows_.stop / (2 * L))
    return T


def _from_sums(sums: torch.Tensor, L: int, n_tok: int, n_ce: int, n_bytes: int) -> LensEval:
    """The per-layer means of :func:`_score_row`'s sums [2L+1, 4] over n_tok tokens (n_ce predicted
    ones for the cross-entropy), and bits per byte when ``n_bytes`` is known."""
    def col(j: int, tuned: bool, denom: int, final_value: float) -> list[float]:
        part = sums[L: 2 * L, j] if tuned else sums[:L, j]
        return [float(x) / denom for x in part] + [final_value]

    final_ce = float(sums[2 * L, 1]) / n_ce
    final_ent = float(sums[2 * L, 2]) / n_tok
    to_bpb = (n_ce / n_bytes / math.log(2)) if n_bytes else float("nan")

    def bpb(ce: list[float]) -> list[float]:
        return [x * to_bpb for x in ce]

    logit_ce, tuned_ce = col(1, False, n_ce, final_ce), col(1, True, n_ce, final_ce)
    return LensEval(
        n_layers=L, tokens=n_tok, ce_tokens=n_ce, n_bytes=int(n_bytes),
        logit_kl=col(0, False, n_tok, 0.0), tuned_kl=col(0, True, n_tok, 0.0),
        logit_ce=logit_ce, tuned_ce=tuned_ce, logit_bpb=bpb(logit_ce), tuned_bpb=bpb(tuned_ce),
        logit_entropy=col(2, False, n_tok, final_ent), tuned_entropy=col(2, True, n_tok, final_ent),
        logit_top1=col(3, False, n_tok, 1.0), tuned_top1=col(3, True, n_tok, 1.0),
    )


def text_bytes(tokenizer, rows: torch.Tensor) -> int:
    """UTF-8 bytes of the text the rows' positions 1..T-1 spell (special tokens skipped)."""
    total = 0
    for r in rows:
        total += len(tokenizer.decode(r[1:].tolist(), skip_special_tokens=True).encode("utf-8"))
    return total


__all__ = ["LensEval", "evaluate", "text_bytes"]
