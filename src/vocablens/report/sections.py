"""The report's sections: one runner per section key (``ctx``, its :class:`~vocablens.report.plan.SectionPlan`,
its :class:`~vocablens.report.plan.SectionRun`), each calling one workflow of the model (``ctx["lm"]``, a
:class:`vocablens.Model`) within its share of the budget and saying what it left (``run.cut_short``).
A section keeps the analysis's own result (``.value``), which the page renders."""

from __future__ import annotations

from vocablens.units import plural
from vocablens.report.plan import (
    NEIGHBOR_TOKENS, PROBE_TOKENS, SETTLE_SEQ_LEN, SETTLE_MAX_TOKENS, settle_tokens,
)

#: positions of the prompt's end the tuned-lens section follows (Belrose et al. 2023, Fig. 1)
PAIR_POSITIONS = 24


def _anatomy(ctx, plan, run):
    run.result = ctx["lm"].anatomy(name=ctx["name"], notes=()).value


def _borders(ctx, plan, run):
    run.result = ctx["lm"].tie_check().value


def _neighbors(ctx, plan, run):
    lm = ctx["lm"]
    run.result = lm.neighbors([q for q in NEIGHBOR_TOKENS if len(lm.pieces(q)) >= 1], k=8).value


def _pca(ctx, plan, run):
    from vocablens.errors import BadInput

    try:
        run.result = ctx["lm"].pca().value
    except BadInput as exc:  # a small vocabulary: too few of the words are single tokens
        run.note = f"skipped: {exc}"


def _lens(ctx, plan, run):
    # with images, every lens section reads the one forward of the prompt and its pixels (ctx["stream"])
    run.result = ctx["lm"].lens(ctx["ids"], positions="all", k=5, stream=ctx.get("stream"))[0]


def _tuned(ctx, plan, run):
    from vocablens.errors import BadInput, CheckpointMismatch

    lm, ids, path = ctx["lm"], ctx["ids"], ctx["lens_path"] or None
    try:
        lens = lm.translator("tuned", path)
    except (BadInput, CheckpointMismatch) as exc:
        if ctx["lens_path"]:
            raise
        run.note = str(exc)
        return
    run.extra["lens"] = lens
    run.result = lm.lens(ids, kind="tuned", positions="all", k=5, lenses={"tuned": lens}, stream=ctx.get("stream"))[0]
    T = int(ids.shape[-1])
    pair = lm.lens(ids, kind="both", positions=list(range(max(0, T - PAIR_POSITIONS), T)), k=1,
                   lenses={"tuned": lens}, stream=ctx.get("stream"))
    run.extra["pair"] = (pair[0, "logit"], pair[0, "tuned"])
    _jacobian(ctx, run)


def _jacobian(ctx, run):
    """The Jacobian lens beside the tuned one (Gurnee et al. 2026), when one is shipped or in --lens:
    ``run.extra["jacobian"]`` over the positions of the pair, ``run.extra["jacobian_lens"]`` the lens."""
    from vocablens.errors import BadInput, CheckpointMismatch

    lm = ctx["lm"]
    try:
        jl = lm.translator("jacobian", ctx["lens_path"] or None)
    except (BadInput, CheckpointMismatch) as exc:
        run.extra["jacobian_note"] = str(exc)
        return
    pos = run.extra["pair"][0].positions.tolist()
    run.extra["jacobian_lens"] = jl
    # a lens fitted on fewer layers (a published one) reads its own layers and L
    run.extra["jacobian"] = lm.lens(ctx["ids"], kind="jacobian", positions=pos, k=1, lenses={"jacobian": jl},
                                    stream=ctx.get("stream"))[0]


def _argmax_expected(ctx) -> float:
    """Seconds the argmax section is expected to take here (0 with stored verdicts)."""
    from vocablens.argmax import expected_scan_seconds

    return expected_scan_seconds(ctx["borders"])


def _argmax(ctx, plan, run):
    from vocablens.argmax import UNDECIDED
    from vocablens.argmax.estimate import scan_fraction

    report = ctx["progress"]

    def stage(name: str, done: int, total: int) -> None:
        report(f"{plan.title}: {name} {done:,}/{total:,}", fraction=scan_fraction(name, done, total))

    # a completed scan stored by `vocablens argmax` (same head, bias, norm and settings) is reused
    res = ctx["lm"].argmax(progress=stage, budget_s=plan.budget_s, stored="read").value
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
    lm = ctx["lm"]
    probes = [q for q in PROBE_TOKENS if len(lm.pieces(q)) == 1]
    if not probes:  # a small vocabulary
        run.note = f"skipped: none of the probe words ({', '.join(map(repr, PROBE_TOKENS))}) is a single token"
        return
    # each probe's strongest promoting and suppressing value vector, with what each vector promotes
    found = lm.project(token=[lm.pieces(q)[0] for q in probes], k=1)
    run.result = found.options["tops"]
    # the most interpretable of a random sample; fewer per block on a large vocabulary (budget)
    per_block = 32 if lm.borders.vocab_size <= 100_000 else 16
    run.extra.update(probes=probes, searches=found.value,
                     interp=lm.project(interpretable=20, sample=per_block, k=8).value)


def _explain(ctx, plan, run):
    if ctx.get("stream") is not None:  # its forward would read the image tokens without their pixels
        run.note = "skipped: the explanation does not read images yet (the lens sections do)"
        return
    run.result = ctx["lm"].explain(ctx["ids"]).value


def _settle(ctx, plan, run):
    borders = ctx["borders"]
    min_layer = borders.n_layers // 2
    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2)
    n = settle_tokens(borders.vocab_size, borders.d_model, borders.n_layers, weights, plan.budget_s, min_layer)
    # the corpus's first documents, n tokens in rows of SETTLE_SEQ_LEN, read as one batch
    run.result = ctx["lm"].settle("pydoc-topics", max_tokens=n, seq_len=SETTLE_SEQ_LEN, batch=n // SETTLE_SEQ_LEN,
                                  min_layer=min_layer).value
    if n < SETTLE_MAX_TOKENS:
        run.cut_short = (f"read {n} of {SETTLE_MAX_TOKENS} corpus tokens to stay within {plan.budget_s:.0f} s; "
                         f"run `{plan.command} --max-tokens {SETTLE_MAX_TOKENS}` for the full sample")


#: candidates per verification batch in the under-trained section (its budget is checked between batches)
REPORT_BATCH = 32


def _undertrained(ctx, plan, run):
    """Under-trained tokens (Land & Bartolo 2024): classes and indicators always, then the paper's
    candidates (the lowest 2% of the indicator) verified lowest first within ``plan.budget_s``
    (:meth:`vocablens.Model.undertrained_within`). The report runs it after the argmax scan, with its
    own share plus what the scan left unused, so after one ``vocablens argmax`` the list is usually
    complete; when fewer than the paper's candidates were verified, ``run.cut_short`` names the command
    that verifies them all."""
    report = ctx.get("progress")

    def progress(stage, done, total):
        if report is not None:
            report(f"{plan.title}: {stage} {done:,}/{total:,}", fraction=done / total if total else None)

    res = ctx["lm"].undertrained_within(plan.budget_s, batch_size=REPORT_BATCH, progress=progress)
    run.result = res.value
    paper, fraction = res.options["paper_candidates"], res.options["fraction"]
    run.extra.update(paper_candidates=paper, fraction=fraction)
    n = int(run.result.candidates.numel())
    if n < paper:
        run.cut_short = (f"verified the lowest {n:,} of the paper's {paper:,} candidates (the lowest "
                         f"{fraction:.0%} of the indicator) within its time budget of {plan.budget_s:.0f} s; run "
                         f"`{plan.command} -n {paper}` to verify them all")


RUNNERS = {"anatomy": _anatomy, "borders": _borders, "neighbors": _neighbors, "pca": _pca, "lens": _lens,
            "tuned": _tuned, "argmax": _argmax, "value_vectors": _value_vectors, "explain": _explain,
            "settle": _settle,
            "undertrained": _undertrained}


def priors(ctx, plans) -> dict[str, float]:
    """The ETA's reference seconds (:func:`vocablens.report.plan.eta_s`) per section key, scaled by
    each run's measured ratio: the cheap sections' :data:`~vocablens.report.plan.REFERENCE_S`, scaled
    to this model by its forward + head FLOPs per token; ``settle``: the FLOPs of the tokens it will
    read; ``undertrained``: classes and indicators (about 8e-5 s a vocabulary row), the three
    few-shot prefixes (at :data:`~vocablens.report.plan.REFERENCE_FLOPS_PER_S`), and 3 templates x (the
    query's 4 tokens through the blocks + one head pass) per candidate for the paper's 2% of V, run in
    batches (at :data:`~vocablens.report.plan.VERIFY_FLOPS_PER_S`);
    ``undertrained_floor``: what that section costs whatever its budget (classes, indicators,
    prefixes and its first batch of :data:`REPORT_BATCH` candidates). Without borders: the cheap
    sections' reference seconds only."""
    from vocablens.models.flops import block_flops, head_flops
    from vocablens.report.plan import REFERENCE_FLOPS_PER_S, REFERENCE_S, REFERENCE_TOKEN_FLOPS, VERIFY_FLOPS_PER_S

    b = ctx.get("borders")
    if b is None:
        return dict(REFERENCE_S)
    per_token = b.n_layers * block_flops(b, 0) + head_flops(b.vocab_size, b.d_model)
    out = {k: v * per_token / REFERENCE_TOKEN_FLOPS for k, v in REFERENCE_S.items()}
    settle = next((p for p in plans if p.key == "settle"), None)
    if settle is not None:
        weights = sum(p.numel() for blk in b.blocks for p in blk.parameters() if p.dim() >= 2)
        min_layer = b.n_layers // 2
        n = settle_tokens(b.vocab_size, b.d_model, b.n_layers, weights, settle.budget_s, min_layer)
        out["settle"] = n * (2 * weights + (b.n_layers - min_layer + 1) * head_flops(b.vocab_size, b.d_model)) \
            / REFERENCE_FLOPS_PER_S
    fixed = 8e-5 * b.vocab_size + 3 * 40 * b.n_layers * block_flops(b, 40) / REFERENCE_FLOPS_PER_S
    per = 3 * (4 * b.n_layers * block_flops(b, 40) + head_flops(b.vocab_size, b.d_model)) / VERIFY_FLOPS_PER_S
    out["undertrained"] = fixed + round(0.02 * b.vocab_size) * per
    out["undertrained_floor"] = fixed + min(REPORT_BATCH, round(0.02 * b.vocab_size)) * per
    return out


#: seconds the scan is expected to take, measured before the report starts (the ETA's first guess
#: where the scan's share says nothing: it takes what it needs, up to what is left)
EXPECTED = {"argmax": _argmax_expected}


__all__ = ["RUNNERS", "EXPECTED", "priors"]
