"""Every lens on the same held-out tokens: logit, tuned and Jacobian lens per layer (one pass, one table).

Belrose et al. (2023, §4) score a lens per layer by KL to the model's final distribution, cross-entropy
against the next token and top-1 agreement; Gurnee et al. (2026) compare the Jacobian lens with the
logit and tuned lens the same way. Here any set of translators (None = the logit lens, a
:class:`~vocablens.lens.tuned.TunedLens`, a :class:`~vocablens.lens.jacobian.JacobianLens`) reads the
same residual streams of the same rows: one forward per row, and all lenses' layers < L go through one
:func:`vocablens.ops.kl_readout` call (one LM-head GEMM per (lens, layer, token), nothing else over V);
layer L is read off the model's own logits, identical for every lens. A Jacobian lens without a
matrix for some layer (a published lens has none for stream layer 0) scores NaN there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.ops.kl import kl_readout, logits_readout

METRICS = ("kl", "ce", "bpb", "entropy", "top1_agreement")


@dataclass(frozen=True)
class LensComparison:
    """Per-layer quality of several lenses on the same held-out tokens (layers 0..L).

    Attributes:
        n_layers: L.
        kinds: the lenses, in order (``logit``, ``tuned``, ``jacobian`` ...).
        tokens: positions scored for KL / entropy / agreement; ce_tokens: those with a next token.
        n_bytes: UTF-8 bytes of the predicted text (bits per byte), or 0 when unknown.
        metrics: ``metrics[kind][metric]`` = [L+1] floats (float64 means): ``kl`` KL(final ‖ lens) and
            ``ce`` cross-entropy to the next token (nats), ``bpb`` the CE in bits per byte (NaN when
            n_bytes is 0), ``entropy`` (nats), ``top1_agreement`` (fraction). NaN where a lens has no
            translator for the layer.
    """

    n_layers: int
    kinds: list[str]
    tokens: int
    ce_tokens: int
    n_bytes: int
    metrics: dict[str, dict[str, list[float]]]

    def mean_kl(self, kind: str) -> float:
        """Mean KL over the layers 0..L-1 the lens reads (nats)."""
        xs = [x for x in self.metrics[kind]["kl"][: self.n_layers] if not math.isnan(x)]
        return sum(xs) / len(xs) if xs else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready: ``{"n_layers", "kinds", "tokens", "ce_tokens", "n_bytes", "mean_kl": {kind: nats},
        "layers": [{"layer", kind: {"kl", "ce", "bpb", "entropy", "top1_agreement"}}]}``."""
        layers = [{"layer": i, **{k: {m: self.metrics[k][m][i] for m in METRICS} for k in self.kinds}}
                  for i in range(self.n_layers + 1)]
        return {"n_layers": self.n_layers, "kinds": list(self.kinds), "tokens": self.tokens,
                "ce_tokens": self.ce_tokens, "n_bytes": self.n_bytes,
                "mean_kl": {k: self.mean_kl(k) for k in self.kinds}, "layers": layers}


def _reads(lens, L: int) -> list[int]:
    """Layers 0..L-1 a translator reads (all for the logit and tuned lens)."""
    if lens is None or not hasattr(lens, "has"):
        return list(range(L))
    return [ly for ly in range(L) if lens.has(ly)]


def compare_lenses(borders: Borders, lenses: dict, rows: torch.Tensor, n_bytes: int = 0,
                   chunk_rows: int | None = None, on_row: Callable[[int, int], None] | None = None) -> LensComparison:
    """Score every lens of ``lenses`` at every layer on the same held-out rows (float32 throughout).

    Args:
        borders: the model.
        lenses: ``{kind: translator or None}`` in display order (None = the logit lens); each lens is
            checked against the model.
        rows: [N, T] int64 held-out token chunks (T >= 2).
        n_bytes: UTF-8 bytes of the text predicted (positions 1..T-1 of each row), for bits per byte.
        chunk_rows: (layer, token) rows per LM-head GEMM (default: :func:`vocablens.ops.kl_readout`'s).
        on_row: ``on_row(done, total)`` after each row (progress).

    Returns:
        :class:`LensComparison`. Cost per token: one forward plus 2·V·d FLOPs per (lens, layer < L).

    Raises:
        BadInput: no lens, empty rows. CheckpointMismatch: a lens of another model.
    """
    if not lenses:
        raise BadInput("compare_lenses needs at least one lens")
    if rows.dim() != 2 or rows.numel() == 0 or rows.shape[1] < 2:
        raise BadInput(f"evaluation needs token rows [N >= 1, T >= 2]; got {list(rows.shape)}")
    for ln in lenses.values():
        if ln is not None and hasattr(ln, "check_model"):
            ln.check_model(borders)
    U = borders.unembedding.float32()
    W = U.weight.detach().float()
    L = borders.n_layers
    dev = W.device
    kinds = list(lenses)
    reads = {k: _reads(lenses[k], L) for k in kinds}
    offsets, n = {}, 0
    for k in kinds:
        offsets[k] = n
        n += len(reads[k])
    sums = torch.zeros(n + 1, 4, dtype=torch.float64, device=dev)  # [every (lens, layer) read, layer L] x [KL, CE, H, top1]
    real = borders.real_vocab_size
    n_tok = n_ce = 0
    with torch.no_grad():
        for r in range(rows.shape[0]):
            ids = rows[r: r + 1]
            T = ids.shape[1]
            resid, logits = borders.residual_stream(ids)
            H = resid[:, 0].float()  # [L+1, T, d]
            states = _translated(lenses, reads, H, L)
            _add_row_sums(U, W, ids, logits[0], states, real, chunk_rows, sums)
            n_tok += T
            n_ce += T - 1
            if on_row is not None:
                on_row(r + 1, int(rows.shape[0]))
    sums = sums.cpu()  # cpu: the sums, once
    return _comparison(sums, kinds, reads, offsets, L, n_tok, n_ce, n_bytes)


def _translated(lenses: dict, reads: dict[str, list[int]], H: torch.Tensor, L: int) -> list[torch.Tensor]:
    """Each lens's states [len(reads[kind]), T, d] at the layers it reads, in ``lenses``' order (the
    logit lens: the stream itself; lenses that read no layer: nothing)."""
    states = []
    for k, ln in lenses.items():
        ly = reads[k]
        if not ly:
            continue
        if ln is None:
            states.append(H[ly])
        else:
            states.append(torch.stack([ln.translate(x, H[x]) for x in ly]) if not hasattr(ln, "translate_all")
                          else ln.translate_all(H[:L])[ly])
    return states


def _add_row_sums(U, W: torch.Tensor, ids: torch.Tensor, ref: torch.Tensor, states: list[torch.Tensor], real: int,
                  chunk_rows: int | None, sums: torch.Tensor) -> None:
    """Add one row's KL, CE, entropy and top-1 agreement into ``sums`` [n + 1, 4] float64: rows 0..n-1
    the (lens, layer) states read through the head, row n the model's own logits ``ref`` [T, V]."""
    n = sums.shape[0] - 1
    T = ids.shape[1]
    dev = W.device
    final_top = ref[:, :real].argmax(-1)
    targets = torch.zeros(T, dtype=torch.long, device=dev)
    targets[:-1] = ids[0, 1:]
    valid = torch.ones(T, dtype=torch.float64, device=dev)
    valid[-1] = 0
    stats = dict(targets=targets, top_k=1, topk_cols=real, entropy=True)
    parts = [(slice(n, n + 1), logits_readout(ref, ref, **stats))]  # layer L: the model's own logits
    if states:
        X = U.normed(torch.cat(states), torch.float32)
        parts.append((slice(0, n), kl_readout(X, W, ref, chunk_rows=chunk_rows, **stats, **U.head_kwargs())))
    for sl, res in parts:
        sums[sl, 0] += res.kl.double().sum(-1)
        sums[sl, 1] += (-res.target_logprob.double() * valid).sum(-1)
        sums[sl, 2] += res.entropy.double().sum(-1)
        sums[sl, 3] += (res.topk_ids[..., 0] == final_top).double().sum(-1)


def _comparison(sums: torch.Tensor, kinds: list[str], reads: dict[str, list[int]], offsets: dict[str, int], L: int,
                n_tok: int, n_ce: int, n_bytes: int) -> LensComparison:
    """Per-lens, per-layer means of the sums (NaN at layers a lens does not read), bits per byte when
    ``n_bytes`` is known."""
    n = sums.shape[0] - 1
    to_bpb = (n_ce / n_bytes / math.log(2)) if n_bytes else float("nan")
    denom = (n_tok, n_ce, n_tok, n_tok)
    final = [float(sums[n, j]) / denom[j] for j in range(4)]
    metrics: dict[str, dict[str, list[float]]] = {}
    for k in kinds:
        per = {m: [float("nan")] * (L + 1) for m in ("kl", "ce", "entropy", "top1_agreement")}
        for i, ly in enumerate(reads[k]):
            row = sums[offsets[k] + i]
            per["kl"][ly], per["ce"][ly] = float(row[0]) / n_tok, float(row[1]) / n_ce
            per["entropy"][ly], per["top1_agreement"][ly] = float(row[2]) / n_tok, float(row[3]) / n_tok
        per["kl"][L], per["ce"][L], per["entropy"][L], per["top1_agreement"][L] = 0.0, final[1], final[2], 1.0
        per["bpb"] = [x * to_bpb for x in per["ce"]]
        metrics[k] = per
    return LensComparison(n_layers=L, kinds=kinds, tokens=n_tok, ce_tokens=n_ce, n_bytes=int(n_bytes), metrics=metrics)


__all__ = ["METRICS", "LensComparison", "compare_lenses"]
