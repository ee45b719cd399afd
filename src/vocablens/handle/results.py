"""What :class:`~vocablens.handle.Model` hands back: a result that shows, saves and plots itself.

An analysis returns a plain frozen dataclass of tensors (``LensResult``, ``ScoreResult`` ...) that
knows nothing of rendering (DESIGN.md). The handle wraps it, with the tokenizer and provenance it was
computed with and the options of the call, in one :class:`Result` per analysis. Every method that
renders looks its ``kind`` up in the one renderer table, :data:`vocablens.render.shown.RENDERERS`
(each kind's renderers live in the render module named for it: ``argmax`` in
:mod:`vocablens.render.argmax`), the same renderers the CLI, the report and the explorer use:

* ``.to_json()``: the dict the matching command prints with ``--json`` for the same call;
* ``.table()``: the rich renderables the command prints (a ``rich.console.Group``; ``print(res.table())``
  prints them as plain text);
* ``.figure()``: the plotly figure the report or the explorer draws (where one is drawn);
* ``.to_pandas()``: a DataFrame of the tabular results (pandas: the ``pandas`` extra);
* Jupyter display: ``_repr_html_`` (the tables as HTML) and a plain-text ``repr`` in IPython.

Attributes of the analysis result read through (``res.layers``, ``res.total_logprob`` ...); the
analysis result itself is ``res.value``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Result:
    """One analysis's result with what it needs to show itself.

    Attributes:
        value: the analysis's own frozen result (or, for a lens, ``[[LensResult per kind] per prompt]``).
        tokenizer: the tokenizer the ids decode with (a ``TokenTable`` works too).
        provenance: the model's :class:`~vocablens.models.Provenance` (``"model"`` in the JSON).
        options: the call's options the renderers need (e.g. the prompts of a lens).
    """

    value: Any
    tokenizer: Any = field(repr=False, compare=False)
    provenance: Any = field(repr=False, compare=False)
    options: dict = field(default_factory=dict, compare=False)
    #: the renderers' key (:data:`vocablens.render.shown.RENDERERS`)
    kind: ClassVar[str] = ""

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "value":
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "value"), name)

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = kind or cls.kind

    def to_json(self) -> dict:
        """The dict ``vocablens COMMAND --json`` prints for the same call (JSON-ready: plain numbers)."""
        return _shown().to_json(self)

    def table(self):
        """The rich renderables the command prints, as one ``rich.console.Group``: ``rich``'s
        ``Console.print`` draws it in colour, the built-in ``print`` (its ``str()``) as plain text."""
        return _shown().table(self)

    def figure(self, **options):
        """The plotly figure of this result, as the report / explorer draws it
        (the ``figure`` of its :class:`~vocablens.render.renderer.Renderer`: which figure each kind draws).

        Args:
            options: the figure's own options (a lens's trajectories: ``colour="entropy"|"kl"|"final_prob"``).

        Raises:
            BadInput: no figure is drawn for this kind of result, or an option its figure does not take.
        """
        return _shown().figure(self, **options)

    def to_pandas(self):
        """One row per item of the result (a ``pandas.DataFrame``; the ``frame`` of its
        :class:`~vocablens.render.renderer.Renderer`: the rows of each kind), the columns named as the
        result's fields.

        Raises:
            BadInput: pandas is not installed (``pip install 'vocablens[pandas]'``), or the result is
                not tabular.
        """
        return _shown().to_pandas(self)

    def _repr_html_(self) -> str:
        return _shown().to_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(_shown().to_text(self).rstrip("\n"))

    def __repr__(self) -> str:
        entry = _shown().RENDERERS.get(self.kind)
        shows = [".table()", ".to_json()"] + [n for n, f in ((".figure()", getattr(entry, "figure", None)),
                                                             (".to_pandas()", getattr(entry, "frame", None)))
                                              if f is not None]  # only what this kind draws
        return f"<vocablens {type(self).__name__} result; {', '.join(shows)}>"


def _shown():
    from vocablens.render import shown

    return shown


class Anatomy(Result, kind="anatomy"):
    """``m.anatomy()``: :class:`~vocablens.accounting.anatomy.Anatomy` (``anatomy --load --json``), or a
    tuple of them (the ``anatomy`` command given several models: one column each).
    ``.figure()``: the report's parameter bars; ``.to_pandas()``: one row of its counts per model."""


class TieCheck(Result, kind="tie_check"):
    """``m.tie_check()``: :class:`~vocablens.geometry.tying.TieCheck`. ``.to_pandas()``: one row."""


class Neighbors(Result, kind="neighbors"):
    """``m.neighbors(...)``: :class:`~vocablens.geometry.embedding.Neighbors` (``neighbors --json``).
    ``.to_pandas()``: a row per (query, matrix, rank)."""


class WordPCA(Result, kind="pca"):
    """``m.pca(...)``: :class:`~vocablens.geometry.embedding.WordPCA`. ``.figure()``: the report's 3-D
    map; ``.to_pandas()``: a row per word (group, id, ``pc1``..``pc3``)."""


class Lens(Result, kind="lens"):
    """``m.lens(...)``: ``value[i][j]`` is lens j (``kinds[j]``) on prompt i (a
    :class:`~vocablens.lens.logit.LensResult`); a batch always, one prompt being a batch of one.
    ``to_json()`` is ``lens PROMPT --json`` for a string, ``lens --file F --json`` for a list.
    ``.figure()``: for a string, the report's heatmap (one kind) or its trajectories side by side
    (``colour=``, several kinds); for a list, a heatmap per kind with a column per (prompt, position).
    ``.to_pandas()``: a row per (prompt, kind, layer, position)."""

    @property
    def prompts(self) -> list[str]:
        """The prompts read, in order."""
        return list(self.options["prompts"])

    @property
    def kinds(self) -> list[str]:
        """The lens kinds read (``["logit"]``, ``["tuned"]`` or ``["logit", "tuned"]``)."""
        return [r.kind for r in self.value[0]]

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, i):
        """``res[i]``: the first lens's :class:`~vocablens.lens.logit.LensResult` of prompt i;
        ``res[i, kind]``: that kind's."""
        if isinstance(i, tuple):
            i, kind = i
            return next(r for r in self.value[i] if r.kind == kind)
        return self.value[i][0]


class Score(Result, kind="score"):
    """``m.score(text)``: :class:`~vocablens.generate.score.ScoreResult` (``score --json``).
    ``.to_pandas()``: a row per scored token."""


class Explanation(Result, kind="explain"):
    """``m.explain(...)``: :class:`~vocablens.vocab_space.explain.Explanation` (``explain --json``).
    ``.figure()``: the explorer's attribution bars per block; ``.to_pandas()``: a row per block."""


class Projection(Result, kind="project"):
    """``m.project(...)``: value vectors projected, or a token's search (``project --json``).
    ``.to_pandas()``: a row per vector, per (direction, vector) of a search, or per pair of a circuit."""


class Settle(Result, kind="settle"):
    """``m.settle(corpus)``: :class:`~vocablens.vocab_space.settle.SettleResult` (``settle --json``).
    ``.figure()``: the report's settle panels; ``.to_pandas()``: a row per stream layer."""


class LensComparison(Result, kind="lens_compare"):
    """``m.compare_lenses(...)``: :class:`~vocablens.lens.compare.LensComparison` (``lens eval --kind
    K1,K2,... --json``). ``.figure()``: the three panels ``lens eval --plot`` writes; ``.to_pandas()``: a
    row per (layer, lens)."""


class BackwardLens(Result, kind="backward"):
    """``m.backward_lens(...)``: :class:`~vocablens.lens.backward.BackwardLens` (``lens backward --json``).
    ``.figure()``: the tokens a descent step promotes at each layer; ``.to_pandas()``: a row per (layer, rank)."""


class JacobianFit(Result, kind="jacobian_fit"):
    """``m.fit_jacobian_lens(...)``: the fitted :class:`~vocablens.lens.jacobian.JacobianLens`
    (``lens fit-jacobian --json``; ``.settings``, ``.layers`` read through)."""


class Decomposition(Result, kind="decompose"):
    """``m.decompose(...)``: :class:`~vocablens.lens.decompose.Decomposition` (``lens decompose --json``)."""


class Argmax(Result, kind="argmax"):
    """``m.argmax()``: :class:`~vocablens.argmax.model.ModelArgmax` (``argmax --json``).
    ``.to_pandas()``: a row per vocabulary row (verdict, deciding stage, margin)."""


class Undertrained(Result, kind="undertrained"):
    """``m.undertrained()``: :class:`~vocablens.undertrained.analysis.UndertrainedResult`.
    ``.figure()``: the report's indicator-vs-probability scatter; ``.to_pandas()``: a row per token listed."""


class Generation(Result, kind="generate"):
    """``m.generate(...)``: :class:`~vocablens.generate.loop.GenerationResult` (``generate --json``).
    ``.to_pandas()``: a row per new token."""


class Steering(Result, kind="steer"):
    """``m.steer(...)``: the chosen vectors and, with a prompt, their effect (``steer --json``).
    ``.to_pandas()``: a row per chosen vector."""


class Surgery(Result, kind="surgery"):
    """The record of ``m.expand`` / ``m.trim``: what changed and its verification (``expand --json`` /
    ``trim --json``; ``out`` is null until the model is saved). ``.to_pandas()``: a row per added token
    (expand)."""


class Trajectory(Result, kind="trajectory"):
    """``m.trajectory(...)``: kind -> :class:`~vocablens.ops.TokenLogprobs` [L+1] (the explorer's
    ``/api/trajectory``). ``.figure()``: the explorer's rank-and-probability plot; ``.to_pandas()``: a row
    per (kind, layer)."""


class Bottleneck(Result, kind="bottleneck"):
    """``m.bottleneck(...)``: :class:`~vocablens.argmax.bottleneck.Bottleneck` (``bottleneck --json``).
    ``.figure()``: the spectra ``bottleneck --plot`` writes; ``.to_pandas()``: a row per singular value."""


class Alignment(Result, kind="align"):
    """``m.align(other)``: :class:`~vocablens.vocab_space.align.Alignment` (``align A B --json``).
    ``.to_pandas()``: a row per best-matching pair listed."""


class Anomaly(Result, kind="anomaly"):
    """``m.anomaly(...)``: :class:`~vocablens.lens.anomaly.AnomalyReport` (``lens anomaly --json``).
    ``.to_pandas()``: a row per test input, a column per ``kind/detector`` score."""


class LensTraining(Result, kind="lens_train"):
    """``m.train_lens(...)``: :class:`~vocablens.lens.train.TrainResult` (``lens train --json``; ``.lens``,
    ``.history`` read through). ``.to_pandas()``: a row per optimizer step (loss, per-layer losses, lr)."""


class LensEval(Result, kind="lens_eval"):
    """``m.eval_lens(...)``: :class:`~vocablens.lens.evaluate.LensEval` (``lens eval --json``).
    ``.figure()``: KL, cross-entropy and top-1 agreement per layer, logit vs tuned (the ``--plot`` and
    the report's figure; ``unit="bpb"``: cross-entropy in bits per byte); ``.to_pandas()``: a row per
    (lens, layer)."""


@dataclass(frozen=True)
class ReportPage:
    """A report written: the run (:class:`~vocablens.report.runner.ReportRun`), the loaded model it read
    (:class:`~vocablens.models.LoadedModel`), the page's path as the user gave it, the sections written
    (:func:`vocablens.render.report.write_page`) and the timings (seconds, per step)."""

    run: Any
    lm: Any = field(repr=False)
    out_path: Any
    sections: list
    timings: dict


class Report(Result, kind="report"):
    """``vocablens report``: the page written (:class:`ReportPage`). ``.to_json()``: what ``report --json``
    prints (each section's result as its own command's JSON, the timings); ``.table()``: the summary the
    command prints (the figures a reader acts on, what was cut short, the page's path)."""


class LensMerge(Result, kind="lens_merge"):
    """``vocablens lens merge``: the record of the merged Jacobian lens
    (:func:`vocablens.lens.jacobian_merge.merge_lens_files`: ``out``, ``n_prompts``, ``tokens``,
    ``layers``, ``shards``). ``.table()``: the one line the command says."""


__all__ = ["Result", "Anatomy", "TieCheck", "Neighbors", "WordPCA", "Lens", "Score", "Explanation", "Projection",
           "Settle", "LensComparison", "BackwardLens", "JacobianFit", "Argmax", "Undertrained", "Generation",
           "Steering", "Surgery", "Trajectory", "Bottleneck", "Alignment", "Anomaly", "LensTraining", "LensEval",
           "ReportPage", "Report", "LensMerge"]
