"""The report's plan: which analyses run, in which order, and how one time budget is shared.

``vocablens report`` finishes within one budget (:data:`DEFAULT_BUDGET_S`) on the models people bring. The plan:

- every cheap section always runs, whatever the budget and an earlier section spent (anatomy, borders,
  neighbours, PCA, lenses, under-trained tokens, value vectors, what built the prediction, where predictions settle);
- ``settle`` (its corpus sample) sizes its work from FLOPs and its share at :data:`ASSUMED_FLOPS_PER_S`;
- the argmax scan runs after them with what is left (at least :data:`ARGMAX_MIN_SHARE`), less the
  planned share of ``undertrained``, as its ``time_budget_s``: the certificate stages decide what
  they can, the rest stays ``undecided``;
- ``undertrained`` runs last, its verification bounded by its share or by all that is left when the
  scan left time unused (:func:`after_scan_share`).

A section cut short says what was left and the command that completes it (:attr:`SectionRun.cut_short`);
the ETA follows the measured cost (:func:`eta_s`). Rendering: :mod:`vocablens.render.report`.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from vocablens.models.files.spec import DEFAULT_MODEL


DEFAULT_PROMPT = "The capital of France is"
#: tokens whose neighbours the report shows (single tokens in most English vocabularies)
NEIGHBOR_TOKENS = (" king", " Paris", " three", " Monday", " dog", " happy")
#: tokens whose strongest promoting FFN value vectors the report shows
PROBE_TOKENS = (" three", " Monday", " France", " red")
#: seconds for all analyses (model loading and writing the page come on top)
DEFAULT_BUDGET_S = 150.0
#: the argmax scan gets at least this share of the budget, even when the cheap sections took it all
ARGMAX_MIN_SHARE = 0.1
#: float32 FLOP/s the plan assumes (a small shared CPU; a faster machine simply finishes early)
ASSUMED_FLOPS_PER_S = 2.0e10
#: settle: tokens of the corpus read at most, in rows of this length
SETTLE_MAX_TOKENS, SETTLE_SEQ_LEN = 256, 128

#: key -> (title, share of the budget, command that gives the complete answer; {model} is filled in).
#: For the cheap sections the share is their budget (the ETA's priors: :data:`REFERENCE_S`); for ``settle`` it
#: sizes the corpus sample; ``argmax`` gets what the others leave; ``undertrained`` runs after it.
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
#: the order the report shows them (it runs the argmax scan after the cheap sections, then ``undertrained``)
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


def plan_report(model: str = DEFAULT_MODEL, budget_s: float = DEFAULT_BUDGET_S) -> list[SectionPlan]:
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


#: the section that gets what the others leave (it runs after the cheap ones)
LAST = "argmax"
#: the section that runs after the scan: its own share, plus what the scan left unused
AFTER_SCAN = "undertrained"


def argmax_share(budget_s: float, elapsed_s: float, reserved_s: float = 0.0) -> float:
    """Seconds the argmax scan gets when it starts ``elapsed_s`` into a ``budget_s`` report: what is
    left once ``reserved_s`` (the planned share of :data:`AFTER_SCAN`) is kept aside, and never less
    than :data:`ARGMAX_MIN_SHARE` of the budget."""
    return max(budget_s - elapsed_s - reserved_s, ARGMAX_MIN_SHARE * budget_s)


def after_scan_share(budget_s: float, elapsed_s: float, planned_s: float) -> float:
    """Seconds :data:`AFTER_SCAN` gets when it starts ``elapsed_s`` into a ``budget_s`` report: its
    planned share, or all that is left of the budget when that is more (what the scan left unused:
    after one ``vocablens argmax`` the scan reads stored verdicts in about a second)."""
    return max(planned_s, budget_s - elapsed_s)


#: FLOP/s the ETA's priors assume for the report's compute-bound work (settle's forward and lens readouts,
#: the under-trained verification's few-shot prefixes): a 2-thread CPU, as the cheap sections'
#: :data:`REFERENCE_S`. Only a first guess: each run scales it by its own measured ratio (:func:`eta_s`)
REFERENCE_FLOPS_PER_S = 4.0e10
#: FLOP/s the priors assume for the under-trained verification's queries: a batch of candidates x the
#: query's few tokens per forward on the prefix's cached keys and values runs as matrix products, twice
#: :data:`REFERENCE_FLOPS_PER_S` on the same CPU (docs/performance.md, the report's estimates)
VERIFY_FLOPS_PER_S = 8.0e10
#: reference seconds of the cheap sections for the default model (SmolLM2-135M) on a 2-thread CPU:
#: the ETA's priors, scaled to another model by its forward + head FLOPs per token
#: (:data:`REFERENCE_TOKEN_FLOPS`) and to this run by the measured ratio. ``settle``'s prior is its FLOPs
REFERENCE_S = {"anatomy": 0.01, "borders": 0.01, "neighbors": 0.2, "pca": 0.01, "lens": 0.25, "tuned": 1.0,
               "value_vectors": 2.2, "explain": 0.4}
#: forward + head FLOPs per token of the default model: 2 x 106,168,320 block weights + 2 x 49,152 x 576
REFERENCE_TOKEN_FLOPS = 2 * 106_168_320 + 2 * 49_152 * 576
#: reference seconds of evidence the prior ratio (1) counts for: a section of a few hundredths of a
#: second (anatomy) barely moves the ratio, one of a second or more (the tuned lens) sets it
PRIOR_WEIGHT_S = 0.2


def measured_ratio(finished: dict[str, float], priors: dict[str, float]) -> float:
    """This run's speed against the priors: (measured + w) / (prior + w) seconds over the finished
    sections that have a prior, ``w`` = :data:`PRIOR_WEIGHT_S` (1 before any; > 1: slower than the
    priors). The pooled ratio weights each section by its prior seconds, so a section of milliseconds
    (anatomy, its measured time mostly overhead) cannot set the rate of minutes of work."""
    keys = [k for k in finished if k in priors]
    return (sum(finished[k] for k in keys) + PRIOR_WEIGHT_S) / (sum(priors[k] for k in keys) + PRIOR_WEIGHT_S)


def eta_s(plans: list[SectionPlan], finished: dict[str, float], current: str | None, in_section_s: float,
          elapsed_s: float, budget_s: float, deadline_s: float | None = None,
          argmax_expected_s: float | None = None, section_fraction: float | None = None,
          after_planned_s: float | None = None, priors: dict[str, float] | None = None,
          after_floor_s: float | None = None) -> float:
    """Estimated seconds until the report's sections are done.

    Each cheap section not finished yet costs its prior (``priors[key]``: reference seconds; its
    planned seconds where it has none) times this run's measured ratio (:func:`measured_ratio` over
    the sections finished so far); the one running counts what its estimate has left (none once it
    overran). The argmax scan then takes its expected seconds (``argmax_expected_s``: 0 with stored
    verdicts, else the time measured for this head on this machine,
    :func:`vocablens.argmax.expected_scan_seconds`), never more than its share (:func:`argmax_share`);
    :data:`AFTER_SCAN` then takes its full cost (``after_planned_s`` reference seconds times the ratio)
    up to its share (or what is left when that is more, :func:`after_scan_share`: its verification
    stops there), but never less than what it costs whatever its budget (``after_floor_s`` times the
    ratio: classes, indicators and the first batch always run). While the scan or the section after
    it runs, its rest is extrapolated from the fraction it reports done (``section_fraction``), never
    past its deadline; with no fraction, its expected seconds, else the deadline.

    ``plans``: the report's sections; ``finished``: key -> measured seconds; ``current``: the section
    running (None between sections), ``in_section_s`` seconds into it; ``elapsed_s`` since the start;
    ``deadline_s``: while the scan or :data:`AFTER_SCAN` runs, the elapsed time at which its budget
    ends; ``section_fraction``: the fraction (0..1) of the running section done, when it says.
    """
    after = next((p for p in plans if p.key == AFTER_SCAN and p.key not in finished), None)
    cheap = [p for p in plans if p.key not in (LAST, AFTER_SCAN)]
    prior = {p.key: p.budget_s for p in cheap}
    prior.update({k: v for k, v in (priors or {}).items() if k in prior})
    rate = measured_ratio(finished, prior)

    def after_s(at_s: float) -> float:
        share = after_scan_share(budget_s, at_s, after.budget_s)
        est = share if after_planned_s is None else min(share, after_planned_s * rate)
        return max(est, (after_floor_s or 0.0) * rate)

    if current in (LAST, AFTER_SCAN):
        left = math.inf if deadline_s is None else max(deadline_s - elapsed_s, 0.0)
        floor = 0.0
        if current == AFTER_SCAN and after is not None:   # its first batch runs whatever its deadline
            floor = max((after_floor_s or 0.0) * rate - in_section_s, 0.0)
        if section_fraction is not None and section_fraction >= 0.02:
            est = in_section_s * (1.0 - min(section_fraction, 1.0)) / section_fraction
        elif current == LAST and argmax_expected_s is not None:
            est = max(argmax_expected_s - in_section_s, 0.0)
        elif current == AFTER_SCAN and after_planned_s is not None and after is not None:
            est = max(after_s(elapsed_s - in_section_s) - in_section_s, 0.0)
        else:
            est = left
        est = max(min(est, left), floor)
        est = est if math.isfinite(est) else 0.0
        if current == LAST and after is not None:
            est += after_s(elapsed_s + est)
        return est
    rest = 0.0
    for p in cheap:
        if p.key in finished:
            continue
        est = prior[p.key] * rate
        rest += max(est - in_section_s, 0.0) if p.key == current else est
    if any(p.key == LAST for p in plans) and LAST not in finished:
        share = argmax_share(budget_s, elapsed_s + rest, after.budget_s if after is not None else 0.0)
        rest += share if argmax_expected_s is None else min(share, argmax_expected_s)
    if after is not None:
        rest += after_s(elapsed_s + rest)
    return rest


def after_scan_note(plan: SectionPlan, budget_s: float, estimate_s: float | None) -> str | None:
    """One line saying up front that :data:`AFTER_SCAN` (the under-trained tokens) cannot verify all of
    the paper's candidates (the lowest 2% of the indicator) in its planned share ``plan.budget_s`` of a
    ``budget_s`` report, when its whole cost ``estimate_s`` (seconds, the ETA's prior) is more; else
    None. Names the budget that fits it (its share is a fixed part of the budget) and the command
    that verifies them all."""
    if estimate_s is None or estimate_s <= plan.budget_s:
        return None
    fits = math.ceil(budget_s * estimate_s / plan.budget_s / 10) * 10

    def s(x: float) -> str:
        return f"{x:.0f} s" if x >= 10 else f"{x:.2g} s"

    return (f"the {plan.title} section needs about {s(estimate_s)} here to verify the paper's candidates "
            f"(the lowest 2% of the indicator), more than its {s(plan.budget_s)} share of the {s(budget_s)} budget: it "
            f"verifies the lowest ones only (all of them if the argmax scan leaves the time unused); for the whole "
            f"section give a budget of about {fits:.0f} s (--budget / budget_s) or run `{plan.command} -n 0` (0: all of them)")


__all__ = [
    "after_scan_note", "DEFAULT_PROMPT", "DEFAULT_BUDGET_S", "ASSUMED_FLOPS_PER_S", "ARGMAX_MIN_SHARE", "NEIGHBOR_TOKENS",
    "PROBE_TOKENS", "SECTIONS", "ORDER", "LAST", "SectionPlan", "SectionRun", "ReportRun", "plan_report",
    "settle_tokens", "eta_s", "argmax_share", "AFTER_SCAN", "after_scan_share", "measured_ratio", "REFERENCE_S",
    "REFERENCE_FLOPS_PER_S", "REFERENCE_TOKEN_FLOPS", "PRIOR_WEIGHT_S", "VERIFY_FLOPS_PER_S",
]
