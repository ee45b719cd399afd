"""Fitting a lens on :class:`vocablens.Model`: a tuned lens trained (``train_lens``, ``vocablens lens
train``; Belrose et al. 2023, §3) and a Jacobian lens fitted (``fit_jacobian_lens``, ``vocablens lens
fit-jacobian``; Gurnee et al. 2026), each one call that reads the corpus, fits, measures the lens's
quality, keeps it as this model's lens of that kind and hands back a result that shows itself.

What a command must refuse before a model loads is checked by functions that need no model:
:func:`check_train_options` and :func:`check_fit_options` (the output folder and options). The methods
run them too, so a notebook gets the same one-line errors.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

from vocablens.errors import BadInput, OutputExists
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsLensFitting
from vocablens.handle.stages import stage

#: the storage dtypes of a fitted Jacobian lens (``--save-dtype``)
FIT_DTYPES = ("float16", "bfloat16", "float32")


def check_train_options(out: str | Path | None, init: str = "zero", save_dtype: str = "float32",
                        force: bool = False, resume: bool = False) -> None:
    """The options of :meth:`LensTraining.train_lens` that need no model, refused in one line.

    Raises:
        BadInput: ``init`` not zero/regression, ``save_dtype`` not float32/bfloat16, ``resume`` without
            ``out`` or without a checkpoint in ``out/checkpoint``.
        OutputExists: ``out`` holds a tuned lens and not ``force``, or ``out`` is a file.
    """
    from vocablens.lens.train import CKPT_FILE
    from vocablens.lens.tuned import LENS_FILE

    if init not in ("zero", "regression"):
        raise BadInput(f"`init` must be zero or regression; got {init!r}")
    if save_dtype not in ("float32", "bfloat16"):
        raise BadInput(f"`save_dtype` must be float32 or bfloat16; got {save_dtype!r}")
    if out is not None:
        out = Path(out)
        if (out / LENS_FILE).exists() and not force:
            raise OutputExists(f"{out} already holds a tuned lens; pass `force` to replace it")
        if out.exists() and not out.is_dir():
            raise OutputExists(f"{out} exists and is not a directory")
    if resume and (out is None or not (Path(out) / "checkpoint" / CKPT_FILE).exists()):
        where = "no output folder" if out is None else f"no checkpoint in {Path(out) / 'checkpoint'}"
        raise BadInput(f"`resume`: {where} (train without `resume` first)")


def check_fit_options(out: str | Path | None, save_dtype: str = "float16", seq_len: int = 128, skip_first: int = 16,
                      max_tokens: int = 1024, force: bool = False, resume: bool = False) -> None:
    """The options of :meth:`LensTraining.fit_jacobian_lens` that need no model, refused in one line.

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


class LensTraining:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLensFitting`)."""

    def train_lens(self: NeedsLensFitting, corpus: str = "python-docs", out: str | Path | None = None, settings=None,
                   max_tokens: int | None = None, val_fraction: float = 0.1, seed: int = 0,
                   init: str = "zero", init_tokens: int = 8192, resume: bool = False,
                   checkpoint_every: int | None = None, save_dtype: str = "float32", force: bool = False,
                   docs=None, command: str | None = None, on_step=None, status=None,
                   started=None, quality_tokens: int = 2048) -> R.LensTraining:
        """Train a tuned lens on this frozen model (``vocablens lens train --json``; Belrose et al. 2023,
        §3; :func:`vocablens.lens.train.train`), use it as this model's ``tuned`` lens, and save it to
        ``out`` when given (on rank 0 under torchrun).

        Args:
            corpus: a named corpus, a file or a directory; its training split (documents shuffled with
                ``seed``) packed into rows of ``settings.seq_len`` tokens.
            out: the lens's folder (``lens.safetensors`` + ``config.json``); checkpoints go to
                ``out/checkpoint``.
            settings: :class:`~vocablens.lens.train.TrainSettings` (default: its defaults).
            max_tokens: training tokens used at most (None: all).
            val_fraction: the documents held out (for :meth:`eval_lens`).
            init: ``zero`` (the logit lens, as the paper) or ``regression`` (a least-squares start on
                ``init_tokens`` training tokens, :func:`vocablens.lens.regression.regression_init`).
            resume: continue exactly from the checkpoint in ``out/checkpoint``.
            checkpoint_every: write a checkpoint every N steps (0: at the end only; None: none).
            save_dtype: ``float32`` or ``bfloat16`` storage of the saved lens.
            force: replace a lens already in ``out``.
            docs: the corpus's documents already read (:func:`vocablens.corpus.load_documents`).
            command: the command line recorded in the lens's settings.
            on_step: called with each :class:`~vocablens.lens.train.StepInfo` (rank 0); or a context
                manager entered around the steps only, whose ``__enter__`` gives that callable (a
                progress bar).
            status: ``status(message)`` -> a context manager shown while a step (tokenizing, the
                least-squares start) runs.
            started: called with the data record (``tokens``, ``seq_len``, ``documents`` ...) before
                training.
            quality_tokens: held-out tokens (the validation split) on which the trained lens's per-layer
                KL and top-1 agreement are measured beside the logit lens's and stored with it (0: none).

        Returns:
            :class:`~vocablens.handle.results.LensTraining` (``.lens``, ``.history`` read through).

        Raises:
            BadInput: bad settings or options, an empty corpus. OutputExists: ``out`` holds a lens and
                not ``force``. CheckpointMismatch: a checkpoint made with other settings or data.
            TrainingDiverged: a non-finite loss or gradient.
        """
        import torch

        from vocablens.corpus import load_documents
        from vocablens.lens.train import TrainSettings, train
        from vocablens.ops.vocab_parallel.comm import world

        settings = settings or TrainSettings()
        settings.validate()
        check_train_options(out, init, save_dtype, force, resume)
        docs = load_documents(corpus) if docs is None else docs
        with stage(status, f"tokenizing the training data of {corpus} ..."):
            rows, info = self.corpus_rows(corpus, "train", settings.seq_len, max_tokens or None, val_fraction, 0,
                                          seed, docs)
        info["model"] = self.provenance.name
        if started is not None:
            started(info)
        t0 = time.perf_counter()
        lens, init_info = self._initial_lens(rows, init, init_tokens, resume, status)
        init_info.update({"init_seconds": round(time.perf_counter() - t0, 1)} if "init_tokens" in init_info else {})
        ckpt = None if out is None or (checkpoint_every is None and not resume) else Path(out) / "checkpoint"
        with (on_step if hasattr(on_step, "__enter__") else nullcontext(on_step)) as each_step:
            res = train(self.borders, rows, settings, lens=lens, checkpoint_dir=ckpt, resume=resume,
                        checkpoint_every=checkpoint_every or 0, data_info=info, on_step=each_step,
                        name=self.provenance.name)
        wall = time.perf_counter() - t0
        rank, size = world()
        res.lens.settings.update(init_info)
        if command is not None:
            res.lens.settings["command"] = command
        res.lens.settings["seconds"] = round(wall, 1)
        self.quality_after_fit(res.lens, "tuned", corpus, val_fraction, quality_tokens, docs=docs)
        if out is not None and rank == 0:
            res.lens.save(out, dtype=torch.bfloat16 if save_dtype == "bfloat16" else torch.float32, force=True)
        self.translators["tuned"] = res.lens
        return self._result(R.LensTraining, res, out=None if out is None else str(out), steps=settings.steps,
                            seconds=wall, world_size=size, data=info)

    def _initial_lens(self: NeedsLensFitting, rows, init: str, init_tokens: int, resume: bool, status):
        """The lens training starts from: zero (the logit lens), or the least-squares start on the first
        ``init_tokens`` tokens of ``rows`` [N, T] (calibrated on the next row); -> (lens, init record)."""
        from vocablens.lens.tuned import TunedLens

        lens = TunedLens.for_model(self.borders, name=self.provenance.name)
        if init != "regression" or resume:
            return lens, {"init": init}
        from vocablens.lens.regression import regression_init

        seq_len = int(rows.shape[1])
        n_fit = max(1, min(rows.shape[0] - 1, init_tokens // seq_len))
        with stage(status, f"least-squares start on {n_fit * seq_len} tokens ..."):
            lens, alphas = regression_init(self.borders, rows[:n_fit], lens=lens, calib=rows[n_fit: n_fit + 1])
        return lens, {"init": init, "init_tokens": n_fit * seq_len, "init_alphas": alphas}

    def fit_jacobian_lens(self: NeedsLensFitting, corpus: str = "pydoc-topics", max_tokens: int = 1024,
                          seq_len: int = 128, settings=None, out: str | Path | None = None,
                          val_fraction: float = 0.1, seed: int = 0, checkpoint_every: int | None = None,
                          resume: bool = False, save_dtype: str = "float16",
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
        with stage(status, f"tokenizing the training data of {corpus} ..."):
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


__all__ = ["FIT_DTYPES", "LensTraining", "check_fit_options", "check_train_options"]
