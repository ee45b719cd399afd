"""The report's section on under-trained tokens: the three steps with a bounded verification.

The tokenizer analysis and the indicators (O(V·d), about a second on the default model) always run;
verification prompts the lowest-indicator candidates, as many as the section's share of the budget
pays for at the report's assumed FLOP rate once the few-shot prefixes are paid
(:func:`verification_flops`, :func:`section_candidates`), between
:data:`MIN_CANDIDATES` and :data:`MAX_CANDIDATES`. When that is fewer than the paper's lowest 2%,
the section says so and names the command that verifies them all.
"""

from __future__ import annotations

import time

#: candidates the report verifies at least / at most (the paper's 2% of SmolLM2 is 978)
MIN_CANDIDATES, MAX_CANDIDATES = 16, 128


def verification_flops(borders, tokenizer, examples: list[int]) -> tuple[float, float]:
    """``(fixed, per_candidate)`` FLOPs of verification: each template's few-shot prefix through the
    blocks once (2 per weight of the blocks' matrices per token), and per candidate each template's
    query tokens through the blocks plus one pass over the head (2·V·d)."""
    from vocablens.models.flops import head_flops
    from vocablens.undertrained.verify import TEMPLATES, template_ids

    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2)
    fixed = per = 0.0
    for tpl in TEMPLATES:
        prefix, query = template_ids(tokenizer, tpl, examples)
        fixed += 2.0 * weights * len(prefix)
        per += 2.0 * weights * len(query) + head_flops(borders.vocab_size, borders.d_model)
    return fixed, per


def section_candidates(budget_s: float, spent_s: float, per_candidate_flops: float, flops_per_s: float) -> int:
    """Candidates the section verifies: what ``budget_s - spent_s`` seconds pay for at ``flops_per_s``,
    clamped to [:data:`MIN_CANDIDATES`, :data:`MAX_CANDIDATES`]."""
    fit = int(max(budget_s - spent_s, 0.0) * flops_per_s / max(per_candidate_flops, 1.0))
    return max(MIN_CANDIDATES, min(MAX_CANDIDATES, fit))


def run_section(ctx, plan, run, flops_per_s: float = 2.0e10) -> None:
    """The report's runner (``ctx``, :class:`~vocablens.report.runner.SectionPlan`, ``SectionRun``): sets
    ``run.result`` to an :class:`~vocablens.undertrained.analysis.UndertrainedResult`, and
    ``run.cut_short`` when fewer than the paper's lowest 2% were verified. ``flops_per_s``: the
    report's assumed throughput (FLOP/s), which sizes the number of candidates verified."""
    ASSUMED_FLOPS_PER_S = flops_per_s
    from vocablens.undertrained.analysis import DEFAULT_FRACTION, testable, undertrained
    from vocablens.undertrained.verify import pick_examples

    t0 = time.perf_counter()
    borders, tok = ctx["borders"], ctx["tokenizer"]
    res = undertrained(borders, tok, verify=False)  # classes, indicators, the paper's 2% as candidates
    paper = int(res.candidates.numel())
    ok = testable(res.classes)
    pool = ok.nonzero().flatten()
    order = pool[res.indicators.values[pool].argsort(stable=True)]
    examples = pick_examples(tok, order.flip(0), ok)
    fixed, per = verification_flops(borders, tok, examples) if examples else (0.0, 1.0)
    spent = time.perf_counter() - t0 + fixed / ASSUMED_FLOPS_PER_S
    n = min(section_candidates(plan.budget_s, spent, per, ASSUMED_FLOPS_PER_S), paper)
    report = ctx.get("progress")

    def progress(stage, done, total):
        if report is not None:
            report(f"{plan.title}: {stage} {done:,}/{total:,}")

    run.result = undertrained(borders, tok, candidates=n, verify=bool(examples), progress=progress, reuse=res)
    run.extra["paper_candidates"] = paper
    run.extra["fraction"] = DEFAULT_FRACTION
    if n < paper:
        run.cut_short = (f"verified the lowest {n:,} of the paper's {paper:,} candidates (the lowest "
                         f"{DEFAULT_FRACTION:.0%} of the indicator) within its {plan.budget_s:.0f} s; run "
                         f"`{plan.command} -n {paper}` to verify them all")


__all__ = ["MIN_CANDIDATES", "MAX_CANDIDATES", "verification_flops", "section_candidates", "run_section"]
