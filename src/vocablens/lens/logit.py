"""The logit lens: decode the residual stream at every layer through final norm + LM head.

nostalgebraist (2020, "interpreting GPT: the logit lens") reads each layer's residual stream with the
model's own unembedding. Here layer 0 is the input of block 0 and layer L the last block's output
before the final norm, so the layer-L row is the model's own output distribution (the final norm is
applied exactly once). A *translator* (the tuned lens, Belrose et al. 2023, §3) can be plugged in:
any object with ``translate(layer, h [P, d]) -> h' [P, d]``; layer L is never translated.

Layers 0..L-1 are read through one chunked pass (:func:`vocablens.ops.kl_readout`), layer L off the
model's own logits, which the forward pass computed already: no [P, V] log-probabilities and never
[L+1, P, V]; all math is float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.units import plural
from vocablens.ops.rows import row_logprobs


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
        model_max_abs_diff: max_v |p_lens(L) - p_model| at the prompt's last position (should be ~0;
            NaN when that position is not read).
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
            raise BadInput(f"position {p} is outside the prompt's {plural(T, 'token')}")
        out.append(p % T)
    return torch.tensor(out, dtype=torch.long)


def layer_logprobs(borders: Borders, h: torch.Tensor, layer: int,
                   translator: Translator | None = None) -> torch.Tensor:
    """Residual stream at one layer [P, d_model] -> the full log-probabilities [P, V] float32.

    For callers that need every column of a few rows (a test comparing whole distributions); the
    lens never forms [P, V] log-probs (:func:`logit_lens` reads through
    :func:`vocablens.ops.kl_readout`), nor does the explorer (:func:`layer_readout`). The translator
    (if any) is applied to layers < L only.
    """
    if translator is not None and layer < borders.n_layers:
        h = translator.translate(layer, h.float())
    U = borders.unembedding.float32()
    z = U.logits(U.normed(h, torch.float32))
    return row_logprobs(z, inplace=True)


def lens_states(borders: Borders, resid: torch.Tensor, layers: Sequence[int],
                translator: Translator | None = None) -> torch.Tensor:
    """Head inputs of the lens at the given layers: [S, P, d_emb] float32 from resid [L+1, P, d_model].

    The translator (tuned lens) maps layers < L; layer L is read as it is. The final norm (and
    project_out) run in float32 (:meth:`~vocablens.models.unembed.Unembedding.float32`).
    """
    U = borders.unembedding.float32()
    L = borders.n_layers
    hs = [translator.translate(ly, resid[ly].float()) if (translator is not None and ly < L) else resid[ly].float()
          for ly in layers]
    return U.normed(torch.stack(hs), torch.float32)


def layer_readout(borders: Borders, resid: torch.Tensor, layers: Sequence[int], targets: torch.Tensor, k: int = 1,
                  translator: Translator | None = None):
    """Chosen tokens read through the lens at several layers, streamed over V: their log-probability and
    rank, and the top-k, over the real vocabulary (what the explorer's trajectory shows).

    Args:
        borders: the model's :class:`Borders`.
        resid: the residual stream [L+1, P, d_model] (or [L+1, d_model] at one position), indexed by layer.
        layers: the layers read (0..L); the translator (tuned lens) maps those < L, as in :func:`lens_states`.
        targets: int64 [P] (or a scalar for a 2-D ``resid``), the token followed at each position.
        k: top tokens per (layer, position), 1..real vocabulary.

    Returns:
        :class:`vocablens.ops.TokenLogprobs` with tensors [S, P] ([S] for a 2-D ``resid``), S =
        len(layers): ``logprob`` (nats, normalized over all V), ``target_rank`` (real tokens whose
        logit exceeds the target's, the rank ``logit_lens`` reports as ``final_top1_rank``),
        ``topk_ids`` / ``topk_logprobs`` [.., k] over the real tokens. One LM-head pass
        (:func:`vocablens.ops.token_logprobs`); no [S·P, V] log-probabilities.

    Raises:
        BadInput: k or a target outside the real vocabulary, a layer outside 0..L.
    """
    from vocablens.ops import token_logprobs

    one = resid.dim() == 2
    R = resid[:, None] if one else resid
    real, L = borders.real_vocab_size, borders.n_layers
    bad = [int(x) for x in layers if not 0 <= int(x) <= L]
    if bad:
        raise BadInput(f"layer {bad[0]} is outside 0..{L}")
    t = torch.as_tensor(targets, dtype=torch.int64).reshape(-1).to(R.device)
    if t.numel() != R.shape[1] or bool(((t < 0) | (t >= real)).any()):
        raise BadInput(f"targets must be {R.shape[1]} token ids in 0..{real - 1}; got {t.tolist()[:8]}")
    U = borders.unembedding.float32()
    X = lens_states(borders, R, list(layers), translator)  # [S, P, d_emb] float32
    S, P = X.shape[0], X.shape[1]
    r = token_logprobs(X.to(U.weight.dtype), U.weight, t.expand(S, P).contiguous(), top_k=k, topk_cols=real,
                       rank=True, **U.head_kwargs())
    if not one:
        return r
    return type(r)(**{f: None if v is None else v[:, 0] for f, v in vars(r).items()})


def logit_lens(borders: Borders, input_ids: torch.Tensor, positions="last", k: int = 5,
               translator: Translator | None = None, kind: str | None = None,
               layers: Sequence[int] | None = None) -> LensResult:
    """Read the residual stream of one prompt through the lens at every layer.

    One forward pass, then one LM-head GEMM per (layer < L, position) through
    :func:`vocablens.ops.kl_readout`, token-chunked: no [L+1, P, V] tensor and no [P, V]
    log-probabilities exist; the statistics are compared with the model's own logits [P, V]. Layer L
    is read off those logits (:func:`vocablens.ops.logits_readout`); the lens's own path at layer L
    (final norm, LM head) is checked against them at the last position (``model_max_abs_diff``).

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
    from vocablens.ops import kl_readout, logits_readout

    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise BadInput(f"logit_lens reads one prompt; got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    T = int(input_ids.numel())
    if T == 0:
        raise BadInput("empty prompt: give some text")
    V = borders.vocab_size
    real = borders.real_vocab_size
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= real:
        raise BadInput(f"-k must be an integer between 1 and V={real}; got {k!r}")
    L = borders.n_layers
    wanted = list(range(L + 1)) if layers is None else sorted(set(int(x) for x in layers))
    bad = [x for x in wanted if not 0 <= x <= L]
    if bad:
        raise BadInput(f"layer {bad[0]} is outside 0..{L}")
    pos = resolve_positions(T, positions)
    U = borders.unembedding.float32()
    head = U.head_kwargs()
    with torch.no_grad():
        resid, model_logits = borders.residual_stream(input_ids[None])
        every = len(pos) == T and bool((pos == torch.arange(T)).all())
        resid = resid[:, 0] if every else resid[:, 0, pos]  # [L+1, P, d]
        ref = model_logits[0] if every else model_logits[0, pos]  # [P, V] the model's own output (no copy)
        del model_logits
        final_top1 = ref[:, :real].argmax(dim=-1)
        stats = dict(targets=final_top1, rank=True, top_k=k, topk_cols=real, entropy=True, **head)
        early = [ly for ly in wanted if ly < L]
        X_early = lens_states(borders, resid, early, translator) if early else None
        at = (pos == T - 1).nonzero().flatten()
        # the lens path at layer L, read at the prompt's last position only: the check of the reading
        X_check = lens_states(borders, resid[:, at[:1]], [L]) if at.numel() else None
        del resid
        reads = {}
        if early:
            r = kl_readout(X_early, U.weight, ref, **stats)
            reads.update({ly: (r, i) for i, ly in enumerate(early)})
            del X_early
        # layer L is the model's own output: its statistics are read off the model's logits (no GEMM)
        reads[L] = (logits_readout(ref, ref, **{k: v for k, v in stats.items() if k not in head}), slice(None))
        # one number for every caller (CLI, report, server): max |p_lens(L) - p_model| at the prompt's
        # last position, the lens's own path (final norm, LM head) against the model's output
        diff = float("nan") if X_check is None else float(
            kl_readout(X_check, U.weight, ref[at[:1]], max_abs_dp=True, **head).max_abs_dp[0, 0])
        out = [LensLayer(layer=ly, top_ids=r.topk_ids[i], top_probs=r.topk_logprobs[i].exp(),
                         entropy=r.entropy[i], kl_to_final=r.kl[i], final_top1_rank=r.target_rank[i],
                         final_top1_prob=r.target_logprob[i].exp())
               for ly, (r, i) in sorted(reads.items()) if ly in wanted]
    return LensResult(kind=kind or ("logit" if translator is None else "tuned"),
                      input_ids=input_ids.detach().cpu(), positions=pos, layers=out,
                      final_top1=final_top1, model_max_abs_diff=diff, n_layers=L)


def lens_pair(borders: Borders, input_ids: torch.Tensor, translator: Translator,
              max_positions: int = 24, k: int = 1) -> tuple[LensResult, LensResult]:
    """The logit lens and a tuned lens over the last ``max_positions`` positions of one prompt
    (the report's prediction trajectories, Belrose et al. 2023, Fig. 1).

    Returns:
        ``(logit, tuned)`` :class:`LensResult` over the same positions.

    Raises:
        BadInput: as :func:`logit_lens`. CheckpointMismatch: a tuned lens of another model.
    """
    check = getattr(translator, "check_model", None)
    if callable(check):
        check(borders)
    ids = torch.as_tensor(input_ids).flatten()
    T = int(ids.numel())
    positions = list(range(max(0, T - max_positions), T))
    return (logit_lens(borders, ids, positions=positions, k=k),
            logit_lens(borders, ids, positions=positions, k=k, translator=translator))
