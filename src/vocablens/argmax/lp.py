"""Linear programs for the exact argmax check (HiGHS through scipy): the fallback of the no-bias
proofs and stage ``bias`` (the lifted problem of Grivas, Bogoychev and Lopez 2022 for the rows
that are not argmaxable without bias; a bias can only rescue a token)."""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.blocks import U32
from vocablens.argmax.decisions import Argmaxable, GaveUp, StageResult, Stopped, dominated, still_open
from vocablens.argmax.scan import Scan


def slack(scan: Scan, Y: torch.Tensor) -> np.ndarray:
    """Bound on the float32 rounding of ``Z y`` for each column of Y [r, m] (float64 [m])."""
    r = scan.r
    return 2.02 * (r * U32 / (1 - r * U32) + 3 * U32) * Y.double().norm(dim=0).numpy() * scan.white.z_norm_max + 1e-300


def lp_proof(scan: Scan, bz: np.ndarray | None, k: int, S, max_rounds: int):
    """HiGHS LP with constraint generation (Grivas et al.'s Chebyshev LP, reformulated).

    max tau  s.t.  (z_j - z_k).y + (b_j - b_k) s + tau <= 0  (j in S),  -1 <= y <= 1,
    0 <= s <= 1 (s fixed to 0 without bias), tau <= 1. Its optimum is
    ``min_{mu in simplex} ||sum mu_j (z_j - z_k)||_1 + max(0, sum mu_j (b_k - b_j))``; the row duals
    are ``mu``. The verdict comes from the optimal value, never from a solver status.

    Returns ``("arg", y, s, margin)``, ``("int", positions, weights)`` or ``("undecided", why)``.

    Raises:
        OutOfTime: the run's budget ran out (checked once per constraint-generation round).
    """
    from scipy.optimize import linprog

    r = scan.r
    zt = scan.z64([k])[0]
    S = np.asarray(S, dtype=np.int64)
    Sset = set(S.tolist())
    has_b = bz is not None
    for _ in range(max_rounds):
        scan.check_time()
        D = scan.z64(S) - zt
        bcol = (bz[S] - bz[k])[:, None] if has_b else np.zeros((len(S), 1))
        Aub = np.hstack([D, bcol, np.ones((len(S), 1))])
        c = np.zeros(r + 2)
        c[-1] = -1.0
        bounds = [(-1.0, 1.0)] * r + [(0.0, 1.0 if has_b else 0.0), (None, 1.0)]
        try:
            res = linprog(c, A_ub=Aub, b_ub=np.zeros(len(S)), bounds=bounds, method="highs",
                          options={"primal_feasibility_tolerance": 1e-10,
                                   "dual_feasibility_tolerance": 1e-10})
        except Exception as exc:  # noqa: BLE001
            return ("undecided", f"HiGHS failed ({exc})")
        if res.status != 0 or res.x is None:
            return ("undecided", f"HiGHS status {res.status}: {res.message}")
        tau = float(res.x[-1])
        scaleD = float(np.median(np.abs(D).sum(1))) + 1e-30
        if tau <= scan.tol * scaleD:
            mu = np.clip(-np.asarray(res.ineqlin.marginals), 0, None)
            if mu.sum() <= 0:
                return ("undecided", "HiGHS gave no dual multipliers")
            mu /= mu.sum()
            sup = mu > 1e-15
            return ("int", S[sup], mu[sup] / mu[sup].sum())
        y, s_ = res.x[:r], float(res.x[r])
        if has_b and s_ <= 0:
            # tau > 0 with s = 0 would be a no-bias certificate; it cannot happen for a no-bias
            # failure, but use it if it does (scale the bias away)
            s_ = 1e-12
        yt = torch.from_numpy(np.ascontiguousarray(y)).float()
        sc = (scan.Z @ yt).double().numpy()
        sl = float(slack(scan, yt[:, None])[0])
        if has_b:
            sc = sc / s_ + bz
            sl = sl / s_
        own = sc[k]
        sc[k] = -np.inf
        viol = np.nonzero(sc >= own - sl)[0]
        if len(viol) == 0:
            return ("arg", y, s_ if has_b else 1.0, float(own - sc.max()))
        new = [int(v) for v in viol[np.argsort(-sc[viol])] if int(v) not in Sset][:500]
        if not new:
            return ("undecided", "LP constraint generation stalled")
        Sset.update(new)
        S = np.concatenate([S, np.array(new, dtype=np.int64)])
    return ("undecided", "LP did not converge")


def stage_bias(scan: Scan, lifted: dict, max_rounds: int) -> StageResult:
    """The lifted LP for each no-bias failure (``lifted``: token -> ``(ids, weights)`` from stage
    proof): argmaxable with the bias, dominated, or given up on with the reason."""
    decided: list = []
    with Stopped() as stop:
        _lifted_lps(scan, lifted, max_rounds, decided)
    rows = scan.distinct.position[np.asarray(list(lifted), dtype=np.int64)]
    return StageResult(name="bias", decided=tuple(decided), open=still_open(np.sort(rows), decided, scan.distinct.position),
                       cut=stop.cut, interrupted=stop.interrupted)


def _lifted_lps(scan: Scan, lifted: dict, max_rounds: int, decided: list) -> None:
    """The body of :func:`stage_bias`; appends to ``decided`` as it goes."""
    bz = scan.source.bias[scan.distinct.ids]
    items = list(lifted.items())
    for q, (t, (ids, wts)) in enumerate(items):
        scan.check_time()
        k = int(scan.distinct.position[t])
        out = lp_proof(scan, bz, k, scan.distinct.position[np.asarray(ids, dtype=np.int64)], max_rounds)
        if out[0] == "arg":
            y, s_, m0 = out[1], out[2], out[3]
            decided.append(Argmaxable(token=int(t), stage=4, margin=m0,
                                      x=torch.from_numpy(scan.white.whiten @ (y / s_))))
        elif out[0] == "int":
            ids2, wts2 = scan.distinct.ids[out[1]], out[2]
            rvec = scan.rows64(ids2).T @ wts2 - scan.rows64([t])[0]
            rn = float(np.linalg.norm(rvec))
            gap = float(scan.source.bias[ids2] @ wts2 - scan.source.bias[t])
            if rn <= scan.tol * scan.white.w_scale and gap >= -scan.tol * (1.0 + abs(scan.source.bias[t])):
                decided.append(dominated(t, ids2, wts2, rn, 4))
            else:
                decided.append(GaveUp(int(t), f"lifted LP certificate failed its check (residual {rn:.3g}, bias gap {gap:.3g})"))
        else:
            decided.append(GaveUp(int(t), out[1]))
        scan.progress("bias", q + 1, len(items))
