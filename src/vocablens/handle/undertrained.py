"""Under-trained tokens, on :class:`vocablens.Model` (Land & Bartolo 2024): ``undertrained`` (``vocablens
undertrained``) and ``undertrained_within`` (the report's section, verification bounded in time)."""

from __future__ import annotations

import time

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsMatrices


class UndertrainedTokens:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsMatrices`)."""

    def undertrained(self: NeedsMatrices, candidates: int | None = 500, indicator: str = "auto", verify: bool = True,
                     batch_size: int = 64, argmax_verdicts=None, progress=None) -> R.Undertrained:
        """Under-trained tokens: tokenizer classes, an indicator from the matrices, verification by
        prompting (``vocablens undertrained --json``; Land & Bartolo 2024).

        Args:
            candidates: lowest-indicator tokens verified (None: the paper's lowest 2%).
            indicator: ``auto``, ``unembedding_cosine`` or ``embedding_norm``.
            argmax_verdicts: an argmax scan shown beside each row: its per-token verdicts [V], an
                :meth:`argmax` result, or the dict ``vocablens argmax --json`` printed
                (:func:`vocablens.undertrained.beside.argmax_verdicts`).

        Raises:
            BadInput: candidates < 0 or batch_size < 1; a scan of another vocabulary size, or a dict
                that is not an argmax result.
        """
        from vocablens.undertrained import undertrained
        from vocablens.undertrained.beside import argmax_verdicts as verdicts_of

        checks.undertrained_options(candidates, batch_size)
        if argmax_verdicts is not None and not isinstance(argmax_verdicts, (list, tuple)):
            argmax_verdicts = verdicts_of(getattr(argmax_verdicts, "value", argmax_verdicts), self.borders.vocab_size)
        res = undertrained(self.borders, self.tokenizer, candidates=candidates or None, indicator=indicator,
                           verify=verify, batch_size=batch_size, progress=progress)
        return self._result(R.Undertrained, res, verdicts=argmax_verdicts)

    def undertrained_within(self: NeedsMatrices, budget_s: float, batch_size: int = 32,
                            progress=None) -> R.Undertrained:
        """Under-trained tokens (Land & Bartolo 2024) with verification bounded in time, as the report
        shows them: the tokenizer classes and indicators (O(V·d)) always, then the paper's candidates
        (the lowest 2% of the indicator) verified lowest first, ``batch_size`` at a time, until all are
        verified or ``budget_s`` seconds (counted from the start) are spent (the first batch always runs).
        A vocabulary too small for few-shot examples is left unverified (as ``vocablens undertrained``).

        Returns:
            :class:`~vocablens.handle.results.Undertrained`, its candidates those verified; options
            ``paper_candidates`` (the lowest 2%) and ``fraction`` (0.02).

        Raises:
            BadInput: batch_size < 1.
        """
        from vocablens.undertrained.analysis import DEFAULT_FRACTION, testable, undertrained
        from vocablens.undertrained.verify import pick_examples

        checks.at_least_ge("batch_size", batch_size)
        t0 = time.perf_counter()
        res = undertrained(self.borders, self.tokenizer, verify=False)  # classes, indicators, the paper's 2%
        paper = int(res.candidates.numel())
        ok = testable(res.classes)
        pool = ok.nonzero().flatten()
        examples = pick_examples(self.tokenizer, pool[res.indicators.values[pool].argsort(stable=True)].flip(0), ok)
        left = max(budget_s - (time.perf_counter() - t0), 0.0)
        res = undertrained(self.borders, self.tokenizer, candidates=paper, verify=bool(examples),
                           batch_size=batch_size, progress=progress, reuse=res, time_budget_s=left)
        return self._result(R.Undertrained, res, verdicts=None, paper_candidates=paper, fraction=DEFAULT_FRACTION)


__all__ = ["UndertrainedTokens"]
