"""What the exact argmax check returns: verdict names, stage names and :class:`ArgmaxResult`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from vocablens.errors import BadInput

VERDICTS = ("argmaxable", "unargmaxable", "duplicate", "undecided", "padding", "untrained")
ARGMAXABLE, UNARGMAXABLE, DUPLICATE, UNDECIDED, PADDING, UNTRAINED = range(6)
STAGES = ("prepare", "gemm", "reflect", "proof", "bias", "verify")
#: reason of a token left undecided because the run's time budget ran out
BUDGET = "budget"

#: progress callback ``(stage, done, total)``
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, eq=False)
class ArgmaxResult:
    """Verdict and certificate for every token of an unembedding.

    Attributes:
        verdict: int8 [V], index into :data:`VERDICTS`.
        stage: int8 [V], index into :data:`STAGES` of the stage that settled the token; -1 when the
            row was excluded (padding, never trained) or is undecided.
        margin: float64 [V], argmaxable tokens: the smallest margin ``l_i(x) - max_{j!=i} l_j(x)``
            (logit units, > 0) at the certificate ``x``; a certified lower bound for tokens settled
            by the float32 stages that were not re-checked in float64. NaN for other tokens.
        residual: float64 [V], unargmaxable tokens: ``||w_i - sum_j mu_j w_j||_2`` of the
            certificate (0 for a duplicate beaten by its twin's larger bias). NaN otherwise.
        group: int64 [V], id of the exact-duplicate group a row belongs to, -1 for unique rows.
        group_can_tie: group id -> whether that group can tie for first (its representative wins
            against every row outside the group for some x).
        in_play: bool [V], rows that were candidates and competitors (not excluded).
        center: float64 [d], the row mean ``mu`` subtracted before whitening.
        whiten: float64 [d, r], the whitening map ``A``; a stage-1 certificate is
            ``x_i = s_i * A @ (quant_scale * quant[row[i]])``.
        scale: float64 [V], the factor ``s_i`` above (1 without bias; with bias the no-bias
            certificate is scaled until the biases cannot change the winner).
        quant: int8 [n, r], the whitened distinct rows on the global grid ``quant_scale``.
        quant_scale: the grid step (whitened units).
        row: int64 [V], row of ``quant`` for a distinct row's representative, -1 otherwise.
        x_extra: token -> explicit certificate x (float64 [d]) for tokens settled after stage 1.
        combos: token -> (ids int64 [k], weights float64 [k]): the convex combination that
            dominates the token, or its explicit part when the token is in :attr:`combo_mean`.
        combo_mean: token -> ``(m_all, h)`` for certificates that also put weight on means of the
            distinct rows in play (rows with ``row >= 0``): ``m_all`` on the mean of all of them,
            and for each whitened axis k ``|h[k]|`` on the mean of those with ``quant[:, k] > 0``
            (h[k] > 0) or of the others (h[k] < 0). Those means include the token itself; with its
            own share removed and the rest renormalised, the weights are a convex combination of
            the other rows (:meth:`combination` expands it).
        combo_tilt: token -> ``(a, u, excluded)`` for certificates that are a dense combination of
            the distinct rows in play (rows with ``row >= 0``) outside ``excluded`` (token ids, the
            token among them): weight ``a + quant[row[j]] . u`` (float64 u [r]) on row j, each >= 0,
            summing to 1 less the explicit part in ``combos`` when there is one (a sparse proof's
            few rows plus a tilt for its gap: :func:`~vocablens.argmax.sparse.gap_tilts`;
            :mod:`~vocablens.argmax.tilt`; :meth:`combination` expands it).
        reasons: token -> why it is undecided (:data:`BUDGET` when the time budget ran out).
        timings: stage -> wall seconds.
        settled: stage -> tokens settled there.
        bias_used: whether a bias took part.
        rank: r, numerical rank of the centred rows (dimension after whitening).
        n_unique: distinct rows in play.
        tol: relative tolerance of the not-argmaxable certificates.
        verified_f64: tokens whose certificate was re-checked in float64 by the pipeline.
        interrupted: the run was stopped (Ctrl-C); unsettled tokens are ``undecided``.
        budget_s: the time budget the run was given (seconds), or None.
        cut_short: names of the stages the budget cut short or skipped (empty: ran to the end).
        cpu_s: stage -> CPU seconds of the process (all threads; the contention-free figure on a
            shared machine).
    """

    verdict: torch.Tensor
    stage: torch.Tensor
    margin: torch.Tensor
    residual: torch.Tensor
    group: torch.Tensor
    group_can_tie: dict
    in_play: torch.Tensor
    center: torch.Tensor
    whiten: torch.Tensor
    scale: torch.Tensor
    quant: torch.Tensor
    quant_scale: float
    row: torch.Tensor
    x_extra: dict = field(default_factory=dict)
    combos: dict = field(default_factory=dict)
    combo_mean: dict = field(default_factory=dict)
    combo_tilt: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    settled: dict = field(default_factory=dict)
    bias_used: bool = False
    rank: int = 0
    n_unique: int = 0
    tol: float = 1e-9
    verified_f64: int = 0
    interrupted: bool = False
    budget_s: float | None = None
    cut_short: tuple = ()
    cpu_s: dict = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Tokens per verdict, every verdict present (zeros included)."""
        c = torch.bincount(self.verdict.long(), minlength=len(VERDICTS))
        return {name: int(c[k]) for k, name in enumerate(VERDICTS)}

    def ids(self, verdict: str) -> torch.Tensor:
        """Token ids [k] int64 with the given verdict name."""
        return (self.verdict == VERDICTS.index(verdict)).nonzero().flatten()

    def combination(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The full convex combination that dominates token ``i``: (ids int64 [k], weights float64 [k]),
        weights >= 0 summing to 1, the mean-of-the-other-rows part (:attr:`combo_mean`) expanded.

        Raises:
            BadInput: token ``i`` has no not-argmaxable certificate.
        """
        i = int(i)
        if i not in self.combos:
            raise BadInput(f"token {i} is {VERDICTS[int(self.verdict[i])]}: it has no not-argmaxable certificate")
        ids, w = self.combos[i]
        if i in self.combo_tilt:
            a, u, ex = self.combo_tilt[i]
            rows = (self.row >= 0).nonzero().flatten()                    # distinct rows, by id
            lam = a + self.quant[self.row[rows]].double() @ u
            lam[torch.isin(rows, ex)] = 0.0
            lam = lam.clamp(min=0)                                        # >= 0 by the certificate
            full = torch.zeros(len(self.verdict), dtype=torch.float64)
            full[rows] = lam
            full.index_add_(0, ids, w)                                    # an explicit part, if any
            full[i] = 0.0
            keep = (full > 0).nonzero().flatten()
            return keep, full[keep] / full[keep].sum()
        if i not in self.combo_mean:
            return ids, w
        m_all, h = self.combo_mean[i]
        rows = (self.row >= 0).nonzero().flatten()                        # distinct rows, by id
        full = torch.zeros(len(self.verdict), dtype=torch.float64)
        full[rows] = m_all / len(rows)
        pos = (self.quant[self.row[rows]] > 0).double()                   # [n, r] half membership
        size = pos.sum(0)
        hp, hn = h.clamp(min=0), (-h).clamp(min=0)
        full[rows] += pos @ (hp / size) + (1 - pos) @ (hn / (len(rows) - size).clamp(min=1))
        full.index_add_(0, ids, w)
        full[i] = 0.0                                                     # the token's own share
        keep = (full > 0).nonzero().flatten()
        return keep, full[keep] / full[keep].sum()

    def certificate_x(self, W: torch.Tensor, i: int) -> torch.Tensor:
        """The argmaxable certificate of token ``i`` in the original coordinates, float64 [d].

        Args:
            W: the same ``[V, d]`` matrix the result was computed from (stage-1 certificates are
                rebuilt from it rather than stored).

        Raises:
            BadInput: token ``i`` has no argmaxable certificate (wrong verdict).
        """
        i = int(i)
        if i in self.x_extra:
            return self.x_extra[i]
        v = int(self.verdict[i])
        rep_ok = v == ARGMAXABLE or (v == DUPLICATE and int(self.stage[i]) >= 0 and not math.isnan(float(self.margin[i])))
        if not rep_ok:
            raise BadInput(f"token {i} is {VERDICTS[v]}: it has no argmaxable certificate")
        q = self.quant[int(self.row[i])].double()
        return float(self.scale[i]) * (self.whiten @ (self.quant_scale * q))


__all__ = ["VERDICTS", "ARGMAXABLE", "UNARGMAXABLE", "DUPLICATE", "UNDECIDED", "PADDING", "UNTRAINED",
           "STAGES", "BUDGET", "Progress", "ArgmaxResult"]
