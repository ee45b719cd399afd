"""What stage ``prepare`` of the exact argmax check makes: frozen, read by every later stage, written by none.

Follow one token ``t`` from the head to its verdict: :class:`SourceRows` holds its row ``W[t]`` and
bias; :class:`DistinctRows` says whether it is a distinct row (``position[t] = k >= 0``, ``ids[k] =
t``) or an exact twin of one; :class:`Whitening` maps its row to the whitened row
``z_k = (W[t] - center) @ whiten`` (float32 ``Z[k]``) and to the int8 grid row ``Q[k]`` of step
``grid_step``, whose rounding error is at most ``grid_error[k]``. The stages
(:mod:`~vocablens.argmax.certificates`, :mod:`~vocablens.argmax.proofs`, ...) read these through a
:class:`~vocablens.argmax.scan.Scan` and return what they decided
(:class:`~vocablens.argmax.decisions.StageResult`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SourceRows:
    """The scan's input, as numpy.

    Attributes:
        rows: ``W [V, d]`` float32 (float64 when given so); may be a file mapping.
        bias: ``b [V]`` float64, or None.
        defer: bool ``[V]`` rows whose proofs run last, or None.
        pages: a :class:`~vocablens.models.files.pages.PageRelease` over ``rows`` (gives a mapped W's pages
            back after a pass; a no-op otherwise).
    """

    rows: np.ndarray
    bias: np.ndarray | None
    defer: np.ndarray | None
    pages: object


@dataclass(frozen=True, eq=False)
class DistinctRows:
    """The distinct rows in play (exact duplicates grouped; one representative per group).

    Attributes:
        ids: int64 ``[n]`` token ids of the distinct rows, sorted (position k is row ``ids[k]``).
        position: int64 ``[V]`` the position k of a distinct row's token, -1 for every other token.
        twins: representative token id -> int64 ids of its exact twins (a group that can only tie).
    """

    ids: np.ndarray
    position: np.ndarray
    twins: dict


@dataclass(frozen=True, eq=False)
class Whitening:
    """The whitening of the distinct rows and their int8 grid (``z = (w - center) @ whiten = grid_step
    q + e``, ``||e|| <= grid_error``).

    Attributes:
        center: float64 ``[d]`` the mean of the distinct rows.
        whiten: float64 ``[d, r]`` the inverse square root of their covariance on its numerical range.
        w_scale: the largest centred row norm ``max ||w - center||`` (the not-argmaxable
            certificates' tolerance is relative to it).
        grid_step: the int8 grid's step (whitened units).
        grid_error: float64 ``[n]`` rigorous bounds on ``||z_k - grid_step q_k||`` (grid rounding plus
            the float32 storage of Z); ``grid_error_max`` their maximum.
        z_norm: float64 ``[n]`` ``||z_k||``; ``z_norm_max`` their maximum.
        bias_max: the largest bias of a distinct row (0 without bias).
        ball_reach: no point of the :class:`~vocablens.argmax.sparse.Ball` is farther than this from
            0 (whitened; inf when the whitening is ill-conditioned): a filter, never part of a verdict.
    """

    center: np.ndarray
    whiten: np.ndarray
    w_scale: float
    grid_step: float
    grid_error: np.ndarray
    grid_error_max: float
    z_norm: np.ndarray
    z_norm_max: float
    bias_max: float
    ball_reach: float

    @property
    def rank(self) -> int:
        """r, the dimension after whitening."""
        return int(self.whiten.shape[1])


__all__ = ["DistinctRows", "SourceRows", "Whitening"]
