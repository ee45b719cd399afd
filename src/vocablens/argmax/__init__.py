"""Layer 3: argmax geometry — tokens that can never be the top prediction, and the softmax bottleneck."""

from vocablens.argmax.exact import (
    ARGMAXABLE, DUPLICATE, PADDING, STAGES, UNARGMAXABLE, UNDECIDED, UNTRAINED, VERDICTS,
    ArgmaxResult, find_unargmaxable, verify_argmaxable,
)

__all__ = [
    "ARGMAXABLE", "DUPLICATE", "PADDING", "STAGES", "UNARGMAXABLE", "UNDECIDED", "UNTRAINED",
    "VERDICTS", "ArgmaxResult", "find_unargmaxable", "verify_argmaxable",
]
