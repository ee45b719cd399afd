"""The report's plan: which analyses run, in which order, and how one time budget is shared.

``vocablens report`` finishes within one budget (:data:`DEFAULT_BUDGET_S`) on the models people bring. The plan:

- every cheap section always runs, whatever the budget and an earlier section spent (anatomy, borders,
  neighbours, PCA, lenses, under-trained tokens, value vectors, what built the prediction, where predictions settle);
- ``settle`` (its corpus sample) and ``undertrained`` (its verified candidates) size their work from FLOPs and
  their share at :data:`ASSUMED_FLOPS_PER_S`;
- the argmax scan runs last with what is left (at least :data:`ARGMAX_MIN_SHARE`) as its
  ``time_budget_s``: the certificate stages decide what they can, the rest stays ``undecided``.

A section cut short says what was left and the command that completes it (:attr:`SectionRun.cut_short`);
the ETA follows the measured cost (:func:`eta_s`). Rendering: :mod:`vocablens.render.report`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vocablens.undertrained.section import run_section as _undertrained
from vocablens.units import plural

DEFAULT_PROMPT = "The capital of France is"
#: tokens whose neighbours the report shows (single tokens in most English vocabularies)
NEIGHBOR_TOKENS = (" king", " Paris", " three", " Monday", " dog", " happy")
#: tokens whose strongest promoting FFN value vectors the report shows
PROBE_TOKENS = (" three", " Monday", " France", " red")
#: seconds for all analyses (model loading and writing the page come on top: about 30 s more)
DEFAULT_BUDGET_S = 150.0
#: the argmax scan gets at least this share of the budget, even when the cheap sections took it all
ARGMAX_MIN_SHARE = 0.1
#: float32 FLOP/s the plan assumes (2 shared cores; a faster machine simply finishes early)
ASSUMED_FLOPS_PER_S = 2.0e10
#: settle: tokens of the corpus read at most, in rows of this length
SETTLE_MAX_TOKENS, SETTLE_SEQ_LEN = 256, 128

#: key -> (title, share of the budget, command that gives the complete answer; {model} is filled in).
#: For the cheap sections the share is the planned cost (the ETA's first guess); for ``settle`` it
#: sizes the corpus sample; ``argmax`` gets what the others leave.
SECTIONS: dict[str, tuple[str, float, str]] = {
    "anatomy": ("anatomy", 0.5, "vocablens anatomy --model {model}"),
    "borders": ("borders and tied check", 1.0, "vocablens info --model {model}"),
    "neighbors": ("embedding neighbours", 2.0, "vocablens neighbors --model {model} TOKEN"),
    "pca": ("3-D PCA of word embeddings", 2.0, "vocablens neighbors --model {model} TOKEN"),
    "lens": ("logit lens", 5.0, "vocablens lens --model {model} PROMPT"),
    "tuned": ("tuned lens", 6.0, "vocablens lens --kind tuned --model {model} PROMPT"),
    "argmax": ("tokens that can never win (argmax geometry)", 39.0, "vocablens argmax --model {model}"),
    "undertrained": ("under-trained tokens", 6.0, "vocablens undertrained --model {model}"),
    "value_vectors": ("value vectors in vocabulary space", 8.0, "vocablens project --model {model} --token TOKEN"),
    "explain": ("what built the prediction", 8.0, "vocablens explain --model {model} PROMPT"),
    "settle": ("where predictions settle", 22.5, "vocablens settle --model {model} --corpus pydoc-topics"),
}
#: the order the report shows them (the argmax scan runs last: it takes what the others leave)
ORDER = ("anatomy", "borders", "neighbors", "pca", "lens", "tuned", "argmax", "undertrained", "value_vectors",
         "explain", "settle")

#: ``progress(description, done, total)``: seconds elapsed, and elapsed + the estimated rest (:func:`eta_s`)
ReportProgress = Callable[[str, float, float], None]


@dataclass(frozen=True)
class SectionPlan:
    """One section of the report: ``key`` (see :data:`ORDER`), ``title`` (what the progress line and the
    page call it), ``budget_s`` (planned seconds; the argmax scan's: what it got), ``command`` (the CLI
    command that gives this section's complete answer)."""

    key: str
    title: str
    budget_s: float
    command: str


@dataclass
class SectionRun:
    """What one planned section did.

    Attributes:
        plan: its :class:`SectionPlan`.
        seconds: wall time it took.
        result: the analysis's result (None when not available).
        cut_short: None when complete; else one sentence: what was left and how to complete it.
        note: why a result is missing although nothing was cut (e.g. no tuned lens for this model).
        extra: section-specific data for the page (the tuned lens object, the probe tokens ...).
    """

    plan: SectionPlan
    seconds: float = 0.0
    result: Any = None
    cut_short: str | None = None
    note: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class ReportRun:
    """All sections of one report, in :data:`ORDER`.

    Attributes:
        prompt: the prompt of the lens sections; ``input_ids`` [1, T] int64 its tokens.
        budget_s: the whole budget; ``seconds`` the time all sections took.
        sections: one :class:`SectionRun` per planned section.
    """

    prompt: str
    input_ids: torch.Tensor
    budget_s: float
    seconds: float
    sections: list[SectionRun]

    def get(self, key: str) -> SectionRun | None:
        """The run of section ``key``, or None when it was not planned."""
        return next((s for s in self.sections if s.plan.key == key), None)

    def result(self, key: str) -> Any:
        """The result of section ``key`` (None when not planned or unavailable)."""
        return getattr(self.get(key), "result", None)

    @property
    def cut_short(self) -> dict[str, str]:
        """Section key -> what was left and how to complete it, for the sections cut short."""
        return {s.plan.key: s.cut_short for s in self.sections if s.cut_short}


def plan_report(model: str = "smollm2", budget_s: float = DEFAULT_BUDGET_S) -> list[SectionPlan]:
    """Split ``budget_s`` over the sections by their shares (:data:`SECTIONS`): the cheap sections'
    planned cost, settle's sizing budget, and the argmax scan's share before the run (at run time
    it gets what is left, :func:`argmax_share`).

    Args:
        model: the model spec, filled into each section's completing command.
        budget_s: seconds for all analyses, > 0.

    Raises:
        BadInput: budget_s <= 0.
    """
    from vocablens.errors import BadInput

    if not budget_s > 0:
        raise BadInput(f"`budget_s` must be a positive number of seconds; got {budget_s}")
    total = sum(SECTIONS[k][1] for k in ORDER)
    return [SectionPlan(k, SECTIONS[k][0], budget_s * SECTIONS[k][1] / total, SECTIONS[k][2].format(model=model))
            for k in ORDER]


def settle_tokens(vocab_size: int, d_model: int, n_layers: int, block_weights: int, budget_s: float,
                  min_layer: int, flops_per_s: float = ASSUMED_FLOPS_PER_S) -> int:
    """Corpus tokens ``settle`` can read in ``budget_s``: a multiple of :data:`SETTLE_SEQ_LEN`,
    at most :data:`SETTLE_MAX_TOKENS`, at least one row.

    Cost per token (FLOPs): the forward pass, 2 per weight of the blocks' matrices
    (``block_weights``), plus the lens readout 2·V·d at every layer from ``min_layer`` to L.
    """
    from vocablens.models.flops import head_flops

    per_token = 2 * block_weights + (n_layers - min_layer + 1) * head_flops(vocab_size, d_model)
    fit = int(budget_s * flops_per_s / max(per_token, 1))
    return max(SETTLE_SEQ_LEN, min(SETTLE_MAX_TOKENS, fit // SETTLE_SEQ_LEN * SETTLE_SEQ_LEN))


# ---------------------------------------------------------------------------------------- sections
def _anatomy(ctx, plan, run):
    from vocablens.anatomy import anatomy

    run.result = anatomy(ctx["borders"], name=ctx["name"])


def _borders(ctx, plan, run):
    from vocablens.tying import tie_check

    run.result = tie_check(ctx["borders"])


def _neighbors(ctx, plan, run):
    from vocablens.geometry import nearest_neighbors

    tok = ctx["tokenizer"]
    queries = [q for q in NEIGHBOR_TOKENS if len(tok(q, add_special_tokens=False).input_ids) >= 1]
    run.result = nearest_neighbors(ctx["borders"], tok, queries, k=8)


def _pca(ctx, plan, run):
    from vocablens.errors import BadInput
    from vocablens.geometry import word_pca

    try:
        run.result = word_pca(ctx["borders"], ctx["tokenizer"])
    except BadInput as exc:  # a small vocabulary: too few of the words are single tokens
        run.note = f"skipped: {exc}"


def _lens(ctx, plan, run):
    from vocablens.lens import logit_lens

    run.result = logit_lens(ctx["borders"], ctx["ids"], positions="all", k=5)


def _tuned(ctx, plan, run):
    from vocablens.errors import BadInput, CheckpointMismatch
    from vocablens.lens import logit_lens
    from vocablens.lens.tuned import load_for_model

    try:
        lens = load_for_model(ctx["borders"], ctx["model"], ctx["lens_path"] or None)
    except (BadInput, CheckpointMismatch) as exc:
        if ctx["lens_path"]:
            raise
        run.note = str(exc)
        return
    from vocablens.lens.logit import lens_pair

    run.extra["lens"] = lens
    run.result = logit_lens(ctx["borders"], ctx["ids"], positions="all", k=5, translator=lens)
    run.extra["pair"] = lens_pair(ctx["borders"], ctx["ids"][0], lens)


def _argmax(ctx, plan, run):
    from vocablens.argmax import UNDECIDED, argmax_for_borders

    report = ctx["progress"]

    def stage(name: str, done: int, total: int) -> None:
        report(f"{plan.title}: {name} {done:,}/{total:,}")

    # a completed scan stored by `vocablens argmax` (same head, bias, norm and settings) is reused
    res = argmax_for_borders(ctx["borders"], progress=stage, time_budget_s=plan.budget_s, stored="read")
    run.result = res
    n = int((res.result.verdict == UNDECIDED).sum())
    if n:
        cut = ", ".join(res.result.cut_short) or "none"
        from vocablens.argmax.estimate import scan_seconds

        est = scan_seconds(ctx["borders"].unembedding.weight)  # timed on this machine, now
        run.cut_short = (f"{plural(n, 'token')} left undecided within the {plan.budget_s:.0f} s left for it (stages "
                         f"cut short: {cut}; a verdict is never guessed); run `{plan.command}` once (about "
                         f"{plural(max(1, round(est / 60)), 'minute')} on this machine at its present load) and the "
                         f"report reads its stored verdicts")


def _value_vectors(ctx, plan, run):
    import vocablens.vocab_space as vs

    borders, tok = ctx["borders"], ctx["tokenizer"]
    probes = [q for q in PROBE_TOKENS if len(tok(q, add_special_tokens=False).input_ids) == 1]
    if not probes:  # a small vocabulary
        run.note = f"skipped: none of the probe words ({', '.join(map(repr, PROBE_TOKENS))}) is a single token"
        return
    found = vs.search_tokens(borders, [tok(q, add_special_tokens=False).input_ids[0] for q in probes], k=1)
    layers, neurons = [], []
    for s in found:  # the order the report's table reads them: per search, promote rows then suppress rows
        layers += s.promote_blocks.tolist() + s.suppress_blocks.tolist()
        neurons += s.promote_neurons.tolist() + s.suppress_neurons.tolist()
    run.result = vs.project_vectors(borders, layers, neurons, k=8)
    # the most interpretable of a random sample; fewer per block on a large vocabulary (budget)
    per_block = 32 if borders.vocab_size <= 100_000 else 16
    run.extra.update(probes=probes, searches=found,
                     interp=vs.interpretable_vectors(borders, n=20, per_block=per_block, k=8))


def _explain(ctx, plan, run):
    import vocablens.vocab_space as vs

    run.result = vs.explain(ctx["borders"], ctx["ids"])


def _settle(ctx, plan, run):
    import vocablens.vocab_space as vs
    from vocablens.corpus import load_documents, pack_tokens

    borders = ctx["borders"]
    min_layer = borders.n_layers // 2
    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2)
    n = settle_tokens(borders.vocab_size, borders.d_model, borders.n_layers, weights, plan.budget_s, min_layer)
    rows = pack_tokens(load_documents("pydoc-topics", max_docs=8), ctx["tokenizer"], SETTLE_SEQ_LEN, max_tokens=n)
    run.result = vs.settle(borders, rows, min_layer=min_layer)
    if n < SETTLE_MAX_TOKENS:
        run.cut_short = (f"read {n} of {SETTLE_MAX_TOKENS} corpus tokens to stay within {plan.budget_s:.0f} s; "
                         f"run `{plan.command} --max-tokens {SETTLE_MAX_TOKENS}` for the full sample")


_RUNNERS = {"anatomy": _anatomy, "borders": _borders, "neighbors": _neighbors, "pca": _pca, "lens": _lens,
            "tuned": _tuned, "argmax": _argmax, "value_vectors": _value_vectors, "explain": _explain,
            "settle": _settle,
            "undertrained": lambda ctx, plan, run: _undertrained(ctx, plan, run, ASSUMED_FLOPS_PER_S)}
#: the section that gets what the others leave (it runs last)
_LAST = "argmax"


def argmax_share(budget_s: float, elapsed_s: float) -> float:
    """Seconds the argmax scan gets when it starts ``elapsed_s`` into a ``budget_s`` report: what is
    left, and never less than :data:`ARGMAX_MIN_SHARE` of the budget."""
    return max(budget_s - elapsed_s, ARGMAX_MIN_SHARE * budget_s)


def eta_s(plans: list[SectionPlan], finished: dict[str, float], current: str | None, in_section_s: float,
          elapsed_s: float, budget_s: float, argmax_deadline_s: float | None = None) -> float:
    """Estimated seconds until the report's sections are done.

    The cheap sections not finished yet cost their planned seconds times the measured ratio of
    actual to planned seconds of the cheap sections finished so far (1 before the first); the one
    running counts what its estimate has left (none once it overran). The argmax scan then takes
    what is left of the budget (:func:`argmax_share`); while it runs, its deadline bounds the rest.

    ``plans``: the report's sections; ``finished``: key -> measured seconds; ``current``: the section
    running (None between sections), ``in_section_s`` seconds into it; ``elapsed_s`` since the start;
    ``argmax_deadline_s``: while the scan runs, the elapsed time at which its budget ends.
    """
    if current == _LAST and argmax_deadline_s is not None:
        return max(argmax_deadline_s - elapsed_s, 0.0)
    cheap = [p for p in plans if p.key != _LAST]
    done_plan = sum(p.budget_s for p in cheap if p.key in finished)
    ratio = sum(finished[p.key] for p in cheap if p.key in finished) / done_plan if done_plan > 0 else 1.0
    rest = 0.0
    for p in cheap:
        if p.key in finished:
            continue
        est = p.budget_s * ratio
        rest += max(est - in_section_s, 0.0) if p.key == current else est
    if any(p.key == _LAST for p in plans) and _LAST not in finished:
        rest += argmax_share(budget_s, elapsed_s + rest)
    return rest


def run_report(lm, model: str = "smollm2", prompt: str = DEFAULT_PROMPT, lens_path: str | None = None,
               budget_s: float = DEFAULT_BUDGET_S, progress: ReportProgress | None = None,
               only: tuple[str, ...] | None = None, clock: Callable[[], float] = time.perf_counter) -> ReportRun:
    """Run every planned section of the report on a loaded model: the cheap ones always, the argmax
    scan last with what is left of the budget (module docstring).

    Args:
        lm: a :class:`~vocablens.models.LoadedModel` (``model, tokenizer, borders, provenance``).
        model: the spec it was loaded from (names the shipped tuned lens and the completing commands).
        prompt: text for the lens and explanation sections.
        lens_path: a tuned-lens directory (default: the lens shipped for ``model``, if any).
        budget_s: seconds for all sections (:func:`plan_report`).
        progress: ``progress(description, elapsed_s, elapsed_s + eta)`` per section and argmax stage.
        only: run just these section keys (default: all of :data:`ORDER`).
        clock: seconds, monotonic (tests pass a fake one).

    Returns:
        :class:`ReportRun`, its sections in :data:`ORDER`.

    Raises:
        BadInput: an empty prompt, a bad budget, an unknown key in ``only``, or a ``lens_path``
            that is not a lens.
        PromptTooLong: more prompt tokens than the model's context.
        CheckpointMismatch: ``lens_path`` belongs to another model.
    """
    from dataclasses import replace

    from vocablens.errors import BadInput
    from vocablens.models.tokens import context_length, encode_prompt

    if not prompt or not prompt.strip():
        raise BadInput("empty prompt: give some text with `prompt`")
    plans = plan_report(model, budget_s)
    if only is not None:
        unknown = sorted(set(only) - set(ORDER))
        if unknown:
            raise BadInput(f"unknown report section {unknown[0]!r}; sections are {', '.join(ORDER)}")
        plans = [p for p in plans if p.key in only]
    ids = encode_prompt(lm.tokenizer, prompt, context_length(lm.model.config))
    t_all = clock()
    finished: dict[str, float] = {}
    now = {"key": None, "t0": t_all, "deadline": None}

    def report(description: str) -> None:
        if progress is None:
            return
        t = clock()
        elapsed = t - t_all
        rest = eta_s(plans, finished, now["key"], t - now["t0"], elapsed, budget_s, now["deadline"])
        progress(description, elapsed, elapsed + rest)

    ctx = {"borders": lm.borders, "tokenizer": lm.tokenizer, "name": lm.provenance.name, "model": model,
           "ids": ids, "lens_path": lens_path, "progress": report}
    runs = {p.key: SectionRun(p) for p in plans}
    for plan in sorted(plans, key=lambda p: p.key == _LAST):  # the argmax scan last
        run = runs[plan.key]
        t0 = clock()
        if plan.key == _LAST:  # what the others left
            plan = run.plan = replace(plan, budget_s=argmax_share(budget_s, t0 - t_all))
            now["deadline"] = t0 - t_all + plan.budget_s
        now.update(key=plan.key, t0=t0)
        report(plan.title)
        _RUNNERS[plan.key](ctx, plan, run)
        run.seconds = clock() - t0
        finished[plan.key] = run.seconds
        now.update(key=None, t0=clock(), deadline=None)
    report("done")
    return ReportRun(prompt=prompt, input_ids=ids, budget_s=budget_s, seconds=clock() - t_all,
                     sections=[runs[p.key] for p in plans])


__all__ = [
    "DEFAULT_PROMPT", "DEFAULT_BUDGET_S", "ASSUMED_FLOPS_PER_S", "ARGMAX_MIN_SHARE", "NEIGHBOR_TOKENS",
    "PROBE_TOKENS", "SECTIONS", "ORDER", "SectionPlan", "SectionRun", "ReportRun", "plan_report", "settle_tokens",
    "run_report", "eta_s", "argmax_share", "plural",
]
