"""Linear programs for the exact argmax check (HiGHS through scipy): the fallback of the no-bias
proofs and stage ``bias`` (the lifted problem of Grivas, Bogoychev and Lopez 2022 for the rows
that are not argmaxable without bias; a bias can only rescue a token)."""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.state import U32, ScanState


def slack(st: ScanState, Y: torch.Tensor) -> np.ndarray:
    """Bound on the float32 rounding of ``Z y`` for each column of Y [r, m] (float64 [m])."""
    r = st.r
    return 2.02 * (r * U32 / (1 - r * U32) + 3 * U32) * Y.double().norm(dim=0).numpy() * st.white.z_norm_max + 1e-300


def lp_proof(st: ScanState, bz: np.ndarray | None, k: int, S, max_rounds: int):
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

    r = st.r
    zt = st.z64([k])[0]
    S = np.asarray(S, dtype=np.int64)
    Sset = set(S.tolist())
    has_b = bz is not None
    for _ in range(max_rounds):
        st.check_time()
        D = st.z64(S) - zt
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
        if tau <= st.tol * scaleD:
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
        sc = (st.Z @ yt).double().numpy()
        sl = float(slack(st, yt[:, None])[0])
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


def stage_bias(st: ScanState, fails: dict, max_rounds: int) -> None:
    """The lifted LP for each no-bias failure (bias in play); settles argmaxable or dominated."""
    bz = st.src.bias[st.distinct.ids]
    items = list(fails.items())
    for q, (t, (ids, wts)) in enumerate(items):
        st.check_time()
        k = int(st.distinct.position[t])
        out = lp_proof(st, bz, k, st.distinct.position[np.asarray(ids, dtype=np.int64)], max_rounds)
        if out[0] == "arg":
            y, s_, m0 = out[1], out[2], out[3]
            st.x_extra[t] = torch.from_numpy(st.white.whiten @ (y / s_))
            st.settle_arg(t, 4, m0)
        elif out[0] == "int":
            ids2, wts2 = st.distinct.ids[out[1]], out[2]
            rvec = st.rows64(ids2).T @ wts2 - st.rows64([t])[0]
            rn = float(np.linalg.norm(rvec))
            gap = float(st.src.bias[ids2] @ wts2 - st.src.bias[t])
            if rn <= st.tol * st.white.w_scale and gap >= -st.tol * (1.0 + abs(st.src.bias[t])):
                st.settle_unarg(t, ids2, wts2, rn, 4)
            else:
                st.reasons[t] = f"lifted LP certificate failed its check (residual {rn:.3g}, bias gap {gap:.3g})"
        else:
            st.reasons[t] = out[1]
        st.progress("bias", q + 1, len(items))
