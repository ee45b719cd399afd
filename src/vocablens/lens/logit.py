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
from vocablens.lens.kinds import lens_kind
from vocablens.lens.positions import resolve_positions  # noqa: F401  (its home is there; re-exported)
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
        kind: the lens computed (:func:`~vocablens.lens.kinds.lens_kind`): ``logit``, ``tuned``, ...
        input_ids: [T] int64, the prompt.
        positions: [P] int64, the positions read.
        layers: one :class:`LensLayer` per layer asked for, in increasing order (all L+1 by default,
            then index = layer).
        final_top1: [P] int64, the model's own top-1 at each position.
        model_max_abs_diff: max_v |p_lens(L) - p_model| at the prompt's last position (should be ~0;
            NaN when that position is not read).
        n_layers: L, the model's number of blocks.
        input_labels: per input position, a label shown instead of the token (an image position:
            ``<image 3/256>``) or None; None for a text prompt.
    """

    kind: str
    input_ids: torch.Tensor
    positions: torch.Tensor
    layers: list[LensLayer]
    final_top1: torch.Tensor
    model_max_abs_diff: float
    n_layers: int = 0
    input_labels: tuple[str | None, ...] | None = None


def layer_logprobs(borders: Borders, h: torch.Tensor, layer: int,
                   translator: Translator | None = None) -> torch.Tensor:
    """Residual stream at one layer [P, d_model] -> the full log-probabilities [P, V] float32.

    For callers that need every column of a few rows (a test comparing whole distributions); the
    lens never forms [P, V] log-probs (:func:`logit_lens` reads through
    :func:`vocablens.ops.kl_readout`), nor does the explorer (:func:`vocablens.lens.trajectory.layer_readout`). The translator
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


#: padded tokens per forward of a batched lens (the model's own logits are [tokens, V] float32:
#: 805 MB at 4,096 tokens and V = 49,152); prompts beyond it run in further forwards
BATCH_TOKENS = 4096


def logit_lens(borders: Borders, input_ids, positions="last", k: int = 5,
               translator: Translator | None = None, kind: str | None = None,
               layers: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None):
    """Read the residual stream of one prompt (or a batch) through the lens at every layer.

    One forward pass, then one LM-head GEMM per (layer < L, position) through
    :func:`vocablens.ops.kl_readout`, token-chunked: no [L+1, P, V] tensor and no [P, V]
    log-probabilities exist; the statistics are compared with the model's own logits [P, V]. Layer L
    is read off those logits (:func:`vocablens.ops.logits_readout`); the lens's own path at layer L
    (final norm, LM head) is checked against them at the last position (``model_max_abs_diff``).

    Args:
        borders: the model's :class:`Borders`.
        input_ids: one prompt, [T] or [1, T] int64; or a batch: a list of [T_i] tensors, or a
            padded [B, T] tensor (B > 1, or with ``attention_mask``), see :func:`logit_lens_batch`.
        positions: ``"last"`` (default), ``"all"``, or a list of positions (for a batch: one such
            spec for every prompt, or a list of one spec per prompt).
        k: number of top tokens per layer and position (1..V).
        translator: optional per-layer map (tuned lens); None = logit lens.
        kind: the result's ``kind``: the lens computed (:func:`~vocablens.lens.kinds.lens_kind`);
            another value is refused.
        layers: subset of layers to report (default all 0..L); layer L is always computed.
        attention_mask: [B, T] 1 = token, 0 = padding (left or right), for a padded batch.

    Returns:
        :class:`LensResult` for one prompt; for a batch, a list of them, one per prompt in order,
        each equal to the prompt's own single-prompt result. The layer-L entry (when reported)
        equals the model's own distribution.

    Raises:
        BadInput: empty prompt, k out of range, a layer outside 0..L, a bad position, a ``kind`` that
            does not name the lens computed (``kind="tuned"`` without a translator).
    """
    batch = isinstance(input_ids, (list, tuple)) or attention_mask is not None or (
        torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[0] != 1)
    if batch:
        return logit_lens_batch(borders, input_ids, positions, k, translator, kind, layers, attention_mask)
    if input_ids.dim() == 2:
        input_ids = input_ids[0]
    return logit_lens_batch(borders, [input_ids], [positions], k, translator, kind, layers)[0]


def check_top_k(k: int, real: int) -> None:
    """``k`` top tokens of a lens row: an int in 1..``real`` (the real vocabulary V').

    Raises:
        BadInput: k not an int (a bool is not), or outside 1..V'.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= real:
        raise BadInput(f"`k` must be an integer between 1 and V={real}; got {k!r}")


def split_batch(input_ids, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """A batch of prompts as a list of [T_i] int64 tensors: a list as it is, a [B, T] tensor row by
    row, keeping the tokens where ``attention_mask`` [B, T] is 1 (left or right padding).

    Raises:
        BadInput: no prompts, a prompt that is not 1-D ids, a mask of another shape.
    """
    if torch.is_tensor(input_ids):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2:
            raise BadInput(f"a batch of prompts is [B, T] token ids; got shape {tuple(input_ids.shape)}")
        if attention_mask is not None:
            if tuple(attention_mask.shape) != tuple(input_ids.shape):
                raise BadInput(f"attention_mask has shape {tuple(attention_mask.shape)}, the ids "
                               f"{tuple(input_ids.shape)}")
            m = attention_mask.to(input_ids.device).bool()
            return [row[keep] for row, keep in zip(input_ids, m)]
        return list(input_ids)
    if attention_mask is not None:
        raise BadInput("attention_mask goes with a padded [B, T] tensor, not a list of prompts")
    out = [torch.as_tensor(x) for x in input_ids]  # cpu: the prompts as given (moved with the batch)
    if not out:
        raise BadInput("no prompts: give at least one")
    for i, x in enumerate(out):
        if x.dim() == 2 and x.shape[0] == 1:
            out[i] = x[0]
        elif x.dim() != 1:
            raise BadInput(f"prompt {i + 1} is not a 1-D list of token ids (shape {tuple(x.shape)})")
    return out


def _groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Prompt indices in forwards of at most ``budget`` padded tokens (longest first, so a group
    pads little); a prompt longer than the budget runs alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def logit_lens_batch(borders: Borders, prompts, positions="last", k: int = 5,
                     translator: Translator | None = None, kind: str | None = None,
                     layers: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
                     batch_tokens: int = BATCH_TOKENS) -> list[LensResult]:
    """The lens of :func:`logit_lens` for a batch of prompts, one forward and one GEMM pass per layer
    for the whole batch.

    The prompts run right-padded in one forward (with an attention mask when their lengths differ;
    causal attention keeps every real token's stream equal to the prompt's own forward), in groups of
    at most ``batch_tokens`` padded tokens; the positions read in all prompts of a group are stacked
    into one :func:`vocablens.ops.kl_readout` call ([S, N, d], N = sum of the prompts' positions).

    Args:
        borders: the model's :class:`Borders`.
        prompts: a list of [T_i] int64 token ids, or a [B, T] tensor (``attention_mask`` [B, T]:
            1 = token, 0 = padding, left or right).
        positions: one spec (``"last"``, ``"all"``, ints; negative from each prompt's end) for every
            prompt, or a list of one spec per prompt.
        k: as :func:`logit_lens`.
        translator: as :func:`logit_lens`.
        kind: as :func:`logit_lens`.
        layers: as :func:`logit_lens`.
        batch_tokens: padded tokens per forward (the model's logits are [tokens, V] float32).

    Returns:
        one :class:`LensResult` per prompt, in order.

    Raises:
        BadInput: no prompts, an empty prompt, k out of range, a layer outside 0..L, a bad position,
            a list of positions whose length is not the number of prompts, a wrong ``kind``.
    """
    seqs = split_batch(prompts, attention_mask)
    return lens_batches(borders, seqs, [translator], positions, k, layers, batch_tokens=batch_tokens,
                        kinds=[kind])[0]


def lens_batches(borders: Borders, prompts, translators: Sequence[Translator | None], positions="last",
                 k: int = 5, layers: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
                 batch_tokens: int = BATCH_TOKENS, kinds: Sequence[str | None] | None = None,
                 progress=None) -> list[list[LensResult]]:
    """Several lenses (e.g. logit and tuned) of a batch of prompts from the same forwards.

    The arguments not listed below are those of :func:`logit_lens_batch`.

    Args:
        translators: one entry per lens: None (the logit lens) or a translator (tuned lens).
        kinds: each lens's ``kind`` (default and only value accepted: :func:`~vocablens.lens.kinds.lens_kind`).
        progress: called as ``progress(prompts done, prompts)`` after each forward.

    Returns:
        ``results[j][i]``: lens j on prompt i (:class:`LensResult`).

    Raises:
        BadInput: as :func:`logit_lens_batch`; a kind that does not name its lens.
    """
    seqs = split_batch(prompts, attention_mask)
    for i, x in enumerate(seqs):
        if x.numel() == 0:
            raise BadInput("empty prompt: give some text" if len(seqs) == 1 else f"prompt {i + 1} is empty")
    check_top_k(k, borders.real_vocab_size)
    L = borders.n_layers
    wanted = list(range(L + 1)) if layers is None else sorted(set(int(x) for x in layers))
    bad = [x for x in wanted if not 0 <= x <= L]
    if bad:
        raise BadInput(f"layer {bad[0]} is outside 0..{L}")
    per_prompt = isinstance(positions, (list, tuple)) and any(
        not isinstance(p, int) and not (torch.is_tensor(p) and p.dim() == 0) for p in positions)
    if per_prompt and len(positions) != len(seqs):
        raise BadInput(f"{len(positions)} position lists for {plural(len(seqs), 'prompt')}")
    specs = list(positions) if per_prompt else [positions] * len(seqs)
    pos = [resolve_positions(int(x.numel()), p) for x, p in zip(seqs, specs)]
    kinds = [lens_kind(t, kd) for kd, t in zip(kinds or [None] * len(translators), translators, strict=True)]
    results: list[list] = [[None] * len(seqs) for _ in translators]
    done = 0
    for group in _groups([int(x.numel()) for x in seqs], max(1, int(batch_tokens))):
        per_lens = _lens_group(borders, [seqs[i] for i in group], [pos[i] for i in group], k, translators, wanted)
        for j, rows in enumerate(per_lens):
            for i, r in zip(group, rows):
                # cpu: result labels (the prompt ids)
                results[j][i] = LensResult(kind=kinds[j], input_ids=seqs[i].detach().cpu(), positions=pos[i],
                                           layers=r[0], final_top1=r[1], model_max_abs_diff=r[2], n_layers=L)
        done += len(group)
        if progress is not None:
            progress(done, len(seqs))
    return results


def _lens_group(borders: Borders, seqs: list[torch.Tensor], pos: list[torch.Tensor], k: int,
                translators: Sequence[Translator | None], wanted: list[int]) -> list[list[tuple]]:
    """One forward of right-padded prompts, one readout per lens of every position read: per lens,
    per prompt ``(layers, final_top1, model_max_abs_diff)``."""
    from vocablens.lens.readout_path import readout_path

    path = readout_path(borders)  # one process, or tensor parallel: this rank's columns of V
    U = path.U
    head = U.head_kwargs()
    real = borders.real_vocab_size
    L = borders.n_layers
    lens = [int(x.numel()) for x in seqs]
    B, Tm = len(seqs), max(lens)
    ids = torch.zeros(B, Tm, dtype=torch.int64)  # cpu: assembled on the host
    mask = torch.zeros(B, Tm, dtype=torch.int64)  # cpu: assembled on the host
    for b, x in enumerate(seqs):
        # cpu: the padded id matrix is assembled on the host, then moved with the batch
        ids[b, :lens[b]] = x.cpu()
        mask[b, :lens[b]] = 1
    padded = bool((mask == 0).any())
    with torch.no_grad():
        resid, model_logits = path.stream(ids, mask.to(borders.device) if padded else None)
        counts = [int(p.numel()) for p in pos]
        if not padded and all(c == Tm for c in counts):  # every position of every prompt: views
            resid, ref = resid.flatten(1, 2), model_logits.flatten(0, 1)  # [L+1, N, d], [N, V]
        else:
            bi = torch.cat([torch.full((c,), b, dtype=torch.long) for b, c in enumerate(counts)]).to(resid.device)
            pi = torch.cat(pos).long().to(resid.device)
            resid, ref = resid[:, bi, pi], model_logits[bi, pi]
        del model_logits
        final_top1 = path.argmax(ref, real)
        stats = dict(targets=final_top1, rank=True, top_k=k, topk_cols=real, entropy=True, **head)
        early = [ly for ly in wanted if ly < L]
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        # the lens path at layer L, read at each prompt's last position when it is read: the check
        lasts = {b: offsets[b] + int((p == lens[b] - 1).nonzero().flatten()[0])
                 for b, p in enumerate(pos) if bool((p == lens[b] - 1).any())}
        rows = torch.tensor(list(lasts.values()), dtype=torch.long, device=resid.device)
        X_check = lens_states(borders, resid[:, rows], [L]) if lasts else None
        # one number per prompt for every caller (CLI, report, server): max |p_lens(L) - p_model| at the
        # prompt's last position, the lens's own path (final norm, LM head) against the model's output
        diffs = {} if X_check is None else dict(zip(lasts, path.kl(
            X_check, ref[rows], max_abs_dp=True, **head).max_abs_dp[0].tolist()))
        # layer L is the model's own output: its statistics are read off the model's logits (no GEMM)
        last = (path.final(ref, **{k: v for k, v in stats.items() if k not in head}), slice(None))
        out = []
        for translator in translators:
            reads = {L: last}
            if early:  # one GEMM pass per layer for every position of every prompt
                r = path.kl(lens_states(borders, resid, early, translator), ref, **stats)
                reads.update({ly: (r, i) for i, ly in enumerate(early)})
            per_prompt = []
            for b in range(B):
                s = slice(offsets[b], offsets[b + 1])
                layers_b = [LensLayer(layer=ly, top_ids=r.topk_ids[i][s], top_probs=r.topk_logprobs[i][s].exp(),
                                      entropy=r.entropy[i][s], kl_to_final=r.kl[i][s],
                                      final_top1_rank=r.target_rank[i][s],
                                      final_top1_prob=r.target_logprob[i][s].exp())
                            for ly, (r, i) in sorted(reads.items()) if ly in wanted]
                per_prompt.append((layers_b, final_top1[s], float(diffs.get(b, float("nan")))))
            out.append(per_prompt)
    return out


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
