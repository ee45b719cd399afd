"""Lenses compared, the backward lens, a Jacobian lens fitted, and the report's under-trained tokens
within a time budget, on :class:`vocablens.Model`: ``compare_lenses`` (``vocablens lens eval --kind
K1,K2,...``), ``backward_lens`` (``vocablens lens backward``), ``fit_jacobian_lens`` (``vocablens lens
fit-jacobian``) and ``undertrained_within`` (the report's section), each one call that hands back a
result that shows itself.

What a command must refuse or read before a model loads is done by functions that need no model:
:func:`~vocablens.handle.lens_sources.find_lenses` (which lens of each kind, where), :func:`compare_inputs` (those lenses and the
corpus they are scored on) and :func:`check_fit_options` (the Jacobian fit's output folder and
options). The methods run them too, so a notebook gets the same one-line errors.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vocablens.handle import checks
from vocablens.errors import BadInput, OutputExists
from vocablens.handle import results as R
from vocablens.handle.lens_sources import find_lenses, lenses_at, merge_shards  # noqa: F401  (re-exported)
from vocablens.models.files.spec import DEFAULT_MODEL

#: the storage dtypes of a fitted Jacobian lens (``--save-dtype``)
FIT_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class CompareInputs:
    """What ``lens eval --kind K1,K2,...`` reads before a model loads (:func:`compare_inputs`).

    Attributes:
        kinds: the lenses in display order (``logit``, ``tuned``, ``jacobian``).
        found: kind -> the lens's path (:func:`find_lenses`) or a lens already read, non-logit kinds.
        corpus: the corpus scored (given, else the named corpus the first fitted lens saw, else
            ``pydoc-topics``); docs: its documents.
        split: ``validation``, ``train`` or ``all``.
        val_fraction, split_seed: the split that lens was fitted with (0.1 and 0 when the corpus is given).
    """

    kinds: tuple[str, ...]
    found: dict
    corpus: str
    docs: list
    split: str
    val_fraction: float
    split_seed: int


def compare_inputs(model: str, kinds: Sequence[str], lenses=None, corpus: str | None = None,
                   split: str = "validation") -> CompareInputs:
    """Find the lenses and read the corpus :meth:`LensCompareWorkflows.compare_lenses` scores, before a
    model loads.

    Args:
        model: the model spec (names the lenses shipped for it).
        kinds: the lenses, in order.
        lenses: ``--lens`` (a folder or file, a hub id from the local cache), None (the lenses shipped),
            or ``{kind: lens already read}``.
        corpus: the corpus (default: the named corpus the first fitted lens saw, else ``pydoc-topics``).

    Raises:
        BadInput: an unknown split, no lens of a kind, a missing or empty corpus.
    """
    from vocablens.corpus import NAMED_CORPORA, load_documents
    from vocablens.lens.jacobian import JacobianLens
    from vocablens.lens.tuned import TunedLens

    checks.one_of("split", split, checks.SPLITS)
    found = dict(lenses) if isinstance(lenses, dict) else find_lenses(kinds, model, lenses)
    data: dict = {}
    if not corpus:  # the held-out part of the corpus the first fitted lens saw, when it is a named one
        for kd, p in found.items():
            if isinstance(p, Path) and not (kd == "tuned" or p.is_dir()):
                continue  # a published Jacobian lens file records no corpus
            ln = p if not isinstance(p, Path) else TunedLens.load(p) if kd == "tuned" else JacobianLens.load(p)
            data = getattr(ln, "settings", {}).get("data") or {}
            if str(data.get("corpus") or "") in NAMED_CORPORA:
                corpus = str(data["corpus"])
                break
        corpus = corpus or "pydoc-topics"
    docs = load_documents(corpus)  # a missing or empty corpus fails before the model loads
    return CompareInputs(tuple(kinds), found, str(corpus), docs, split, float(data.get("val_fraction", 0.1)),
                         int(data.get("split_seed", 0)))


def check_fit_options(out: str | Path | None, save_dtype: str = "float16", seq_len: int = 128, skip_first: int = 16,
                      max_tokens: int = 1024, force: bool = False, resume: bool = False) -> None:
    """The options of :meth:`LensCompareWorkflows.fit_jacobian_lens` that need no model, refused in one line.

    Raises:
        BadInput: an unknown ``save_dtype``; ``seq_len`` leaving no position after ``skip_first`` and the
            last; ``max_tokens`` below one prompt; ``resume`` without a checkpoint in ``out``.
        OutputExists: ``out`` holds a Jacobian lens and neither ``force`` nor ``resume``; ``out`` is a file.
    """
    from vocablens.lens.jacobian import LENS_FILE
    from vocablens.lens.jacobian_fit import CKPT_FILE

    if save_dtype not in FIT_DTYPES:
        raise BadInput(f"`save_dtype` must be float16, bfloat16 or float32; got {save_dtype!r}")
    if seq_len <= skip_first + 1:
        raise BadInput(f"`seq_len` {seq_len} leaves no position after `skip_first` {skip_first} and the last; "
                       f"use more than {skip_first + 1}")
    if max_tokens < seq_len:
        raise BadInput(f"`max_tokens` {max_tokens} is less than one prompt of `seq_len` {seq_len}")
    out = None if out is None else Path(out)
    if out is not None and (out / LENS_FILE).exists() and not force and not resume:
        raise OutputExists(f"{out} already holds a Jacobian lens; pass `force` to replace it")
    if out is not None and out.exists() and not out.is_dir():
        raise OutputExists(f"{out} exists and is not a directory")
    if resume and (out is None or not (out / "jacobian-checkpoint" / CKPT_FILE).exists()):
        where = "no output folder" if out is None else f"no checkpoint in {out / 'jacobian-checkpoint'}"
        raise BadInput(f"`resume`: {where} (fit without `resume` first)")


def _status(status, message: str):
    return nullcontext() if status is None else status(message)


class LensCompareWorkflows:
    """Mixed into :class:`~vocablens.handle.Model` (fields, :meth:`translator`, :meth:`eval_rows`, :meth:`corpus_rows`)."""

    def compare_lenses(self, kinds: Sequence[str] = ("logit", "tuned", "jacobian"), lenses=None,
                       corpus: str | None = None, split: str = "validation", max_tokens: int = 4096,
                       seq_len: int = 512, plot: str | Path | None = None, force: bool = False, status=None,
                       started=None, progress=None) -> R.LensComparison:
        """Every lens of ``kinds`` at every layer on the same held-out tokens: KL to the final distribution,
        cross-entropy (nats and bits per byte), entropy and top-1 agreement (``vocablens lens eval --kind
        K1,K2,... --json``; Belrose et al. 2023, §4; Gurnee et al. 2026;
        :func:`vocablens.lens.compare.compare_lenses`). ``--kind logit,tuned`` (the command's default)
        prints :meth:`eval_lens`'s JSON instead: for that pair, ``m.eval_lens().to_json()`` is what it prints.

        Args:
            kinds: the lenses in display order (``logit``, ``tuned``, ``jacobian``).
            lenses: ``--lens`` (a folder or file), the :class:`CompareInputs` of :func:`compare_inputs`
                (then ``kinds``, ``corpus`` and ``split`` are its), or None: the lenses this model holds,
                else those shipped for it.
            corpus: the text scored (default: as :func:`compare_inputs`).
            split: ``validation`` (held out from the lens's fit), ``train`` or ``all``.
            max_tokens: tokens scored (rows of ``min(seq_len, max_tokens)``).
            plot: write the figure there (``.html`` plotly, ``.png`` matplotlib), named in the JSON.
            force: replace an existing ``plot``.
            status: ``status(message)`` -> a context manager shown while the split is tokenized.
            started: ``started(lenses, tokens, data)`` before scoring (``lenses``: kind -> lens read).
            progress: ``progress(stage, tokens done, tokens)``.

        Returns:
            :class:`~vocablens.handle.results.LensComparison`.

        Raises:
            BadInput: max_tokens or seq_len < 2, a bad split or plot suffix, no lens of a kind, a missing
                corpus. OutputExists: ``plot`` exists and not ``force``. CheckpointMismatch: a lens of
                another model.
        """
        from vocablens.lens.compare import compare_lenses
        from vocablens.lens.evaluate import text_bytes
        from vocablens.render.lens import lens_record

        check_scoring_options(max_tokens, seq_len, plot, force)
        inp = lenses
        if not isinstance(inp, CompareInputs):
            if lenses is None:
                lenses = {k: self.translator(k) for k in kinds if k != "logit"}
            inp = compare_inputs(self.spec or DEFAULT_MODEL, kinds, lenses, corpus, split)
        read = {k: self.translator(k, p) for k, p in inp.found.items()}
        with _status(None if inp.split == "all" else status, f"tokenizing the {inp.split} split of {inp.corpus} ..."):
            rows, info = self.eval_rows(inp.corpus, inp.split, min(seq_len, max_tokens), max_tokens, inp.val_fraction,
                                        inp.split_seed, inp.docs)
        if started is not None:
            started(read, int(rows.numel()), info)
        T, total = int(rows.shape[1]), int(rows.numel())
        tick = (lambda done, n: None) if progress is None else (
            lambda done, n: progress("scoring the lenses", done * T, total))
        tick(0, 0)
        res = compare_lenses(self.borders, {k: read.get(k) for k in inp.kinds}, rows,
                             n_bytes=text_bytes(self.tokenizer, rows), on_row=tick)
        name, where = self.provenance.name, f"{info['corpus']} ({inp.split})"
        title = f"{name}: {', '.join(inp.kinds)} lenses on {where}"
        if plot is not None:
            from vocablens.render.compare import save_comparison_plot

            save_comparison_plot(res, plot, title=title)
        return self._result(R.LensComparison, res, lenses=[lens_record(k, v) for k, v in read.items()], data=info,
                            split=inp.split, plot=None if plot is None else str(plot), title=title,
                            table_title=f"{name}, {total} tokens of {where}")

    def backward_lens(self, text, target: str | int, position: int = -1, k: int = 5,
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

    def token_id(self, token: str | int, what: str = "token") -> int:
        """A single token named by its text (``" Paris"``; ``"4"`` is the text "4") or explicitly by its
        id (an int, or the string ``"id:4"``) -> the id: THE rule of every place that takes a token
        (:func:`vocablens.models.token_input.resolve_token`). A text that spells several tokens is
        refused, never replaced by its first token.

        Args:
            what: how the caller named the argument (``target``, ``--target`` ...), for the messages.

        Raises:
            BadInput: ``id:`` not followed by an integer, a type other than str or int.
            TokenNotInVocabulary: empty, several tokens, or an id outside the real vocabulary.
        """
        from vocablens.models.token_input import resolve_token

        b = self.borders
        return resolve_token(self.tokenizer, token, b.vocab_size, b.real_vocab_size, what=what)[0][0]

    def fit_jacobian_lens(self, corpus: str = "pydoc-topics", max_tokens: int = 1024, seq_len: int = 128,
                          settings=None, out: str | Path | None = None, val_fraction: float = 0.1, seed: int = 0,
                          checkpoint_every: int | None = None, resume: bool = False, save_dtype: str = "float16",
                          force: bool = False, docs=None, command: str | None = None, status=None, started=None,
                          on_progress=None, shard: tuple[int, int] | None = None,
                          quality_tokens: int = 2048) -> R.JacobianFit:
        """Fit a Jacobian lens on this frozen model (Gurnee et al. 2026;
        :func:`vocablens.lens.jacobian_fit.fit_jacobian_lens`: exact average Jacobians by batched VJPs) on
        prompts of ``seq_len`` tokens from the training split of ``corpus`` (documents shuffled with
        ``seed``), use it as lens ``jacobian`` and save it to ``out`` when given
        (``vocablens lens fit-jacobian --json``).

        Args:
            settings: :class:`~vocablens.lens.jacobian_fit.JacobianFitSettings` (default: its defaults).
            out: the lens's folder (``jacobian.safetensors`` + ``jacobian.json``); checkpoints go to
                ``out/jacobian-checkpoint``.
            val_fraction: the documents held out (for ``lens eval``).
            checkpoint_every: checkpoint every N batches of prompts (0: at the end; None: none).
            resume: continue from the checkpoint in ``out``.
            save_dtype: ``float16`` (as the reference), ``bfloat16`` or ``float32`` storage.
            docs: the corpus's documents already read. command: the command line recorded in the lens.
            status: ``status(message)`` -> a context manager shown while the corpus is tokenized.
            started: ``started(prompts, tokens, data)`` before fitting.
            on_progress: called with each :class:`~vocablens.lens.jacobian_fit.FitProgress`.
            shard: ``(I, N)``: fit only the I-th of N disjoint contiguous slices of the prompts
                (:func:`~vocablens.lens.jacobian_merge.shard_range`), recorded with the manifest of all
                the prompts, for ``lens merge``. Under torchrun each rank fits its share of the (shard's)
                prompts and the sums are all-reduced (:func:`~vocablens.lens.jacobian_merge.reduce_over_ranks`);
                rank 0 saves; checkpoints go to one folder per rank.
            quality_tokens: held-out tokens (the validation split) on which the lens's per-layer KL and
                top-1 agreement are measured beside the logit lens's and stored with it
                (:func:`vocablens.lens.quality.measure_quality`); 0: not measured.

        Returns:
            :class:`~vocablens.handle.results.JacobianFit` (the lens's ``.settings``, ``.layers`` read through).

        Raises:
            BadInput: bad settings or options, an empty corpus. OutputExists: ``out`` holds a Jacobian lens
                and not ``force``. CheckpointMismatch: a checkpoint of other settings or data.
        """
        import torch

        from vocablens.lens.jacobian_fit import JacobianFitSettings, fit_jacobian_lens

        check_fit_options(out, save_dtype, seq_len, (settings or JacobianFitSettings()).skip_first, max_tokens,
                          force, resume)
        settings = settings or JacobianFitSettings()
        settings.validate(self.borders.n_layers)
        with _status(status, f"tokenizing the training data of {corpus} ..."):
            rows, info = self.corpus_rows(corpus, "train", seq_len, max_tokens, val_fraction, 0, seed, docs)
        info["model"] = self.provenance.name
        from vocablens.lens.jacobian_merge import prompts_for, reduce_over_ranks

        rows, shard_rec, rank = prompts_for(rows[: max(1, max_tokens // seq_len)], shard, info)
        if started is not None:
            started(int(rows.shape[0]), int(rows.numel()), info)
        t0 = time.perf_counter()
        ckpt = None if out is None or checkpoint_every is None else Path(out) / "jacobian-checkpoint"
        if ckpt is not None and shard_rec.get("world_size", 1) > 1:
            ckpt = ckpt / f"rank{rank}"
        lens = fit_jacobian_lens(self.borders, rows, settings, checkpoint_dir=ckpt,
                                 checkpoint_every=checkpoint_every or 0, resume=resume, data_info=info, on_progress=on_progress, name=self.provenance.name)
        reduce_over_ranks(lens)
        if shard is not None:
            lens.settings["shard"] = {k: v for k, v in shard_rec.items() if k != "world_size"}
        if shard is None:  # a shard's figures would be of a part: the merged lens is measured on first use
            self.quality_after_fit(lens, "jacobian", corpus, val_fraction, quality_tokens, docs=docs)
        wall = time.perf_counter() - t0
        if command is not None:
            lens.settings["command"] = command
        lens.settings["seconds"] = round(wall, 1)
        if out is not None and rank == 0:
            lens.save(out, dtype=getattr(torch, save_dtype), force=True)
        self.translators["jacobian"] = lens
        return self._result(R.JacobianFit, lens, out=None if out is None else str(out), seconds=wall,
                            stored_dtype=save_dtype)

    def undertrained_within(self, budget_s: float, batch_size: int = 32, progress=None) -> R.Undertrained:
        """Under-trained tokens (Land & Bartolo 2024) with verification bounded in time, as the report
        shows them: the tokenizer classes and indicators (O(V·d)) always, then the paper's candidates
        (the lowest 2% of the indicator) verified lowest first, ``batch_size`` at a time, until all are
        verified or ``budget_s`` seconds (counted from the start) are spent (the first batch always runs).
        A vocabulary too small for few-shot examples is left unverified (as ``vocablens undertrained``).

        Returns:
            :class:`~vocablens.handle.results.Undertrained`, its candidates those verified; options
            ``paper_candidates`` (the lowest 2%) and ``fraction`` (0.02).

        Raises:
            BadInput: batch_size < 1.
        """
        from vocablens.undertrained.analysis import DEFAULT_FRACTION, testable, undertrained
        from vocablens.undertrained.verify import pick_examples

        checks.at_least_ge("batch_size", batch_size)
        t0 = time.perf_counter()
        res = undertrained(self.borders, self.tokenizer, verify=False)  # classes, indicators, the paper's 2%
        paper = int(res.candidates.numel())
        ok = testable(res.classes)
        pool = ok.nonzero().flatten()
        examples = pick_examples(self.tokenizer, pool[res.indicators.values[pool].argsort(stable=True)].flip(0), ok)
        left = max(budget_s - (time.perf_counter() - t0), 0.0)
        res = undertrained(self.borders, self.tokenizer, candidates=paper, verify=bool(examples),
                           batch_size=batch_size, progress=progress, reuse=res, time_budget_s=left)
        return self._result(R.Undertrained, res, verdicts=None, paper_candidates=paper, fraction=DEFAULT_FRACTION)


def check_scoring_options(max_tokens: int, seq_len: int, plot, force: bool) -> None:
    """The options of scoring lenses on a corpus (``compare_lenses``, ``eval_lens``) that need no model.

    Raises:
        BadInput: max_tokens or seq_len < 2, a ``plot`` not ending in ``.html`` or ``.png``.
        OutputExists: ``plot`` exists and not ``force``.
    """
    checks.scoring_options(max_tokens, seq_len, plot, force)


__all__ = ["CompareInputs", "FIT_DTYPES", "LensCompareWorkflows", "check_fit_options", "check_scoring_options", "lenses_at",
           "merge_shards",
           "compare_inputs", "find_lenses"]
