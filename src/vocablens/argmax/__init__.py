"""Layer 3: argmax geometry — tokens that can never be the top prediction, and the softmax bottleneck.

- :func:`find_unargmaxable` (plain tensors ``W [V, d]``, optional ``bias [V]``): exact verdicts with
  float64-checked certificates (Demeter et al. 2020; Grivas et al. 2022).
- :func:`argmax_for_borders`: the same on a model's LM head, padding and never-trained rows
  excluded by default, plus bounds under the final norm (:func:`norm_reachability`).
- :func:`softmax_bottleneck`: spectra and numerical ranks of ``W`` and of the log-probabilities
  over real contexts (Yang et al. 2018).
"""

from vocablens.argmax.bottleneck import Bottleneck, context_hidden, softmax_bottleneck
from vocablens.argmax.exact import find_unargmaxable, verify_argmaxable
from vocablens.argmax.result import (
    ARGMAXABLE, BUDGET, DUPLICATE, PADDING, STAGES, UNARGMAXABLE, UNDECIDED, UNTRAINED, VERDICTS,
    ArgmaxResult,
)
from vocablens.argmax.model import ModelArgmax, argmax_for_borders, expected_scan_seconds
from vocablens.argmax.norm import NormModel, NormReach, norm_reachability, probe_norm

__all__ = [
    "ARGMAXABLE", "BUDGET", "DUPLICATE", "PADDING", "STAGES", "UNARGMAXABLE", "UNDECIDED", "UNTRAINED",
    "VERDICTS", "ArgmaxResult", "find_unargmaxable", "verify_argmaxable", "ModelArgmax",
    "argmax_for_borders", "expected_scan_seconds", "NormModel", "NormReach", "norm_reachability", "probe_norm", "Bottleneck",
    "context_hidden", "softmax_bottleneck",
]
