"""The report's runner: every planned section on a loaded model, the cheap ones always, then the argmax
scan with what is left of the budget, then the under-trained tokens with their share or what the scan
left unused (the plan: :mod:`vocablens.report.plan`; the sections:
:mod:`vocablens.report.sections`; the page: :mod:`vocablens.render.report`)."""

from __future__ import annotations

import time
from typing import Callable

from vocablens.report.plan import (  # noqa: F401  (re-exported: the runner's names in one place)
    AFTER_SCAN, ARGMAX_MIN_SHARE, ASSUMED_FLOPS_PER_S, DEFAULT_BUDGET_S, DEFAULT_PROMPT, LAST, NEIGHBOR_TOKENS, ORDER,
    PRIOR_WEIGHT_S, PROBE_TOKENS, REFERENCE_S, SECTIONS, SETTLE_MAX_TOKENS, SETTLE_SEQ_LEN, ReportProgress, ReportRun,
    SectionPlan, SectionRun,
    after_scan_note, after_scan_share, argmax_share, eta_s, plan_report, settle_tokens,
)
from vocablens.report.sections import EXPECTED as _EXPECTED
from vocablens.report.sections import RUNNERS as _RUNNERS
from vocablens.report.sections import priors as _PRIORS
from vocablens.units import plural  # noqa: F401
from vocablens.models.files.spec import DEFAULT_MODEL

_LAST = LAST


def run_report(lm, model: str = DEFAULT_MODEL, prompt: str = DEFAULT_PROMPT, lens_path: str | None = None,
               budget_s: float = DEFAULT_BUDGET_S, progress: ReportProgress | None = None,
               only: tuple[str, ...] | None = None, clock: Callable[[], float] = time.perf_counter,
               images=None) -> ReportRun:
    """Run every planned section of the report on a loaded model: the cheap ones always, then the argmax
    scan with what is left of the budget (less the under-trained section's share), then the
    under-trained tokens with their share or what the scan left unused (module docstring).

    Args:
        lm: a :class:`vocablens.Model` (``vocablens.load``, or ``vocablens.Model.of(loaded)``): each
            section calls one of its workflows.
        model: the spec it was loaded from (names the shipped tuned lens and the completing commands).
        prompt: text for the lens and explanation sections.
        lens_path: a tuned-lens directory (default: the lens shipped for ``model``, if any).
        budget_s: seconds for all sections (:func:`plan_report`).
        progress: ``progress(description, elapsed_s, elapsed_s + eta)`` per section and argmax stage
            (the ETA: :func:`eta_s`; with a progress callback the scan's expected cost is measured
            first, :func:`vocablens.argmax.expected_scan_seconds`).
        only: run just these section keys (default: all of :data:`ORDER`).
        clock: seconds, monotonic (tests pass a fake one).
        images: for a vision-language model, images read with the prompt by its own processor
            (:meth:`vocablens.Model.image_prompt`): the lens sections read image positions, labelled.

    Returns:
        :class:`ReportRun`, its sections in :data:`ORDER`.

    Raises:
        BadInput: an empty prompt, a bad budget, an unknown key in ``only``, a ``lens_path``
            that is not a lens, ``lm`` not a :class:`vocablens.Model`.
        PromptTooLong: more prompt tokens than the model's context.
        CheckpointMismatch: ``lens_path`` belongs to another model.
    """
    plans = _checked_plans(lm, model, prompt, budget_s, only)
    inputs = None
    if images is not None:  # the prompt and its pixels through the model's processor
        ids, inputs = lm.image_prompt(prompt, images)
    else:
        ids = lm.encode(prompt)  # the model's one rule for text -> ids
    t_all = clock()
    finished: dict[str, float] = {}
    now = {"key": None, "t0": t_all, "deadline": None, "fraction": None}

    def report(description: str, fraction: float | None = None) -> None:
        if progress is None:
            return
        t = clock()
        elapsed = t - t_all
        rest = eta_s(plans, finished, now["key"], t - now["t0"], elapsed, budget_s, now["deadline"],
                     now["expected"], fraction, now["priors"].get(AFTER_SCAN), now["priors"],
                     now["priors"].get(AFTER_SCAN + "_floor"))
        progress(description, elapsed, elapsed + rest)

    ctx = {"lm": lm, "borders": lm.borders, "tokenizer": lm.tokenizer, "name": lm.provenance.name, "model": model,
           "ids": ids, "lens_path": lens_path, "progress": report,
           "stream": None if inputs is None else lm.forward(ids, inputs)}
    # what the scan is expected to cost here (0 with stored verdicts): the ETA's guess for it
    after = next((p for p in plans if p.key == AFTER_SCAN), None)
    scans = progress is not None and any(p.key == _LAST for p in plans)
    now["expected"] = _EXPECTED[_LAST](ctx) if scans else None
    # each section's reference seconds: the ETA scales them by the ratio measured on this run
    now["priors"] = _PRIORS(ctx, plans) if progress is not None or after is not None else {}
    runs = {p.key: SectionRun(p) for p in plans}
    if after is not None and now["priors"].get(AFTER_SCAN) is not None:  # said first: cannot finish in its share
        _say_up_front(runs[AFTER_SCAN], after_scan_note(after, budget_s, now["priors"][AFTER_SCAN]))
    # the cheap sections, then the argmax scan, then the section after it
    for plan in sorted(plans, key=lambda p: (p.key == AFTER_SCAN) * 2 + (p.key == _LAST)):
        run = runs[plan.key]
        t0 = clock()
        if plan.key in (_LAST, AFTER_SCAN):  # their budgets depend on what the sections before them took
            plan = run.plan = _budgeted(plan, budget_s, t0 - t_all, after)
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


def check_prompt(prompt: str) -> None:
    """The report's prompt holds some text: the CLI checks it before the model loads, :func:`run_report`
    on entry.

    Raises:
        BadInput: an empty or blank prompt.
    """
    from vocablens.errors import BadInput

    if not prompt or not prompt.strip():
        raise BadInput("empty prompt: give some text with `prompt`")


def _checked_plans(lm, model: str, prompt: str, budget_s: float, only) -> list[SectionPlan]:
    """The sections :func:`run_report` runs (:func:`plan_report`, kept to ``only``), its arguments checked.

    Raises:
        BadInput: an empty prompt, ``lm`` not a :class:`vocablens.Model`, a bad budget, an unknown key.
    """
    from vocablens.errors import BadInput

    check_prompt(prompt)
    if not callable(getattr(lm, "lens", None)):  # a LoadedModel: its sections need the handle's workflows
        raise BadInput("run_report needs a vocablens.Model: vocablens.load(spec), or vocablens.Model.of(loaded)")
    plans = plan_report(model, budget_s)
    if only is not None:
        unknown = sorted(set(only) - set(ORDER))
        if unknown:
            raise BadInput(f"unknown report section {unknown[0]!r}; sections are {', '.join(ORDER)}")
        plans = [p for p in plans if p.key in only]
    return plans


def _say_up_front(run: SectionRun, note: str | None) -> None:
    """``note`` kept for the section's caption (``run.extra["up_front"]``) and shown now (stderr from
    the CLI: a :class:`~vocablens.errors.VocabLensNote`)."""
    if note:
        import warnings

        from vocablens.errors import VocabLensNote

        run.extra["up_front"] = note
        warnings.warn(note, VocabLensNote, stacklevel=3)


def _budgeted(plan: SectionPlan, budget_s: float, elapsed_s: float, after: SectionPlan | None) -> SectionPlan:
    """The argmax scan's plan with what the others left, less the planned share of the section after it;
    that section's plan with its share, or what the scan left when that is more."""
    from dataclasses import replace

    if plan.key == _LAST:
        return replace(plan, budget_s=argmax_share(budget_s, elapsed_s, after.budget_s if after else 0.0))
    return replace(plan, budget_s=after_scan_share(budget_s, elapsed_s, plan.budget_s))


__all__ = [
    "DEFAULT_PROMPT", "DEFAULT_BUDGET_S", "ASSUMED_FLOPS_PER_S", "ARGMAX_MIN_SHARE", "NEIGHBOR_TOKENS",
    "PROBE_TOKENS", "SECTIONS", "ORDER", "SectionPlan", "SectionRun", "ReportRun", "plan_report", "settle_tokens",
    "run_report", "check_prompt", "eta_s", "argmax_share", "after_scan_share", "AFTER_SCAN", "plural",
]
