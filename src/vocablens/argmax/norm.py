"""Argmax under the model's own final norm: what a token can reach, not only what it could in theory.

After an RMSNorm or a LayerNorm the LM head sees ``h = gamma * u + beta`` with ``||u||_2 <= R``,
``R = sqrt(d)`` (the norm divides by the root mean square; its epsilon keeps ``||u||`` just below R),
and for a LayerNorm also ``sum(u) = 0``. The logits are ``l(u) = W' u + c`` with
``W' = W diag(gamma)`` (rows projected on ``sum = 0`` for a LayerNorm) and ``c = W beta + b``.

For a token t the highest probability the model can give it is
``p* = max_{||u|| <= R} softmax(l(u))_t = exp(-f*)``, ``f(u) = logsumexp_j l_j(u) - l_t(u)``, a
convex problem (log-sum-exp of affine maps minus an affine map, on a ball). We solve it by
accelerated projected gradient (FISTA; Beck and Teboulle 2009) and report two bounds:

- lower: ``p_t(u)`` at the explicit hidden vector u found (float64);
- upper: from the Frank-Wolfe duality gap ``f* >= f(u) - grad f(u).u - R ||grad f(u)||``.

"Argmaxable under the norm" (the max-margin problem on the ball, a second-order cone program) is
bounded by the same run: the smallest margin at u is a lower bound; for any weights ``mu`` on the
other tokens, ``R ||sum mu_j (w'_t - w'_j)|| + sum mu_j (c_t - c_j)`` is an upper bound (minimax on
the ball), evaluated at the softmax weights of the solution. Without any bias and without centring
the problem is homogeneous, so the verdict equals the unconstrained one (scale x onto the ball).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch


@dataclass(frozen=True, eq=False)
class NormModel:
    """The final norm's output set: ``h = gain * u + shift``, ``||u|| <= radius`` (``sum u = 0`` if centred).

    Attributes:
        gain: float64 [d]; shift: float64 [d]; radius: R (= sqrt(d)); centred: LayerNorm-type;
        kind: ``"rmsnorm"`` or ``"layernorm"`` (as probed, not as named by the model family);
        max_error: largest |h - model(h)| seen when the probe was checked on random inputs.
    """

    gain: torch.Tensor
    shift: torch.Tensor
    radius: float
    centred: bool
    kind: str
    max_error: float


@dataclass(frozen=True, eq=False)
class NormReach:
    """Reachability of some tokens under a final norm.

    Attributes:
        tokens: int64 [k].
        p_lower: float64 [k], probability reached at the explicit hidden vector ``u`` (a lower bound
            on the highest reachable probability).
        p_upper: float64 [k], an upper bound on the highest reachable probability.
        margin_lower / margin_upper: float64 [k], bounds on the best smallest margin
            ``max_u (l_t(u) - max_{j != t} l_j(u))`` over the ball (logit units).
        argmaxable: int8 [k], 1 argmaxable under the norm, 0 not, -1 undecided by the bounds.
        u: float64 [k, d], the hidden vectors (norm outputs are ``gain * u + shift``).
        model: the :class:`NormModel` used.
        iters: gradient iterations run.
    """

    tokens: torch.Tensor
    p_lower: torch.Tensor
    p_upper: torch.Tensor
    margin_lower: torch.Tensor
    margin_upper: torch.Tensor
    argmaxable: torch.Tensor
    u: torch.Tensor
    model: NormModel
    iters: int


def probe_norm(norm: torch.nn.Module, d: int) -> NormModel | None:
    """Find gain, shift and centring of a final norm module by feeding it probe vectors.

    Uses inputs with zero mean and unit mean square (so the norm's own scale is 1): for pairs
    (k, k+1) the vector ``sqrt(d/2) (e_k - e_{k+1})`` returns ``gain_k sqrt(d/2)`` at k. The zero
    vector gives the shift; the all-ones vector tells centring (a LayerNorm maps it to the shift).
    The model is then checked on random inputs. Works for RMSNorm, LayerNorm and variants with
    ``(1 + weight)`` gains without naming a family.

    Returns:
        :class:`NormModel`, or None when the module does not behave like ``gain * x / rms + shift``.
    """
    p = next(norm.parameters(), None)
    dtype = p.dtype if p is not None else torch.float32
    dev = p.device if p is not None else torch.device("cpu")
    with torch.no_grad():
        run = lambda x: norm(x.to(dev, dtype)).double().cpu()  # noqa: E731
        zero = run(torch.zeros(1, d))[0]
        if d < 2:
            return None
        c = math.sqrt(d / 2)
        X = torch.zeros(d, d, dtype=torch.float64)
        ar = torch.arange(d)
        X[ar, ar] = c
        X[ar, (ar + 1) % d] = -c
        H = run(X)
        gain = (H[ar, ar] - zero) / c
        ones = run(torch.ones(1, d))[0]
        centred = bool(torch.allclose(ones, zero, atol=1e-3 * (1 + zero.abs().max().item())))
        g = torch.Generator().manual_seed(0)
        R = torch.randn(8, d, generator=g, dtype=torch.float64) * 3 + 1
        Hr = run(R)
        Rc = R - R.mean(1, keepdim=True) if centred else R
        u = Rc / Rc.pow(2).mean(1, keepdim=True).sqrt()
        pred = u * gain + zero
        err = float((Hr - pred).abs().max())
        tol = 1e-2 * float(Hr.abs().max()) + 1e-6
    if not math.isfinite(err) or err > tol:
        return None
    return NormModel(gain=gain, shift=zero, radius=math.sqrt(d), centred=centred,
                     kind="layernorm" if centred else "rmsnorm", max_error=err)


def norm_reachability(
    W: torch.Tensor,
    tokens: torch.Tensor | list[int],
    model: NormModel,
    bias: torch.Tensor | None = None,
    competitors: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    iters: int = 200,
    homogeneous_verdicts: dict[int, bool] | None = None,
) -> NormReach:
    """Highest reachable probability and argmaxability of ``tokens`` under a final norm.

    Args:
        W: unembedding ``[V, d]``; bias: ``[V]`` or None.
        tokens: ids to analyse (k of them; cost ``iters * 4 V d k`` FLOPs).
        model: from :func:`probe_norm`.
        competitors: bool ``[V]`` rows that take part in the softmax (default all).
        logit_scale: factor on the logits (probabilities change with it, the argmax does not).
        homogeneous_verdicts: token -> unconstrained verdict, used when the problem is homogeneous
            (no bias, no shift, no centring), where it is exact.

    Returns:
        :class:`NormReach`.

    Raises:
        ShapeMismatch: gain width differs from W's; BadInput: a token id out of range.
    """
    V, d = W.shape
    if model.gain.shape != (d,):
        raise ShapeMismatch(f"norm gain has {tuple(model.gain.shape)} entries, W rows have {d}")
    tok = torch.as_tensor(tokens, dtype=torch.long).flatten()
    if len(tok) and (int(tok.min()) < 0 or int(tok.max()) >= V):
        raise BadInput(f"token ids must lie in [0, {V}); got {tok.tolist()[:8]}")
    keep = torch.ones(V, dtype=torch.bool) if competitors is None else competitors.clone().bool()
    keep[tok] = True
    ids = keep.nonzero().flatten()
    pos = torch.full((V,), -1, dtype=torch.long)
    pos[ids] = torch.arange(len(ids))
    # memory: one float64 and one float32 copy of the rows in play ([n, d]); the rest by blocks
    Wg = W.detach().cpu()[ids].double()                             # [n, d]
    c = Wg @ model.shift
    Wg.mul_(model.gain)
    if model.centred:
        Wg.sub_(Wg.mean(1, keepdim=True))                           # rows projected on sum(u) = 0
    if bias is not None:
        c = c + bias.detach().cpu().double()[ids]
    Wg.mul_(logit_scale)
    c = c * logit_scale
    R = model.radius
    k = len(tok)
    tp = pos[tok]
    Wf = Wg.float()
    mu = Wg.mean(0)
    # Lipschitz constant of grad f: Var_p(v.w) <= max ||w - mu||^2
    L = max(float(((Wg[s:s + 16384] - mu) ** 2).sum(1).max()) for s in range(0, len(ids), 16384)) + 1e-12
    U = torch.zeros(d, k, dtype=torch.float64)
    Yv = U.clone()
    tk = 1.0

    def f_and_grad(Uc: torch.Tensor):
        """Exact float64 objective, gradient, logits and softmax over all rows at Uc [d, k]."""
        Lg = Wg @ Uc + c[:, None]                                  # [n, k]
        lse = torch.logsumexp(Lg, 0)
        own = Lg[tp, torch.arange(k)]
        P = torch.softmax(Lg, 0)
        G = (P.T @ Wg).T - Wg[tp].T
        return lse - own, G, Lg, P

    # Accelerated projected gradient on an active set: every `refresh` steps the M rows with the
    # largest logits (per token) are taken from one full product; the final bounds use all rows.
    refresh, M = 20, min(len(ids), 512)
    ar = torch.arange(k)
    Wt = Wf[tp]                                                    # [k, d] own rows
    cf = c.float()
    for it0 in range(0, iters, refresh):
        Lg = Wf @ U.float() + cf[:, None]                          # [n, k]
        Lg[tp, ar] = math.inf
        top = torch.topk(Lg, M, dim=0).indices.T                    # [k, M], own row included
        Ws = Wf[top]                                               # [k, M, d]
        cs = cf[top]                                               # [k, M]
        Uf, Yf = U.T.float().contiguous(), Yv.T.float().contiguous()
        for _ in range(min(refresh, iters - it0)):
            lg = torch.bmm(Ws, Yf[:, :, None])[:, :, 0] + cs      # [k, M]
            P = torch.softmax(lg, 1)
            G = torch.bmm(P[:, None, :], Ws)[:, 0, :] - Wt         # [k, d]
            Un = Yf - G / L
            Un = Un * torch.clamp(R / Un.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
            tn = (1 + math.sqrt(1 + 4 * tk * tk)) / 2
            Yf = Un + ((tk - 1) / tn) * (Un - Uf)
            Yf = Yf * torch.clamp(R / Yf.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
            Uf, tk = Un, tn
        U, Yv = Uf.T.double(), Yf.T.double()
    best_U = U
    # exact float64 evaluation at the final vectors
    fE, GE, LgE, PE = f_and_grad(best_U)
    p_lower = torch.exp(-fE)
    gap_lb = fE - (GE * best_U).sum(0) - R * GE.norm(dim=0)        # lower bound on f*
    p_upper = torch.exp(-torch.clamp(gap_lb, min=0.0))
    own = LgE[tp, torch.arange(k)]
    Lx = LgE.clone()
    Lx[tp, torch.arange(k)] = -math.inf
    m_lo = own - Lx.max(0).values
    Pm = PE.clone()
    Pm[tp, torch.arange(k)] = 0
    Pm = Pm / Pm.sum(0, keepdim=True).clamp_min(1e-300)
    diff = Wg[tp].T - Wg.T @ Pm                                     # sum mu_j (w'_t - w'_j) [d, k]
    m_up = R * diff.norm(dim=0) + (c[tp] - Pm.T @ c)
    verdict = torch.full((k,), -1, dtype=torch.int8)
    verdict[m_lo > 0] = 1
    verdict[m_up < 0] = 0
    homog = bias is None and float(model.shift.abs().max()) == 0.0 and not model.centred
    if homog and homogeneous_verdicts is not None:
        for q, t in enumerate(tok.tolist()):
            if t in homogeneous_verdicts and verdict[q] == -1:
                verdict[q] = 1 if homogeneous_verdicts[t] else 0
    return NormReach(tokens=tok, p_lower=p_lower, p_upper=torch.maximum(p_upper, p_lower),
                     margin_lower=m_lo, margin_upper=m_up, argmaxable=verdict, u=best_U.T.contiguous(),
                     model=model, iters=iters)


def reach_hidden(model: NormModel, u: torch.Tensor) -> torch.Tensor:
    """The LM-head input ``h = gain * u + shift`` [..., d] for norm-space vectors u [..., d] (float64)."""
    return u.double() * model.gain + model.shift

