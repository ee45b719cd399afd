"""The report's section on under-trained tokens: the three steps with a verification bounded in time.

The tokenizer analysis and the indicators (O(V·d), about a second on the default model) always run;
verification then prompts the paper's candidates (the lowest 2% of the indicator), lowest first, a
batch of :data:`REPORT_BATCH` at a time, until they are all verified or the section's time is up
(:func:`~vocablens.undertrained.verify.verify_tokens`' ``time_budget_s``; the first batch always
runs). The report runs this section after the argmax scan, with its own share plus what the scan
left unused (:mod:`vocablens.report.plan`), so after one ``vocablens argmax`` (stored verdicts) the
list is usually complete. When fewer than the paper's candidates were verified, the section says so
and names the command that verifies them all.
"""

from __future__ import annotations

import time

#: candidates per verification batch in the report (a budget is checked between batches)
REPORT_BATCH = 32


def run_section(ctx, plan, run) -> None:
    """The report's runner (``ctx``, :class:`~vocablens.report.plan.SectionPlan`, ``SectionRun``): sets
    ``run.result`` to an :class:`~vocablens.undertrained.analysis.UndertrainedResult` whose candidates
    are those verified within ``plan.budget_s`` seconds (counted from the section's start), and
    ``run.cut_short`` when that is fewer than the paper's lowest 2%."""
    from vocablens.undertrained.analysis import DEFAULT_FRACTION, testable, undertrained
    from vocablens.undertrained.verify import pick_examples

    t0 = time.perf_counter()
    borders, tok = ctx["borders"], ctx["tokenizer"]
    res = undertrained(borders, tok, verify=False)  # classes, indicators, the paper's 2% as candidates
    paper = int(res.candidates.numel())
    ok = testable(res.classes)
    pool = ok.nonzero().flatten()
    # a vocabulary too small for few-shot examples is reported unverified (the command says the same)
    examples = pick_examples(tok, pool[res.indicators.values[pool].argsort(stable=True)].flip(0), ok)
    report = ctx.get("progress")

    def progress(stage, done, total):
        if report is not None:
            report(f"{plan.title}: {stage} {done:,}/{total:,}", fraction=done / total if total else None)

    left = max(plan.budget_s - (time.perf_counter() - t0), 0.0)
    run.result = undertrained(borders, tok, candidates=paper, verify=bool(examples), batch_size=REPORT_BATCH,
                              progress=progress, reuse=res, time_budget_s=left)
    run.extra["paper_candidates"] = paper
    run.extra["fraction"] = DEFAULT_FRACTION
    n = int(run.result.candidates.numel())
    if n < paper:
        run.cut_short = (f"verified the lowest {n:,} of the paper's {paper:,} candidates (the lowest "
                         f"{DEFAULT_FRACTION:.0%} of the indicator) within its {plan.budget_s:.0f} s; run "
                         f"`{plan.command} -n {paper}` to verify them all")


__all__ = ["REPORT_BATCH", "run_section"]
