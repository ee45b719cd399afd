"""The report's sections: one runner per section key (``ctx``, its :class:`~vocablens.report.plan.SectionPlan`,
its :class:`~vocablens.report.plan.SectionRun`), each calling one analysis within its share of the budget
and saying what it left (``run.cut_short``)."""

from __future__ import annotations

from vocablens.undertrained.section import run_section as _undertrained
from vocablens.units import plural
from vocablens.report.plan import (
    NEIGHBOR_TOKENS, PROBE_TOKENS, SETTLE_MAX_TOKENS, SETTLE_SEQ_LEN, settle_tokens,
)

def _anatomy(ctx, plan, run):
    from vocablens.accounting.anatomy import anatomy

    run.result = anatomy(ctx["borders"], name=ctx["name"])


def _borders(ctx, plan, run):
    from vocablens.geometry.tying import tie_check

    run.result = tie_check(ctx["borders"])


def _neighbors(ctx, plan, run):
    from vocablens.geometry.embedding import nearest_neighbors

    queries = [q for q in NEIGHBOR_TOKENS if len(ctx["pieces"](q)) >= 1]
    run.result = nearest_neighbors(ctx["borders"], ctx["tokenizer"], queries, k=8)


def _pca(ctx, plan, run):
    from vocablens.errors import BadInput
    from vocablens.geometry.embedding import word_pca

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
    _jacobian(ctx, run)


def _jacobian(ctx, run):
    """The Jacobian lens beside the tuned one (Gurnee et al. 2026), when one is shipped or in --lens:
    ``run.extra["jacobian"]`` over the positions of the pair, ``run.extra["jacobian_lens"]`` the lens."""
    from vocablens.errors import BadInput, CheckpointMismatch
    from vocablens.lens import logit_lens
    from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens

    try:
        jl = JacobianLens.load(find_jacobian_lens(ctx["model"], ctx["lens_path"] or None), ctx["borders"])
    except (BadInput, CheckpointMismatch) as exc:
        run.extra["jacobian_note"] = str(exc)
        return
    pos = run.extra["pair"][0].positions.tolist()
    layers = None if len(jl.layers) == ctx["borders"].n_layers else [*jl.layers, ctx["borders"].n_layers]
    run.extra["jacobian_lens"] = jl
    run.extra["jacobian"] = logit_lens(ctx["borders"], ctx["ids"][0], positions=pos, k=1, translator=jl,
                                       kind="jacobian", layers=layers)


def _argmax_expected(ctx) -> float:
    """Seconds the argmax section is expected to take here (0 with stored verdicts)."""
    from vocablens.argmax import expected_scan_seconds

    return expected_scan_seconds(ctx["borders"])


def _argmax(ctx, plan, run):
    from vocablens.argmax import UNDECIDED, argmax_for_borders
    from vocablens.argmax.estimate import scan_fraction

    report = ctx["progress"]

    def stage(name: str, done: int, total: int) -> None:
        report(f"{plan.title}: {name} {done:,}/{total:,}", fraction=scan_fraction(name, done, total))

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

    borders, pieces = ctx["borders"], ctx["pieces"]
    probes = [q for q in PROBE_TOKENS if len(pieces(q)) == 1]
    if not probes:  # a small vocabulary
        run.note = f"skipped: none of the probe words ({', '.join(map(repr, PROBE_TOKENS))}) is a single token"
        return
    found = vs.search_tokens(borders, [pieces(q)[0] for q in probes], k=1)
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
    from vocablens.corpus import load_documents

    borders = ctx["borders"]
    min_layer = borders.n_layers // 2
    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2)
    n = settle_tokens(borders.vocab_size, borders.d_model, borders.n_layers, weights, plan.budget_s, min_layer)
    rows = ctx["pack"](load_documents("pydoc-topics", max_docs=8), SETTLE_SEQ_LEN, max_tokens=n)
    run.result = vs.settle(borders, rows, min_layer=min_layer)
    if n < SETTLE_MAX_TOKENS:
        run.cut_short = (f"read {n} of {SETTLE_MAX_TOKENS} corpus tokens to stay within {plan.budget_s:.0f} s; "
                         f"run `{plan.command} --max-tokens {SETTLE_MAX_TOKENS}` for the full sample")


RUNNERS = {"anatomy": _anatomy, "borders": _borders, "neighbors": _neighbors, "pca": _pca, "lens": _lens,
            "tuned": _tuned, "argmax": _argmax, "value_vectors": _value_vectors, "explain": _explain,
            "settle": _settle,
            "undertrained": _undertrained}


def _undertrained_planned(ctx) -> float:
    """Seconds verifying the paper's candidates (2% of V) costs at the report's assumed FLOP rate:
    3 templates x (4 query tokens through the blocks + one head pass) per candidate."""
    from vocablens.models.flops import block_flops, head_flops
    from vocablens.report.plan import ASSUMED_FLOPS_PER_S

    b = ctx["borders"]
    per = 3 * (4 * b.n_layers * block_flops(b, 0) + head_flops(b.vocab_size, b.d_model))
    return 0.02 * b.vocab_size * per / ASSUMED_FLOPS_PER_S


#: seconds a section is expected to take, measured before the report starts (the ETA's first guess
#: where a section's planned share says nothing: the scan takes what it needs, up to what is left;
#: the under-trained verification's cost at the assumed FLOP rate, scaled by the cheap sections' ratio)
EXPECTED = {"argmax": _argmax_expected, "undertrained": _undertrained_planned}


__all__ = ["RUNNERS", "EXPECTED"]
