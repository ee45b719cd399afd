"""The lens workflows of :class:`vocablens.Model`: ``lens``, the translators it reads through
(``tuned_lens``, ``load_lens``, ``add_lens``), ``settle``, ``steer`` and ``report`` (training and
evaluating a tuned lens: :mod:`vocablens.handle.lens_training`).

A lens ``kind`` names a translator: ``logit`` is the identity (the logit lens), ``tuned`` the tuned
lens loaded with :meth:`LensWorkflows.load_lens` or shipped for the model (read on first use), and
any other name one added with :meth:`LensWorkflows.add_lens` (e.g. a Jacobian lens). A kind with no
translator is refused in one line; it is never read as a relabelled logit lens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch

from vocablens.handle import checks
from vocablens.errors import BadInput
from vocablens.handle import results as R
from vocablens.models.files.spec import DEFAULT_MODEL


class LensWorkflows:
    """Mixed into :class:`~vocablens.handle.Model` (which provides the fields and :meth:`encode`)."""

    # ----------------------------------------------------------------------------- translators
    @property
    def tuned_lens(self):
        """The tuned lens of this model: the one loaded with :meth:`load_lens`, else the one shipped for
        its spec (read once).

        Raises:
            BadInput: none loaded and none shipped for this model (train one: :meth:`train_lens`).
            CheckpointMismatch: the shipped lens belongs to another model.
        """
        lens = self.translators.get("tuned")
        if lens is None:
            from vocablens.lens.tuned import load_for_model

            lens = self.translators["tuned"] = load_for_model(self.borders, self.spec or DEFAULT_MODEL, None)
        return lens

    def load_lens(self, path: str | Path):
        """Read a tuned lens directory (ours, or the tuned-lens library's), check it against this model
        and use it as this model's ``tuned`` lens from now on; returns it.

        Raises:
            BadInput: no lens there. CheckpointMismatch: it belongs to another model.
        """
        from vocablens.lens.tuned import TunedLens, find_lens

        lens = TunedLens.load(find_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        self.translators["tuned"] = lens
        return lens

    def add_lens(self, kind: str, translator) -> None:
        """Read the stream through ``translator`` (``translate(layer, h) -> h'``) as lens ``kind``."""
        if kind in ("logit", "both") or not kind:
            raise BadInput(f"{kind!r} names a built-in lens; choose another kind")
        own = getattr(translator, "kind", None)
        if own is not None and own != kind:
            raise BadInput(f"this translator names itself a {own} lens; add it as kind={own!r}")
        self.translators[kind] = translator if own == kind else _Named(translator, kind)

    def translator(self, kind: str, path=None):
        """The translator of lens ``kind`` (None for ``logit``), carrying its quality figures (measured on
        first use when it has none: :meth:`~vocablens.handle.lens_quality.LensQuality.ensure_lens_quality`).

        Args:
            path: as :meth:`_translator`.

        Raises:
            BadInput, CheckpointMismatch: as :meth:`_translator`.
        """
        lens = self._translator(kind, path)
        if lens is not None:
            self.ensure_lens_quality(lens, getattr(lens, "kind", kind))
        return lens

    def _translator(self, kind: str, path=None):
        """The translator of lens ``kind`` (None for ``logit``).

        Args:
            path: for ``tuned`` or ``jacobian``, a lens folder or file read for this call only (not
                kept), or a lens already loaded (handed back as it is); None: the one this model holds,
                else the one shipped for it (then kept).

        Raises:
            BadInput: an unknown kind, or ``tuned`` / ``jacobian`` with none there, loaded or shipped.
            CheckpointMismatch: the lens belongs to another model.
        """
        if kind == "logit":
            return None
        if path is not None and not isinstance(path, (str, Path)):
            return path
        if path is not None and kind == "tuned":
            from vocablens.lens.tuned import TunedLens, find_lens

            return TunedLens.load(find_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        if path is not None and kind == "jacobian":
            from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens

            return JacobianLens.load(find_jacobian_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        if kind == "tuned":
            return self.tuned_lens
        if kind in self.translators:
            return self.translators[kind]
        if kind == "jacobian":  # the Jacobian lens shipped for the model, read on first use
            return self.load_jacobian_lens(None)
        known = ", ".join(["logit", "tuned", "jacobian", "both",
                           *sorted(k for k in self.translators if k not in ("tuned", "jacobian"))])
        raise BadInput(f"`kind` must be one of {known}; got {kind!r}")

    def _lens_for_call(self, kind: str, lens_dir=None):
        """The translator of ``kind``; ``tuned`` read from ``lens_dir`` when given (this call only)."""
        return self.translator(kind, lens_dir if kind == "tuned" else None)

    def load_jacobian_lens(self, path: str | Path | None = None):
        """Read a Jacobian lens (our folder, a published ``lens.pt``, a hub id from the local cache; None:
        the one shipped for this model), check it against this model and use it as lens ``jacobian``.

        Raises:
            BadInput: no lens there. CheckpointMismatch: d_model, layer count or unembedding do not fit.
        """
        from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens

        lens = JacobianLens.load(find_jacobian_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        self.translators["jacobian"] = lens
        return lens

    # ------------------------------------------------------------------------------------- lens
    def lens(self, texts, kind: str | Sequence[str] = "logit", k: int = 5, positions="last",
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

    def _lens_prompts(self, texts, chat: bool, prefix: str) -> tuple[list[torch.Tensor], list[str], bool]:
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

    def forward(self, ids, inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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

    # --------------------------------------------------------------------------------- settle
    def settle(self, corpus: str, max_tokens: int = 2048, seq_len: int = 256, batch: int = 2,
               thresholds: Sequence[float] = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99), lens: str = "logit",
               min_layer: int = 0, rows: torch.Tensor | None = None, batches=None,
               lens_dir: str | Path | None = None, on_tokens=None) -> R.Settle:
        """Where predictions settle over a corpus, and what an early exit would save and keep
        (``vocablens settle --corpus C --json``; :func:`vocablens.vocab_space.settle`).

        Args:
            corpus: a named corpus, a file or a directory (its first documents, ``max_tokens`` tokens
                in rows of ``seq_len``, ``batch`` rows per forward).
            lens: ``logit`` or a kind with a translator (``tuned``).
            batches: an iterable of row batches [b, seq_len] to read instead (the CLI's progress).
            lens_dir: a tuned-lens directory read as ``tuned`` for this call only.
            on_tokens: progress, ``on_tokens(tokens read)`` after each layer of each batch.

        Raises:
            BadInput: bad sizes, a missing corpus, an unknown lens.
        """
        from vocablens import vocab_space as vs

        checks.settle_options(seq_len, batch, max_tokens)
        translator = self._lens_for_call(lens, lens_dir)
        if batches is None:
            rows = self.first_rows(corpus, seq_len, max_tokens) if rows is None else rows
            batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
        res = vs.settle(self.borders, batches, thresholds=list(thresholds), translator=translator,
                        min_layer=min_layer, on_tokens=on_tokens)
        return self._result(R.Settle, res, corpus=corpus, plot=None)

    # ---------------------------------------------------------------------------------- steer
    def steer(self, promote: Sequence[str] = (), suppress: Sequence[str] = (), top_n: int = 10, scale: float = 8.0,
              blocks: Sequence[int] | None = None, suppress_mode: str = "boost", prompt: str = "",
              corpus: str = "", heldout: str = "pydoc-topics", new_tokens: int = 24, progress=None,
              notes=None, started=None) -> R.Steering:
        """Scale the FFN value vectors that promote / suppress tokens, and measure the effect on the
        tokens' mass, held-out perplexity and a greedy continuation (``vocablens steer --json``;
        Geva et al. 2022, §5.1). The hook is removed again; ``res.steering.folded()`` edits the weights.

        Args:
            promote: token strings whose vectors are boosted.
            suppress: token strings whose vectors are suppressed.
            blocks: block indices (default all).
            prompt: the probe text (default ``"The weather today is"``).
            corpus: or a corpus whose texts are the probes.
            heldout: the corpus whose held-out texts measure perplexity.
            new_tokens: greedy tokens of the continuation compared (0..512; none with ``corpus``).
            progress: ``progress(stage, done, total)`` over the forward passes.
            notes: called with a note when a token string is several tokens.
            started: called as ``started(vectors, probe texts, held-out texts)`` before measuring.

        Raises:
            BadInput: no tokens, both prompt and corpus, new_tokens outside 0..512.
        """
        from vocablens.render.steer import vector_rows
        from vocablens.surgery.io import heldout_texts
        from vocablens.vocab_space.steer import steer, vector_top_tokens
        from vocablens.vocab_space.steer_eval import measure

        checks.steer_options(promote, suppress, prompt, corpus, new_tokens)

        def ids_of(texts):
            got = []
            for t in texts:
                ids, note = self.token_ids(t)
                if note and notes is not None:
                    notes(note)
                got.append(int(ids[0]))
            return list(dict.fromkeys(got))

        sets = {"promote": ids_of(promote), "suppress": ids_of(suppress)}
        st = steer(self.borders, promote=sets["promote"], suppress=sets["suppress"], top_n=top_n, scale=scale,
                   blocks=blocks, suppress_mode=suppress_mode)
        probes = ([self.encode_raw(prompt or "The weather today is", 256)] if not corpus else
                  [self.encode_raw(t, 256) for t in heldout_texts(corpus, 4, 600)])
        held = [self.encode_raw(t, 256) for t in heldout_texts(heldout, 4, 800)]
        if started is not None:
            started(len(st.vectors), len(probes), len(held))
        eff = measure(self.borders, st, probes, sets, heldout=held, max_new_tokens=new_tokens if not corpus else 0,
                      progress=progress)
        rows = vector_rows(st.vectors, vector_top_tokens(self.borders, st.vectors, k=6), self.tokenizer)
        return self._result(R.Steering, eff, sets=sets, rows=rows, top_n=top_n, scale=scale,
                            suppress_mode=suppress_mode, steering=st, probes=len(probes), heldout=len(held))

    # --------------------------------------------------------------------------------- report
    def report(self, out: str | Path | None = None, prompt: str | None = None, lens_path: str | None = None,
               budget_s: float | None = None, progress=None, only: tuple[str, ...] | None = None, images=None):
        """Run the HTML report's sections on this model within ``budget_s`` seconds
        (:func:`vocablens.report.runner.run_report`) and write the page to ``out`` when given.
        Returns the :class:`~vocablens.report.plan.ReportRun`.

        ``images``: for a vision-language model, images read with ``prompt`` by its own processor (the
        lens sections read the image positions, labelled; the explanation is skipped).

        Raises:
            BadInput: an empty prompt, a bad budget, ``out`` a directory; images as :meth:`image_prompt`.
        """
        from vocablens.report.runner import DEFAULT_BUDGET_S, DEFAULT_PROMPT, run_report

        run = run_report(self, model=self.spec or DEFAULT_MODEL, prompt=prompt or DEFAULT_PROMPT, lens_path=lens_path,
                         budget_s=DEFAULT_BUDGET_S if budget_s is None else budget_s, progress=progress, only=only,
                         images=images)
        if out is not None:
            from vocablens.render.report import write_page

            write_page(run, self, self.spec or DEFAULT_MODEL, out, run.budget_s)
        return run


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


class _Named:
    """A translator read as lens ``kind`` (the name a result's ``kind`` carries: :mod:`vocablens.lens.kinds`)."""

    def __init__(self, translator, kind: str) -> None:
        self.translator, self.kind = translator, kind

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.translator.translate(layer, h)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "translator":
            raise AttributeError(name)
        return getattr(self.translator, name)
