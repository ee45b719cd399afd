"""What :class:`~vocablens.handle.Model` hands back: a result that shows, saves and plots itself.

An analysis returns a plain frozen dataclass of tensors (``LensResult``, ``ScoreResult`` ...) that
knows nothing of rendering (DESIGN.md). The handle wraps it, with the tokenizer and provenance it was
computed with and the options of the call, in one :class:`Result` per analysis. Every method that
renders dispatches to :mod:`vocablens.render.shown`, the same renderers the CLI, the report and the
explorer use:

* ``.to_json()``: the dict the matching command prints with ``--json`` for the same call;
* ``.table()``: the rich renderables the command prints (a ``rich.console.Group``);
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

    def to_json(self) -> dict:
        """The dict ``vocablens COMMAND --json`` prints for the same call (JSON-ready: plain numbers)."""
        from vocablens.render import shown

        return shown.to_json(self)

    def table(self):
        """The rich renderables the command prints, as one ``rich.console.Group``."""
        from vocablens.render import shown

        return shown.table(self)

    def figure(self):
        """The plotly figure of this result, as the report / explorer draws it.

        Raises:
            BadInput: no figure is drawn for this kind of result.
        """
        from vocablens.render import shown

        return shown.figure(self)

    def to_pandas(self):
        """One row per item of the result's table (a ``pandas.DataFrame``).

        Raises:
            BadInput: pandas is not installed (``pip install 'vocablens[pandas]'``), or the result is
                not tabular.
        """
        from vocablens.render import shown

        return shown.to_pandas(self)

    def _repr_html_(self) -> str:
        from vocablens.render import shown

        return shown.to_html(self)

    def _repr_pretty_(self, p, cycle) -> None:
        from vocablens.render import shown

        p.text(shown.to_text(self).rstrip("\n"))

    def __repr__(self) -> str:
        return f"<vocablens {type(self).__name__} result; .table(), .to_json(), .figure()>"


class Anatomy(Result):
    """``m.anatomy()``: :class:`~vocablens.accounting.anatomy.Anatomy` (``anatomy --load --json``)."""
    kind = "anatomy"


class TieCheck(Result):
    """``m.tie_check()``: :class:`~vocablens.geometry.tying.TieCheck`."""
    kind = "tie_check"


class Neighbors(Result):
    """``m.neighbors(...)``: :class:`~vocablens.geometry.embedding.Neighbors` (``neighbors --json``)."""
    kind = "neighbors"


class WordPCA(Result):
    """``m.pca(...)``: :class:`~vocablens.geometry.embedding.WordPCA` (the report's 3-D figure)."""
    kind = "pca"


class Lens(Result):
    """``m.lens(...)``: ``value[i][j]`` is lens j (``kinds[j]``) on prompt i (a
    :class:`~vocablens.lens.logit.LensResult`); a batch always, one prompt being a batch of one.
    ``to_json()`` is ``lens PROMPT --json`` for a string, ``lens --file F --json`` for a list."""
    kind = "lens"

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


class Score(Result):
    """``m.score(text)``: :class:`~vocablens.generate.score.ScoreResult` (``score --json``)."""
    kind = "score"


class Explanation(Result):
    """``m.explain(...)``: :class:`~vocablens.vocab_space.explain.Explanation` (``explain --json``)."""
    kind = "explain"


class Projection(Result):
    """``m.project(...)``: value vectors projected, or a token's search (``project --json``)."""
    kind = "project"


class Settle(Result):
    """``m.settle(corpus)``: :class:`~vocablens.vocab_space.settle.SettleResult` (``settle --json``)."""
    kind = "settle"


class Argmax(Result):
    """``m.argmax()``: :class:`~vocablens.argmax.model.ModelArgmax` (``argmax --json``)."""
    kind = "argmax"


class Undertrained(Result):
    """``m.undertrained()``: :class:`~vocablens.undertrained.analysis.UndertrainedResult`."""
    kind = "undertrained"


class Generation(Result):
    """``m.generate(...)``: :class:`~vocablens.generate.loop.GenerationResult` (``generate --json``)."""
    kind = "generate"


class Steering(Result):
    """``m.steer(...)``: the chosen vectors and, with a prompt, their effect (``steer --json``)."""
    kind = "steer"


class Surgery(Result):
    """The record of ``m.expand`` / ``m.trim``: what changed and its verification (``expand --json`` /
    ``trim --json``; ``out`` is null until the model is saved)."""
    kind = "surgery"


__all__ = ["Result", "Anatomy", "TieCheck", "Neighbors", "WordPCA", "Lens", "Score", "Explanation", "Projection",
           "Settle", "Argmax", "Undertrained", "Generation", "Steering", "Surgery"]
