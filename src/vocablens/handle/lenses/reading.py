"""Reading the residual stream through the head, on :class:`vocablens.Model`: ``lens`` (the logit lens and
every translated kind, nostalgebraist 2020, Belrose et al. 2023), ``forward`` (one prompt's stream, to
cache) and ``backward_lens`` (the gradient read through the head, Katz et al. 2024)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsLensReading


class LensReading:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLensReading`)."""

    def lens(self: NeedsLensReading, texts, kind: str | Sequence[str] = "logit", k: int = 5, positions="last",
             layers: Sequence[int] | None = None, chat: bool = False, prefix: str = "",
             lens_dir: str | Path | None = None, progress=None, stream=None, lenses: dict | None = None,
             images=None) -> R.Lens:
        """Read the residual stream at every layer through the LM head: top tokens, entropy and KL to
        the final distribution (``vocablens lens PROMPT --json``; a list: ``lens --file F --json``).

        nostalgebraist (2020) for the logit lens; Belrose et al. (2023) for the tuned lens. The
        prompts run as one right-padded batch with an attention mask
        (:func:`vocablens.lens.logit.lens_batches`); every kind reads the same forward.

        Args:
            texts: a prompt, a list of prompts, or token ids: an integer tensor [T] / [1, T] or a list of
                ints is one prompt, an integer tensor [B, T] or a list of id lists / tensors is a batch
                (each prompt's result equals its own run). Float, bool and complex tensors are refused.
            kind: ``logit``, ``tuned`` (this model's :attr:`tuned_lens`), ``both`` (logit and tuned),
                a kind added with :meth:`add_lens`, or a list of kinds.
            k: top tokens per layer.
            positions: ``last``, ``all``, an int, a list of ints (negative from the end), or the same as a
                string, as ``--positions`` takes it (``"12"``, ``"1,2"``:
                :func:`~vocablens.lens.positions.parse_positions`).
            layers: stream layers 0..L (default all; a lens fitted on fewer layers, such as a published
                Jacobian lens, reads its own layers and L).
            chat: wrap each prompt in the chat template (:meth:`encode`).
            prefix: text that follows each prompt (or starts the assistant turn with ``chat``).
            lens_dir: a tuned-lens directory read as ``tuned`` for this call only.
            lenses: kind -> a lens (or its folder) read as that kind for this call only (:meth:`translator`).
            progress: ``progress(prompts done, prompts)`` after each forward.
            stream: ``(resid [L+1, 1, T, d], logits [1, T, V])`` of one prompt's ids, as :meth:`forward`
                returns it: read instead of running the model again (the explorer's cached forward).
            images: for a vision-language model, an image (a path or a PIL image) or a list of them read
                with the one prompt ``texts`` through the model's own processor
                (:mod:`vocablens.handle.images`); image positions are labelled ``<image k/n>``.

        Returns:
            :class:`~vocablens.handle.results.Lens`, a batch (one prompt: a batch of one).

        Raises:
            BadInput: an empty prompt, k < 1, an unknown kind, a kind with no translator, a layer or
                position out of range, positions not in that syntax, ids that are not integers; images
                with a model that has no vision tower, with several prompts, or that cannot be read.
            TokenNotInVocabulary: an id outside [0, V). PromptTooLong: a prompt over the model's
                context (text or ids).
        """
        from vocablens.lens.logit import lens_batches
        from vocablens.lens.positions import parse_positions

        checks.at_least("k", k, whole=True)
        kinds = (["logit", "tuned"] if kind == "both" else [x.strip() for x in kind.split(",") if x.strip()]
                 ) if isinstance(kind, str) else list(kind)  # "logit,tuned,jacobian": a comma list
        if not kinds:
            raise BadInput("give at least one lens kind")
        given = {"tuned": lens_dir, **(lenses or {})}
        translators = [self.translator(kd, given.get(kd)) for kd in kinds]
        if images is not None:  # one prompt through the model's processor; image positions labelled
            ids, borders = self.with_images(texts, images)
            batch, seqs, prompts = False, [ids], [texts]
        else:
            seqs, prompts, batch = self._lens_prompts(texts, chat, prefix)
            if stream is not None and len(seqs) != 1:
                raise BadInput("a cached forward (stream) is of one prompt; give that prompt alone")
            borders = self.borders if stream is None else Replayed(self.borders, seqs[0], stream)
        positions = parse_positions(positions, "positions")
        L = self.borders.n_layers
        own = [layers if layers is not None or len(getattr(t, "layers", None) or range(L)) >= L
               else [*t.layers, L] for t in translators]  # a lens of fewer layers reads its own
        res: list = [None] * len(kinds)
        for lay in [x for i, x in enumerate(own) if x not in own[:i]]:  # one pass per layer set (usually one)
            js = [j for j, x in enumerate(own) if x == lay]
            got = lens_batches(borders, seqs, [translators[j] for j in js], positions=positions, k=k, layers=lay,
                               kinds=[kinds[j] for j in js], progress=progress)
            for j, r in zip(js, got):
                res[j] = r
        labels = [self.position_labels(x) for x in seqs]  # image positions: <image k/n>
        res = [[x if lb is None else dataclasses.replace(x, input_labels=lb) for x, lb in zip(r, labels)] for r in res]
        from vocablens.render.lens import lens_record

        records = [lens_record(kd, t) for kd, t in zip(kinds, translators) if t is not None]
        return self._result(R.Lens, [list(r) for r in zip(*res)], batch=batch, prompts=prompts, lenses=records)

    def _lens_prompts(self: NeedsLensReading, texts, chat: bool,
                      prefix: str) -> tuple[list[torch.Tensor], list[str], bool]:
        """``texts`` of :meth:`lens` -> ``(ids [T] per prompt, prompt texts, batch?)``: a string, ids
        [T] / [1, T] or a list of ints is one prompt; a list (of texts, id lists or id tensors) or an
        integer tensor [B, T] with B > 1 is a batch. Ids are checked (:meth:`prompt_ids`), never cast."""
        if isinstance(texts, str):
            return [self.encode(_text(texts, 0, False), chat=chat, prefix=prefix)[0]], [texts], False
        listed = isinstance(texts, (list, tuple)) and any(isinstance(x, (str, list, tuple)) or torch.is_tensor(x)
                                                          for x in texts)
        if isinstance(texts, (list, tuple)) and not texts:
            raise BadInput("no prompts: give at least one text")
        if not listed:  # ids: one prompt, or a [B, T] tensor of B
            seqs = self.prompt_ids(texts, batch=True, what="texts")
            return seqs, ["".join(self.tokens(ids)) for ids in seqs], len(seqs) > 1
        seqs, prompts = [], []
        for i, x in enumerate(texts):
            if isinstance(x, str):
                seqs.append(self.encode(_text(x, i, True), chat=chat, prefix=prefix)[0])
                prompts.append(x)
            else:
                seqs.append(self.prompt_ids(x, what=f"texts[{i}]")[0])
                prompts.append("".join(self.tokens(seqs[-1])))
        return seqs, prompts, True

    def forward(self: NeedsLensReading, ids, inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt's forward pass (text, or ids [T] / [1, T]): ``(resid [L+1, 1, T, d], logits [1, T, V]
        float32)`` (:meth:`~vocablens.models.Borders.residual_stream`), to pass as ``stream`` to
        :meth:`lens` and :meth:`trajectory` (the explorer caches it per prompt). ``inputs``: the further
        inputs of the model's forward for those ids (a vision-language prompt's ``pixel_values`` ...,
        as :meth:`image_prompt` returns them).

        Raises:
            BadInput: an empty prompt. PromptTooLong: over the model's context.
        """
        with torch.no_grad():
            return self.borders.residual_stream(self._ids(ids), **(inputs or {}))

    def backward_lens(self: NeedsLensReading, text, target: str | int, position: int = -1, k: int = 5,
                      chat: bool = False) -> R.BackwardLens:
        """The backward lens (Katz et al. 2024, §3): the gradient of ``-log p(target)`` at ``position``
        with respect to every stream layer, read through the LM head (``vocablens lens backward --json``;
        :func:`vocablens.lens.backward.backward_lens`).

        Args:
            text: the prompt (a string, or ids [T] / [1, T]: an integer tensor or a list of ints).
            target: the token whose loss is differentiated: its text (with its leading space; ``"4"``
                is the text "4"), or its id as an int or ``"id:N"`` (:meth:`token_id`).
            position: the position predicting it (negative from the end).
            k: top tokens per layer.
            chat: wrap the prompt in the chat template (user turn).

        Returns:
            :class:`~vocablens.handle.results.BackwardLens`.

        Raises:
            BadInput: an empty prompt, k < 1, a position outside the prompt.
            TokenNotInVocabulary: a target that is several tokens or outside the vocabulary.
        """
        from vocablens.lens.backward import backward_lens

        checks.prompt_text(text)
        checks.at_least("k", k)
        tid = self.token_id(target, "target")
        ids = self._ids(text, chat=chat)[0]
        return self._result(R.BackwardLens, backward_lens(self.borders, ids, tid, position=position, k=k))


def _text(x: str, i: int, batch: bool) -> str:
    if not x.strip():
        raise BadInput("empty prompt: give some text" if not batch else f"prompt {i + 1} is empty")
    return x


class Replayed:
    """``borders`` with one prompt's forward pass already run: :meth:`residual_stream` of those ids (no
    mask) answers the cached ``(resid, logits)``; any other call goes to the real Borders. A lens's
    readout then reads the cached forward; the lens itself is unchanged."""

    def __init__(self, borders, ids: torch.Tensor, stream: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._borders, self._ids, self._stream = borders, ids.reshape(1, -1), stream

    def residual_stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if attention_mask is None and torch.equal(input_ids.reshape(1, -1).cpu(), self._ids.cpu()):
            return self._stream
        return self._borders.residual_stream(input_ids, attention_mask)

    def __getattr__(self, name: str):
        return getattr(self._borders, name)


__all__ = ["LensReading", "Replayed"]
