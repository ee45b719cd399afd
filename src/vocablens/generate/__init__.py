"""Generating text through the two borders (layer 3: takes a ``Borders``, returns dataclasses).

* :mod:`~vocablens.generate.loop` — prefill with the head at the last position only, KV-cached
  decoding, sampling through :func:`vocablens.ops.sample`.
* :mod:`~vocablens.generate.early_exit` — an executed early exit through the logit or tuned lens,
  with CALM-style state propagation into the skipped layers' caches.
"""

from vocablens.generate.early_exit import ExitRule, StepRecord, load_tuned_lens
from vocablens.generate.loop import GeneratedToken, GenerationResult, generate

__all__ = ["ExitRule", "GeneratedToken", "GenerationResult", "StepRecord", "generate", "load_tuned_lens"]
