"""How long the exact argmax scan of a head will take on this machine: a timed slice, not a guess.

The scan's cost is stated as a multiple of one fp32 all-pairs pass ``W Wᵀ`` of the same matrix
(``benchmarks/argmax.py`` prints that ratio for each head it runs). This module times a slice of that
pass here and now, scales it up to all V rows, and multiplies by the ratio: what the report says when
it sends a user to ``vocablens argmax``.
"""

from __future__ import annotations

import time

import torch

#: scan time / one fp32 all-pairs pass on the default model's head (49,152 x 576), from
#: ``benchmarks/argmax.py`` and rounded up, so the estimate is cautious (docs/performance-argmax.md).
#: Heads whose rows mostly fail the first certificate (the proofs dominate) take far longer.
SCAN_TO_ALL_PAIRS = 0.3


#: each stage's share of a scan's CPU seconds on the default model's head (``benchmarks/argmax.py``;
#: docs/performance-argmax.md); a progress report
#: inside a stage is turned into the fraction of the whole scan done by :func:`scan_fraction`
STAGE_SHARE = {"prepare": 0.24, "gemm": 0.46, "reflect": 0.12, "proof": 0.09, "bias": 0.0, "verify": 0.09}


def scan_fraction(stage: str, done: int, total: int) -> float:
    """Fraction (0..1) of a scan done when stage ``stage`` has done ``done`` of its ``total`` units:
    the :data:`STAGE_SHARE` of the stages before it plus its own share times ``done / total``
    (an unknown stage counts as none done). Used for an ETA: a scan's stages run in the order of
    :data:`vocablens.argmax.result.STAGES`."""
    from vocablens.argmax.result import STAGES

    if ":" in stage:                     # "prepare: covariance": a step of a stage, not counted apart
        stage, done = stage.split(":")[0], 0
    if stage not in STAGE_SHARE:
        return 0.0
    before = sum(STAGE_SHARE[s] for s in STAGES[: STAGES.index(stage)])
    own = STAGE_SHARE[stage] * (min(max(done, 0), total) / total if total > 0 else 0.0)
    return min(1.0, (before + own) / sum(STAGE_SHARE.values()))


def all_pairs_seconds(W: torch.Tensor, rows: int = 1024, cols: int = 16384, repeats: int = 2) -> float:
    """Seconds one fp32 all-pairs pass ``W Wᵀ`` [V, V] takes here, from a timed [rows, cols] slice.

    Args:
        W: [V, d] the head (any float dtype; timed in float32 on W's device).
        rows, cols: the slice multiplied (clipped to V); its time is scaled by V² / (rows · cols).
        repeats: the slice is timed this many times and the fastest kept (the first call warms up).

    Returns:
        seconds (float > 0). Costs about ``2 rows cols d`` FLOPs (a small slice of the full pass).
    Raises:
        ValueError: W not 2-D or empty.
    """
    if W.dim() != 2 or W.numel() == 0:
        raise ValueError(f"W must be a non-empty [V, d] matrix; got shape {tuple(W.shape)}")
    V = W.shape[0]
    r, c = min(rows, V), min(cols, V)
    A = W[:r].float()
    B = W[:c].float()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        (A @ B.T).sum().item()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9) * (V / r) * (V / c)


def scan_seconds(W: torch.Tensor, ratio: float = SCAN_TO_ALL_PAIRS) -> float:
    """Expected seconds of ``vocablens argmax`` on head ``W`` [V, d] on this machine now:
    ``ratio`` x :func:`all_pairs_seconds` (the machine's present load included)."""
    return ratio * all_pairs_seconds(W)
