"""Lenses scored on held-out text, on :class:`vocablens.Model`: the logit lens against a tuned lens
(``eval_lens``, ``vocablens lens eval``; Belrose et al. 2023, §4) and any lenses side by side
(``compare_lenses``, ``vocablens lens eval --kind K1,K2,...``), each one call that reads the corpus,
scores every layer and hands back a result that shows itself.

What a command must read or refuse before a model loads is done by functions that need no model:
:func:`lens_eval_inputs` and :func:`compare_inputs` (the lenses found and read, the corpus chosen and
read) and :func:`check_scoring_options`. The methods run them too, so a notebook gets the same one-line
errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.lenses.sources import find_lenses
from vocablens.handle.protocols import NeedsLensScoring
from vocablens.handle.stages import stage
from vocablens.models.files.spec import DEFAULT_MODEL

SPLITS = checks.SPLITS

@dataclass(frozen=True)
class LensEvalInputs:
    """What ``lens eval`` reads, found before a model loads (:func:`lens_eval_inputs`).

    Attributes:
        lens: the :class:`~vocablens.lens.tuned.TunedLens` (read; checked against the model by
            :meth:`LensEvaluation.eval_lens`).
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
    """Find the lenses and read the corpus :meth:`LensEvaluation.compare_lenses` scores, before a
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


def check_scoring_options(max_tokens: int, seq_len: int, plot, force: bool) -> None:
    """The options of scoring lenses on a corpus (``compare_lenses``, ``eval_lens``) that need no model.

    Raises:
        BadInput: max_tokens or seq_len < 2, a ``plot`` not ending in ``.html`` or ``.png``.
        OutputExists: ``plot`` exists and not ``force``.
    """
    checks.scoring_options(max_tokens, seq_len, plot, force)


class LensEvaluation:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLensScoring`)."""

    def eval_lens(self: NeedsLensScoring, lens=None, corpus: str | None = None, split: str = "validation",
                  max_tokens: int = 4096, seq_len: int = 512, plot: str | Path | None = None, force: bool = False,
                  label: str | None = None, notes=None, status=None, started=None, progress=None) -> R.LensEval:
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
        with stage(None if inp.split == "all" else status, f"tokenizing the {inp.split} split of {inp.corpus} ..."):
            rows, info = self.eval_rows(inp.corpus, inp.split, min(seq_len, max_tokens), max_tokens, inp.val_fraction,
                                        inp.split_seed, inp.docs)
        if started is not None:
            started(tl, int(rows.numel()), info)
        from vocablens.models.tensor_parallel import is_tensor_parallel

        # rows split over torchrun ranks, or (tensor parallel) every rank reads every row
        start, stop = (0, int(rows.shape[0])) if is_tensor_parallel(self.borders) else share(int(rows.shape[0]))
        T, scoring = int(rows.shape[1]), "scoring both lenses"
        tick = (lambda done, total: None) if progress is None else (
            lambda done, total: progress(scoring, int(done * T), (stop - start) * T))
        tick(0, 0)
        res = evaluate(self.borders, tl, rows, n_bytes=text_bytes(self.tokenizer, rows), on_row=tick)
        title = f"{self.provenance.name}: logit vs tuned lens on {info['corpus']} ({inp.split})"
        if plot is not None and world()[0] == 0:
            from vocablens.render.lens_eval import save_eval_plot

            save_eval_plot(res, plot, title=title)
        from vocablens.render.lens import lens_record

        return self._result(R.LensEval, res, label=inp.label, data=info, split=inp.split, tokens=int(rows.numel()),
                            plot=None if plot is None else str(plot), lenses=[lens_record("tuned", tl)], title=title)

    def _held_label(self: NeedsLensScoring, held) -> str:
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

    def compare_lenses(self: NeedsLensScoring, kinds: Sequence[str] = ("logit", "tuned", "jacobian"), lenses=None,
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
        with stage(None if inp.split == "all" else status, f"tokenizing the {inp.split} split of {inp.corpus} ..."):
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
            from vocablens.render.lens_compare import save_comparison_plot

            save_comparison_plot(res, plot, title=title)
        return self._result(R.LensComparison, res, lenses=[lens_record(k, v) for k, v in read.items()], data=info,
                            split=inp.split, plot=None if plot is None else str(plot), title=title,
                            table_title=f"{name}, {total} tokens of {where}")


__all__ = ["CompareInputs", "LensEvalInputs", "LensEvaluation", "SPLITS", "check_scoring_options", "compare_inputs",
           "lens_eval_inputs"]
