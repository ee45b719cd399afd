"""Training and evaluating a tuned lens on :class:`vocablens.Model` (Belrose et al. 2023, §3 and §4):
``train_lens`` (``vocablens lens train``) and ``eval_lens`` (``vocablens lens eval``), each one call
that reads the corpus, runs the analysis and hands back a result that shows itself.

What a command must refuse before a model loads is checked by functions that need no model:
:func:`check_train_options` (the output folder, ``--init``, ``--save-dtype``, ``--resume``) and
:func:`lens_eval_inputs` (the lens found and read, the corpus chosen and read). The methods run them
too, so a notebook gets the same one-line errors.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from vocablens.handle import checks
from vocablens.errors import BadInput, OutputExists
from vocablens.handle import results as R
from vocablens.models.spec import DEFAULT_MODEL

SPLITS = checks.SPLITS


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


@dataclass(frozen=True)
class LensEvalInputs:
    """What ``lens eval`` reads, found before a model loads (:func:`lens_eval_inputs`).

    Attributes:
        lens: the :class:`~vocablens.lens.tuned.TunedLens` (read; checked against the model by
            :meth:`LensTraining.eval_lens`).
        label: how the output names the lens (the ``--lens`` given, or ``shipped for MODEL``).
        corpus: the corpus scored (given, else the named or identical one the lens was trained on,
            else ``pydoc-topics``).
        docs: its documents.
        split: ``validation`` (held out from the lens's training), ``train`` or ``all``.
        val_fraction, split_seed: the split the lens was trained with (0.0 for ``all``).
    """

    lens: object
    label: str
    corpus: str
    docs: list
    split: str
    val_fraction: float
    split_seed: int


def lens_eval_inputs(model: str = DEFAULT_MODEL, lens=None, corpus: str | None = None, split: str = "validation",
                     label: str | None = None, notes=None) -> LensEvalInputs:
    """Find and read the tuned lens (:func:`vocablens.lens.tuned.find_lens`) and the corpus it is scored
    on, before a model loads. Without ``corpus``: the corpus the lens was trained on when it is a named
    one, or a file here with the same content hash, else ``pydoc-topics`` (``notes`` is told why).

    Args:
        model: the model spec (names the lens shipped for it).
        lens: a lens folder or file, a hub id from the local cache, a lens already read, or None (the
            lens shipped for ``model``).
        label: the lens's name in the output (default: ``lens`` as given, or ``shipped for MODEL``).
        notes: called with a line when the corpus the lens was trained on is not here.

    Raises:
        BadInput: an unknown split, no lens there (or none shipped), a missing or empty corpus.
        CorruptModelFile: a truncated or malformed lens file.
    """
    from vocablens.corpus import NAMED_CORPORA, corpus_record, load_documents
    from vocablens.lens.tuned import TunedLens, find_lens

    checks.one_of("split", split, SPLITS)
    if lens is None or isinstance(lens, (str, Path)):
        tl = TunedLens.load(find_lens(model, lens or ""))  # checked against the model by eval_lens
        label = label or (str(lens) if lens else f"shipped for {model}")  # never a path the user did not give
    else:
        tl, label = lens, label or "given"
    data = tl.settings.get("data") or {}
    docs = None
    if not corpus:
        trained_on, trained_sha = str(data.get("corpus") or ""), data.get("corpus_sha256")
        if trained_on in NAMED_CORPORA:
            corpus = trained_on
        elif trained_on and trained_sha and Path(trained_on).exists():
            here = load_documents(trained_on)
            if corpus_record(trained_on, here)["corpus_sha256"] == trained_sha:
                corpus, docs = trained_on, here
        if not corpus:
            corpus = "pydoc-topics"
            if trained_on and notes is not None:
                notes(f"the lens was trained on the corpus {trained_on!r}"
                      f"{' (sha256 ' + trained_sha[:12] + ')' if trained_sha else ''}, which is not here; "
                      f"evaluating on {corpus} ({split}); give `corpus` to choose")
    docs = load_documents(corpus) if docs is None else docs  # a missing or empty corpus: before the model loads
    val_fraction = float(data.get("val_fraction", 0.1)) if split != "all" else 0.0
    return LensEvalInputs(tl, str(label), str(corpus), docs, split, val_fraction, int(data.get("split_seed", 0)))


def _status(status, message: str):
    return nullcontext() if status is None else status(message)


class LensTraining:
    """Mixed into :class:`~vocablens.handle.Model` (fields, :meth:`corpus_rows`, :meth:`eval_rows`)."""

    def train_lens(self, corpus: str = "python-docs", out: str | Path | None = None, settings=None,
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
        with _status(status, f"tokenizing the training data of {corpus} ..."):
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

    def _initial_lens(self, rows, init: str, init_tokens: int, resume: bool, status):
        """The lens training starts from: zero (the logit lens), or the least-squares start on the first
        ``init_tokens`` tokens of ``rows`` [N, T] (calibrated on the next row); -> (lens, init record)."""
        from vocablens.lens.tuned import TunedLens

        lens = TunedLens.for_model(self.borders, name=self.provenance.name)
        if init != "regression" or resume:
            return lens, {"init": init}
        from vocablens.lens.regression import regression_init

        seq_len = int(rows.shape[1])
        n_fit = max(1, min(rows.shape[0] - 1, init_tokens // seq_len))
        with _status(status, f"least-squares start on {n_fit * seq_len} tokens ..."):
            lens, alphas = regression_init(self.borders, rows[:n_fit], lens=lens, calib=rows[n_fit: n_fit + 1])
        return lens, {"init": init, "init_tokens": n_fit * seq_len, "init_alphas": alphas}

    def eval_lens(self, lens=None, corpus: str | None = None, split: str = "validation", max_tokens: int = 4096,
                  seq_len: int = 512, plot: str | Path | None = None, force: bool = False, label: str | None = None,
                  notes=None, status=None, started=None, progress=None) -> R.LensEval:
        """Per layer, the logit lens and a tuned lens on the same held-out tokens: KL to the final
        distribution, cross-entropy (nats and bits per byte), entropy and top-1 agreement
        (``vocablens lens eval --json``; Belrose et al. 2023, §4, Fig. 3;
        :func:`vocablens.lens.evaluate.evaluate`). Under torchrun each rank scores its share of the rows.

        Args:
            lens: a lens folder or file, a lens already read, the :class:`LensEvalInputs` of
                :func:`lens_eval_inputs` (then ``corpus``, ``split``, ``label`` and ``notes`` are its), or
                None: this model's tuned lens when it holds one (loaded, trained, or the shipped one read
                by :attr:`tuned_lens`), else the one shipped for it.
            corpus: the corpus scored (default: as :func:`lens_eval_inputs`).
            split: ``validation`` (the part held out from the lens's training), ``train`` or ``all``.
            max_tokens: tokens scored (rows of ``min(seq_len, max_tokens)``).
            plot: write the figure there (``.html`` plotly, ``.png`` matplotlib; rank 0), named in the JSON.
            force: replace an existing ``plot``.
            label: the lens's name in the output.
            notes: called with a line (the corpus the lens was trained on is not here).
            status: ``status(message)`` -> a context manager shown while the split is tokenized.
            started: ``started(lens, tokens, data)`` before scoring (the lens checked against the model).
            progress: ``progress(stage, tokens done, tokens)`` (this rank's tokens).

        Returns:
            :class:`~vocablens.handle.results.LensEval`.

        Raises:
            BadInput: max_tokens or seq_len < 2, a bad split or plot suffix, no lens, a missing corpus.
            OutputExists: ``plot`` exists and not ``force``. CheckpointMismatch: a lens of another model.
        """
        from vocablens.handle.lens_compare import check_scoring_options
        from vocablens.lens.evaluate import evaluate, text_bytes
        from vocablens.ops.vocab_parallel.comm import share, world

        check_scoring_options(max_tokens, seq_len, plot, force)
        inp = lens
        if not isinstance(inp, LensEvalInputs):
            held = self.translators.get("tuned") if lens is None else None
            inp = lens_eval_inputs(self.spec or DEFAULT_MODEL, held if held is not None else lens, corpus, split,
                                   label or (self._held_label(held) if held is not None else None), notes)
        tl = inp.lens
        tl.check_model(self.borders)
        tl.to(self.borders.read_device)
        with _status(None if inp.split == "all" else status, f"tokenizing the {inp.split} split of {inp.corpus} ..."):
            rows, info = self.eval_rows(inp.corpus, inp.split, min(seq_len, max_tokens), max_tokens, inp.val_fraction,
                                        inp.split_seed, inp.docs)
        if started is not None:
            started(tl, int(rows.numel()), info)
        from vocablens.models.tensor_parallel import is_tensor_parallel

        # rows split over torchrun ranks, or (tensor parallel) every rank reads every row
        start, stop = (0, int(rows.shape[0])) if is_tensor_parallel(self.borders) else share(int(rows.shape[0]))
        T, stage = int(rows.shape[1]), "scoring both lenses"
        tick = (lambda done, total: None) if progress is None else (
            lambda done, total: progress(stage, int(done * T), (stop - start) * T))
        tick(0, 0)
        res = evaluate(self.borders, tl, rows, n_bytes=text_bytes(self.tokenizer, rows), on_row=tick)
        title = f"{self.provenance.name}: logit vs tuned lens on {info['corpus']} ({inp.split})"
        if plot is not None and world()[0] == 0:
            from vocablens.render.tuned import save_eval_plot

            save_eval_plot(res, plot, title=title)
        from vocablens.render.lens import lens_record

        return self._result(R.LensEval, res, label=inp.label, data=info, split=inp.split, tokens=int(rows.numel()),
                            plot=None if plot is None else str(plot), lenses=[lens_record("tuned", tl)], title=title)


    def _held_label(self, held) -> str:
        """``shipped for SPEC`` when the tuned lens this model holds is the one shipped for its spec (read
        by :attr:`tuned_lens`: the same model identity and training record as the shipped config), else
        ``loaded`` (read with :meth:`load_lens`, or trained)."""
        from vocablens.lens.tuned import CONFIG_FILE, read_json, shipped_lens_path

        spec = self.spec or DEFAULT_MODEL
        shipped = shipped_lens_path(spec)
        if shipped is not None:
            cfg = read_json(shipped / CONFIG_FILE)
            mine = getattr(held, "settings", None) or {}
            if cfg.get("model") == getattr(held, "identity", None) and \
                    all(mine.get(k) == v for k, v in (cfg.get("training") or {}).items()):
                return f"shipped for {spec}"
        return "loaded"

__all__ = ["LensEvalInputs", "LensTraining", "SPLITS", "check_train_options", "lens_eval_inputs"]
