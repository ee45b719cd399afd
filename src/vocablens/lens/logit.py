"""The logit lens: decode the residual stream at every layer through final norm + LM head.

nostalgebraist (2020, "interpreting GPT: the logit lens") reads each layer's residual stream with the
model's own unembedding. Here layer 0 is the input of block 0 and layer L the last block's output
before the final norm, so the layer-L row is the model's own output distribution (the final norm is
applied exactly once). A *translator* (the tuned lens, Belrose et al. 2023, §3) can be plugged in:
any object with ``translate(layer, h [P, d]) -> h' [P, d]``; layer L is never translated.

Only one layer's [P, V] distribution is held at a time; all math is float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders


class Translator(Protocol):
    """A per-layer map applied to the residual stream before unembedding (tuned lens)."""

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class LensLayer:
    """One layer read through a lens, at P positions.

    Attributes:
        layer: residual-stream index 0..L.
        top_ids: [P, k] int64, most probable tokens.
        top_probs: [P, k] float32.
        entropy: [P] float32, nats.
        kl_to_final: [P] float32, KL(final ‖ this layer) in nats (0 at layer L).
        final_top1_rank: [P] int64, rank (0 = top) of the final layer's top-1 token here.
        final_top1_prob: [P] float32, probability of the final layer's top-1 token here.
    """

    layer: int
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    kl_to_final: torch.Tensor
    final_top1_rank: torch.Tensor
    final_top1_prob: torch.Tensor


@dataclass(frozen=True)
class LensResult:
    """A lens over all layers 0..L at chosen positions of one prompt.

    Attributes:
        kind: ``logit`` or ``tuned``.
        input_ids: [T] int64, the prompt.
        positions: [P] int64, the positions read.
        layers: one :class:`LensLayer` per layer asked for, in increasing order (all L+1 by default,
            then index = layer).
        final_top1: [P] int64, the model's own top-1 at each position.
        model_max_abs_diff: max |p_lens(L) - p_model| over the positions read (should be ~0).
        n_layers: L, the model's number of blocks.
    """

    kind: str
    input_ids: torch.Tensor
    positions: torch.Tensor
    layers: list[LensLayer]
    final_top1: torch.Tensor
    model_max_abs_diff: float
    n_layers: int = 0


def resolve_positions(T: int, positions: str | int | Sequence[int] | None) -> torch.Tensor:
    """``None``/``"last"`` -> [T-1]; ``"all"`` -> 0..T-1; ints (negative from the end) -> checked.

    Raises:
        BadInput: a position outside [-T, T).
    """
    if positions is None or positions == "last":
        return torch.tensor([T - 1])
    if positions == "all":
        return torch.arange(T)
    if isinstance(positions, int):
        positions = [positions]
    out = []
    for p in positions:
        p = int(p)
        if not -T <= p < T:
            raise BadInput(f"position {p} is outside the prompt's {T} tokens")
        out.append(p % T)
    return torch.tensor(out, dtype=torch.long)


def layer_logprobs(borders: Borders, h: torch.Tensor, layer: int,
                   translator: Translator | None = None) -> torch.Tensor:
    """Residual stream at one layer [P, d_model] -> log-probabilities [P, V] float32.

    The translator (if any) is applied to layers < L only.
    """
    if translator is not None and layer < borders.n_layers:
        h = translator.translate(layer, h.float()).to(h.dtype)
    logits = borders.unembed(h)
    return torch.log_softmax(logits.float(), dim=-1)


def logit_lens(borders: Borders, input_ids: torch.Tensor, positions="last", k: int = 5,
               translator: Translator | None = None, kind: str | None = None,
               layers: Sequence[int] | None = None) -> LensResult:
    """Read the residual stream of one prompt through the lens at every layer.

    Args:
        borders: the model's :class:`Borders`.
        input_ids: [T] or [1, T] int64.
        positions: ``"last"`` (default), ``"all"``, or a list of positions.
        k: number of top tokens per layer and position (1..V).
        translator: optional per-layer map (tuned lens); None = logit lens.
        layers: subset of layers to report (default all 0..L); layer L is always computed.

    Returns:
        :class:`LensResult`; its layer-L entry (when reported) equals the model's own distribution.

    Raises:
        BadInput: empty prompt, k out of range, a layer outside 0..L, a bad position.
    """
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise BadInput(f"logit_lens reads one prompt; got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    T = int(input_ids.numel())
    if T == 0:
        raise BadInput("empty prompt: give some text")
    V = borders.vocab_size
    if not 1 <= k <= V:
        raise BadInput(f"-k must be between 1 and V={V}; got {k}")
    L = borders.n_layers
    wanted = list(range(L + 1)) if layers is None else sorted(set(int(x) for x in layers))
    bad = [x for x in wanted if not 0 <= x <= L]
    if bad:
        raise BadInput(f"layer {bad[0]} is outside 0..{L}")
    pos = resolve_positions(T, positions)
    real = borders.real_vocab_size
    with torch.no_grad():
        resid, model_logits = borders.residual_stream(input_ids[None])
        resid = resid[:, 0, pos]  # [L+1, P, d]
        model_lp = torch.log_softmax(model_logits[0, pos].float(), dim=-1)
        final_lp = layer_logprobs(borders, resid[L], L)
        diff = float((final_lp.exp() - model_lp.exp()).abs().max())
        final_p = final_lp.exp()
        final_top1 = final_lp[:, :real].argmax(dim=-1)
        out: list[LensLayer] = []
        for layer in range(L + 1):
            if layer not in wanted:
                continue
            lp = final_lp if layer == L else layer_logprobs(borders, resid[layer], layer, translator)
            p = lp.exp()
            top = torch.topk(lp[:, :real], k, dim=-1)
            ent = -(p * lp).nan_to_num().sum(-1)
            kl = (final_p * (final_lp - lp)).nan_to_num().sum(-1).clamp_min(0.0)
            tgt = lp.gather(1, final_top1[:, None])
            rank = (lp[:, :real] > tgt).sum(-1)
            out.append(LensLayer(layer=layer, top_ids=top.indices, top_probs=top.values.exp(),
                                 entropy=ent, kl_to_final=kl, final_top1_rank=rank,
                                 final_top1_prob=tgt[:, 0].exp()))
    return LensResult(kind=kind or ("logit" if translator is None else "tuned"),
                      input_ids=input_ids.detach().cpu(), positions=pos, layers=out,
                      final_top1=final_top1, model_max_abs_diff=diff, n_layers=L)


def lens_to_dict(result: LensResult, tokenizer=None) -> dict:
    """Plain JSON-ready data: ``{"layers": [{"layer", "top_tokens", "top_probs", "entropy",
    "kl_to_final", ...}]}``; with one position, per-layer values are scalars/lists for it."""
    from vocablens.models.tokens import token_str

    def tok(i):
        return token_str(tokenizer, i) if tokenizer is not None else str(int(i))

    P = len(result.positions)
    layers = []
    for ly in result.layers:
        rows = []
        for j in range(P):
            rows.append({
                "position": int(result.positions[j]),
                "top_tokens": [tok(i) for i in ly.top_ids[j].tolist()],
                "top_ids": ly.top_ids[j].tolist(),
                "top_probs": [round(float(x), 6) for x in ly.top_probs[j]],
                "entropy": float(ly.entropy[j]),
                "kl_to_final": float(ly.kl_to_final[j]),
                "final_top1_rank": int(ly.final_top1_rank[j]),
                "final_top1_prob": float(ly.final_top1_prob[j]),
            })
        entry = {"layer": ly.layer}
        if P == 1:
            entry.update(rows[0])
        else:
            entry["positions"] = rows
        layers.append(entry)
    return {
        "kind": result.kind,
        "tokens": [tok(i) for i in result.input_ids.tolist()],
        "positions": result.positions.tolist(),
        "final_top1": [tok(i) for i in result.final_top1.tolist()],
        "model_max_abs_diff": result.model_max_abs_diff,
        "n_layers": result.n_layers,
        "layers": layers,
    }
