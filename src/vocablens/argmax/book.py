"""The per-token verdict arrays of one scan, filled by the driver from the stages' frozen results.

Only :mod:`~vocablens.argmax.exact` (the driver) holds a :class:`VerdictBook`: it folds in what each
stage returned (:class:`~vocablens.argmax.decisions.StageResult`, the masks and duplicates of stage
prepare, the re-checked margins of stage verify) and freezes it into the
:class:`~vocablens.argmax.result.ArgmaxResult`. No stage reads or writes it.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vocablens.argmax.decisions import Argmaxable, Dominated, GaveUp, StageResult
from vocablens.argmax.result import (
    ARGMAXABLE, BUDGET, DUPLICATE, PADDING, STAGES, UNARGMAXABLE, UNDECIDED, UNTRAINED, ArgmaxResult,
)


class VerdictBook:
    """Verdicts and certificates by token (numpy arrays [V] unless noted), as the driver folds them.

    Attributes:
        verdict, stage, margin, residual, group, scale, in_play: as in
            :class:`~vocablens.argmax.result.ArgmaxResult`; dicts ``x_extra``, ``combos``,
            ``combo_mean``, ``combo_tilt``, ``reasons``, ``group_can_tie``; ``settled`` per stage.
        bound_ratio: float64 [n] per distinct row, the rigorous certificates' margin over slack
            (stage verify re-checks the smallest), or None before stage gemm.
        cut_short: the stages the budget cut short; interrupted: Ctrl-C; verified: re-checks done.
        timings, cpu: wall and CPU seconds per stage.
    """

    def __init__(self, V: int, d: int, tol: float, budget_s: float | None, bias_used: bool):
        self.V, self.d, self.tol, self.budget_s, self.bias_used = V, d, tol, budget_s, bias_used
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.verdict = np.full(V, UNDECIDED, dtype=np.int8)
        self.stage = np.full(V, -1, dtype=np.int8)
        self.margin = np.full(V, np.nan)
        self.residual = np.full(V, np.nan)
        self.group = np.full(V, -1, dtype=np.int64)
        self.scale = np.ones(V)
        self.in_play = np.ones(V, dtype=bool)
        self.x_extra, self.combos, self.combo_mean, self.combo_tilt = {}, {}, {}, {}
        self.reasons, self.group_can_tie = {}, {}
        self.timings = {s: 0.0 for s in STAGES}
        self.cpu = {s: 0.0 for s in STAGES}
        self.settled = {s: 0 for s in STAGES}
        self.cut_short: list = []
        self.interrupted = False
        self.verified = 0
        self.bound_ratio = None

    # ------------------------------------------------------------------ stage prepare
    def exclude(self, padding: np.ndarray | None, untrained: np.ndarray | None) -> None:
        """Padding and never-trained rows (bool [V] each, None: none) out of play, their verdicts set."""
        if padding is not None:
            self.verdict[padding] = PADDING
            self.in_play &= ~padding
        if untrained is not None:
            um = untrained & self.in_play
            self.verdict[um] = UNTRAINED
            self.in_play &= ~um
        self.verdict[self.in_play] = UNDECIDED

    def fold_duplicates(self, groups: list, dominated: list) -> None:
        """Exact duplicates: ``groups`` lists ``(members, top)`` (int64 token ids: the whole group and
        its largest-bias rows, which can only tie), ``dominated`` ``(token, twin)`` rows dominated by
        an identical row with a larger bias (``mu = e_twin``)."""
        for m, top in dominated:
            self.verdict[m] = UNARGMAXABLE
            self.stage[m] = 0
            self.residual[m] = 0.0
            self.combos[int(m)] = (torch.tensor([int(top)]), torch.tensor([1.0], dtype=torch.float64))
        for gid, (members, top) in enumerate(groups):
            self.group[members] = gid
            self.verdict[top] = DUPLICATE
            self.stage[top] = 0
        self.settled["prepare"] = int(np.sum(self.stage == 0))

    # ------------------------------------------------------------------ the stages' results
    def fold(self, res: StageResult) -> None:
        """Fold in one stage's result (in the order it decided its tokens)."""
        for c in res.decided:
            if isinstance(c, Argmaxable):
                self._argmaxable(c)
            elif isinstance(c, Dominated):
                self._dominated(c)
            else:
                self.reasons[int(c.token)] = c.reason
        if res.bound_ratio is not None:
            pos, ratio = res.bound_ratio
            if self.bound_ratio is None:
                self.bound_ratio = np.asarray(ratio, dtype=np.float64).copy()
            else:
                self.bound_ratio[pos] = ratio
        if res.cut:
            self.cut(res.name)
        self.interrupted |= res.interrupted

    def _argmaxable(self, c: Argmaxable) -> None:
        t = c.token
        if c.scale is not None:
            self.scale[t] = c.scale
        if c.x is not None:
            self.x_extra[t] = c.x
        if self.verdict[t] == DUPLICATE:
            self.group_can_tie[int(self.group[t])] = True
        else:
            self.verdict[t] = ARGMAXABLE
        self.stage[t] = c.stage
        self.margin[t] = c.margin
        self.settled[STAGES[c.stage]] += 1

    def _dominated(self, c: Dominated) -> None:
        t = c.token
        if self.verdict[t] == DUPLICATE:
            self.group_can_tie[int(self.group[t])] = False
        else:
            self.verdict[t] = UNARGMAXABLE
        self.stage[t] = c.stage
        self.residual[t] = c.residual
        self.combos[t] = (c.ids, c.weights)
        if c.mean is not None:
            self.combo_mean[t] = c.mean
        if c.tilt is not None:
            self.combo_tilt[t] = c.tilt
        self.settled[STAGES[c.stage]] += 1

    def argmaxable_candidates(self) -> np.ndarray:
        """Token ids with an argmaxable certificate from stage gemm on (stage verify's candidates)."""
        return np.nonzero((self.stage >= 1) & ~np.isnan(self.margin))[0]

    def fold_verify(self, tokens: np.ndarray, margins: np.ndarray) -> None:
        """Stage verify's float64 margins for ``tokens``: a token not reached (NaN) marks the stage
        cut short; a margin <= 0 never leaves the verdict standing (the token becomes undecided)."""
        for t, m in zip(tokens, margins):
            if np.isnan(m):
                self.cut("verify")
                continue
            self.verified += 1
            if m > 0:
                self.margin[t] = m
            else:
                if self.verdict[t] == DUPLICATE:
                    self.group_can_tie.pop(int(self.group[t]), None)
                else:
                    self.verdict[t] = UNDECIDED
                self.reasons[int(t)] = f"float64 re-check of the certificate gave margin {m:.3g}"
                self.margin[t] = np.nan
        self.settled["verify"] = self.verified

    def cut(self, stage: str) -> None:
        """Record that ``stage`` was cut short (or skipped) by the budget."""
        if stage not in self.cut_short:
            self.cut_short.append(stage)

    def add_time(self, stage: str, wall: float, cpu: float) -> None:
        """Add a stage's wall and CPU seconds."""
        self.timings[stage] += wall
        self.cpu[stage] += cpu

    # ------------------------------------------------------------------ the result
    def result(self, scan=None, distinct=None) -> ArgmaxResult:
        """Freeze into an :class:`ArgmaxResult` (open tokens become undecided with a reason).
        ``scan``: the :class:`~vocablens.argmax.scan.Scan` (None when there was no whitening);
        ``distinct``: the distinct rows (None when stage prepare did not get that far)."""
        why = "interrupted" if self.interrupted else (BUDGET if self.cut_short else "not settled")
        for t in np.nonzero(self.verdict == UNDECIDED)[0]:
            self.reasons.setdefault(int(t), why)
        for t in ({} if distinct is None else distinct.twins):
            if int(self.group[t]) not in self.group_can_tie:      # the group's question is open
                self.reasons.setdefault(int(t), why)
        self.timings["total"] = time.perf_counter() - self.t0
        self.cpu["total"] = time.process_time() - self.c0
        n = 0 if distinct is None else len(distinct.ids)
        white = None if scan is None else scan.white
        center = torch.zeros(self.d, dtype=torch.float64) if white is None else torch.from_numpy(white.center)
        A = torch.zeros(self.d, 0, dtype=torch.float64) if white is None else torch.from_numpy(white.whiten)
        Q = torch.zeros(n, 0, dtype=torch.int8) if scan is None else scan.Q
        row = np.full(self.V, -1, dtype=np.int64) if distinct is None else distinct.position
        return ArgmaxResult(
            verdict=torch.from_numpy(self.verdict), stage=torch.from_numpy(self.stage),
            margin=torch.from_numpy(self.margin), residual=torch.from_numpy(self.residual),
            group=torch.from_numpy(self.group), group_can_tie=self.group_can_tie,
            in_play=torch.from_numpy(self.in_play), center=center, whiten=A,
            scale=torch.from_numpy(self.scale), quant=Q, quant_scale=1.0 if white is None else white.grid_step,
            row=torch.from_numpy(row), x_extra=self.x_extra, combos=self.combos,
            combo_mean=self.combo_mean, combo_tilt=self.combo_tilt, reasons=self.reasons, timings=self.timings,
            settled=self.settled, bias_used=self.bias_used, rank=0 if white is None else white.rank, n_unique=n,
            tol=self.tol, verified_f64=self.verified, interrupted=self.interrupted,
            budget_s=self.budget_s, cut_short=tuple(self.cut_short), cpu_s=dict(self.cpu))


__all__ = ["VerdictBook"]
