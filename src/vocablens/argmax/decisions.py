"""What a stage of the exact argmax check decided: frozen values, one per token, and the stage's result.

Each stage (``gemm``, ``reflect``, ``proof``, ``bias``) takes the rows still open and returns a
:class:`StageResult`: the tokens it decided, each with its certificate (:class:`Argmaxable`,
:class:`Dominated`) or the reason it gave up on (:class:`GaveUp`), in the order it decided them, and
the rows it left open. Only the driver (:mod:`~vocablens.argmax.exact`) folds them into the per-token
arrays (:class:`~vocablens.argmax.book.VerdictBook`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vocablens.argmax.blocks import OutOfTime


@dataclass(frozen=True, eq=False)
class Argmaxable:
    """Token ``token`` is argmaxable (or, a duplicate group's representative, its group can tie).

    Attributes:
        stage: index into :data:`~vocablens.argmax.result.STAGES`.
        margin: the certified margin (logit units; inf for the only distinct row).
        x: the certificate, float64 [d] (None for stage gemm's: ``scale A (qs q_t)``, from Q).
        scale: stage gemm's certificate scale (1 without bias); None for the others.
    """

    token: int
    stage: int
    margin: float
    x: torch.Tensor | None = None
    scale: float | None = None


@dataclass(frozen=True, eq=False)
class Dominated:
    """Token ``token`` is not argmaxable: a convex combination of other rows dominates it.

    Attributes:
        stage: index into :data:`~vocablens.argmax.result.STAGES`.
        residual: ``||w_t - combination||_2`` (float64, original coordinates).
        ids, weights: int64 [k] token ids and float64 [k] weights of the explicit part.
        mean: ``(m_all, h float64 [r])`` weights on means of the distinct rows, or None
            (:attr:`~vocablens.argmax.result.ArgmaxResult.combo_mean`).
        tilt: ``(a, u float64 [r], excluded int64 token ids)``, or None
            (:attr:`~vocablens.argmax.result.ArgmaxResult.combo_tilt`).
    """

    token: int
    stage: int
    residual: float
    ids: torch.Tensor
    weights: torch.Tensor
    mean: tuple | None = None
    tilt: tuple | None = None


@dataclass(frozen=True, eq=False)
class GaveUp:
    """Token ``token`` stays undecided: ``reason`` says why (a solver failure, a row budget)."""

    token: int
    reason: str


def dominated(t: int, ids, wts, rn: float, stage: int, means=None, tilt=None) -> Dominated:
    """A :class:`Dominated` from numpy ids [k] and weights [k]; ``means = (m_all, h)``,
    ``tilt = (a, u, excluded)`` as numpy."""
    mean = None if means is None else (float(means[0]), torch.from_numpy(np.asarray(means[1], dtype=np.float64)))
    if tilt is not None:
        tilt = (float(tilt[0]), torch.from_numpy(np.asarray(tilt[1], dtype=np.float64)),
                torch.from_numpy(np.asarray(tilt[2], dtype=np.int64)))
    return Dominated(token=int(t), stage=stage, residual=rn,
                     ids=torch.from_numpy(np.asarray(ids, dtype=np.int64)),
                     weights=torch.from_numpy(np.asarray(wts, dtype=np.float64)), mean=mean, tilt=tilt)


def argmaxable_at(scan, t: int, stage: int, y: np.ndarray, m0: float, x: np.ndarray | None = None) -> Argmaxable:
    """Token t argmaxable with the whitened no-bias certificate y [r] and margin m0 (scaled for the
    bias: :meth:`~vocablens.argmax.scan.Scan.bias_scaled`); ``x = A y`` when the caller has it (a
    batch of them is one GEMM)."""
    s, m = scan.bias_scaled(t, m0)
    return Argmaxable(token=int(t), stage=stage, margin=m,
                      x=torch.from_numpy(s * (scan.white.whiten @ y if x is None else x)))


@dataclass(frozen=True, eq=False)
class StageResult:
    """What one stage decided, and the rows it left open.

    Attributes:
        name: the stage (:data:`~vocablens.argmax.result.STAGES`).
        decided: :class:`Argmaxable`, :class:`Dominated` and :class:`GaveUp` values, in the order found.
        open: int64 positions (into ``distinct.ids``) of the rows still open, sorted.
        cut: the run's budget ran out during the stage.
        interrupted: Ctrl-C during the stage.
        bound_ratio: ``(positions, ratios)``: each rigorous certificate's margin over its rounding
            slack (stage verify re-checks the smallest), or None.
        start_top: stage reflect's top competitors per open row (position -> int64 [k], best first).
        lifted: stage proof with a bias: token -> ``(ids, weights)`` of its no-bias combination (the
            bias stage decides them).
        q_dot_max: stage gemm's ``max_k q_k . q_k`` (exact; None from the other stages).
        products: stage gemm's exact int8 kernel (:func:`~vocablens.argmax.kernels.exact_products`).
    """

    name: str
    decided: tuple
    open: np.ndarray
    cut: bool = False
    interrupted: bool = False
    bound_ratio: tuple | None = None
    start_top: dict = field(default_factory=dict)
    lifted: dict = field(default_factory=dict)
    q_dot_max: float | None = None
    products: object = None


class Stopped:
    """Context manager of one stage's body: the budget running out (:class:`~vocablens.argmax.blocks.OutOfTime`)
    or Ctrl-C ends the body, and is recorded here, so the stage still returns what it decided."""

    def __init__(self):
        self.cut = False
        self.interrupted = False

    def __enter__(self) -> "Stopped":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and issubclass(kind, OutOfTime):
            self.cut = True
            return True
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.interrupted = True
            return True
        return False


def still_open(rows: np.ndarray, decided, position: np.ndarray) -> np.ndarray:
    """The positions among ``rows`` whose token is not decided (by an :class:`Argmaxable` or a
    :class:`Dominated` in ``decided``)."""
    done = [int(position[c.token]) for c in decided if not isinstance(c, GaveUp)]
    rows = np.asarray(rows, dtype=np.int64)
    return rows[~np.isin(rows, np.asarray(done, dtype=np.int64))] if done and len(rows) else rows


__all__ = ["Argmaxable", "Dominated", "GaveUp", "StageResult", "Stopped", "argmaxable_at", "dominated", "still_open"]
