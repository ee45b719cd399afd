"""Under-trained tokens (Land & Bartolo 2024, "Fishing for Magikarp"): rows training never reached.

Three steps, one module each: :mod:`~vocablens.undertrained.classes` (tokenizer analysis),
:mod:`~vocablens.undertrained.indicators` (from the two matrices), :mod:`~vocablens.undertrained.verify`
(prompting the model to repeat each candidate); :mod:`~vocablens.undertrained.analysis` runs them::

    import vocablens
    model, tok, borders, prov = vocablens.load("smollm2")
    res = vocablens.undertrained(borders, tok, candidates=500)
    res.counts(), res.verified          # rows per class; verified under-trained ids

``vocablens.undertrained`` is both this package and the function: once the package is imported it
shadows the root's entry point, so the package itself is callable (``__call__`` = :func:`undertrained`).
"""

import sys
import types

from vocablens.undertrained.analysis import (
    DEFAULT_FRACTION, THRESHOLD, VERDICTS, UndertrainedResult, compute_indicators, reference_rows, testable,
    undertrained,
)
from vocablens.undertrained.classes import CLASSES, TokenClasses, classify_tokens
from vocablens.undertrained.indicators import INDICATORS, Indicators, choose_indicator, first_principal_component
from vocablens.undertrained.verify import TEMPLATES, Verification, verify_tokens


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return undertrained(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["CLASSES", "DEFAULT_FRACTION", "INDICATORS", "TEMPLATES", "THRESHOLD", "VERDICTS", "Indicators",
           "TokenClasses", "UndertrainedResult", "Verification", "choose_indicator", "classify_tokens",
           "compute_indicators", "first_principal_component", "reference_rows", "testable", "undertrained",
           "verify_tokens"]
