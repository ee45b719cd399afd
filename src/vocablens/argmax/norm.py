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
from typing import Callable

import torch

from vocablens.argmax.blocks import GATHER_ROWS
from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops.rows import row_logprobs, row_softmax


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


#: float64 bytes of one block of the norm problem's rows (W' is never held whole)
NORM_BLOCK_BYTES = 16 * 2 ** 20


class _Rows:
    """The rows ``W' = (W[ids] diag(gain), centred for a LayerNorm) * logit_scale`` [n, d] float64,
    made afresh from W by blocks of :data:`NORM_BLOCK_BYTES` (each row exactly as a whole float64
    copy would hold it), so the norm bounds need W plus one block, not two more copies of W."""

    def __init__(self, W: torch.Tensor, ids: torch.Tensor, model: NormModel, scale: float):
        from vocablens.models.files.pages import PageRelease

        self.W, self.ids, self.model, self.scale = W, ids, model, scale
        self.step = max(1, NORM_BLOCK_BYTES // (8 * max(1, int(W.shape[1]))))
        self.whole = len(ids) == W.shape[0]                 # every row: slices, no gather
        # a file-mapped W gives its pages back after each block (results unchanged)
        self.pages = PageRelease(W.numpy() if W.dtype in (torch.float32, torch.float64) else None)

    def _raw(self, s: int, e: int) -> torch.Tensor:
        rows = self.W[s:e] if self.whole else self.W[self.ids[s:e]]
        out = rows.to(torch.float64, copy=True)             # a copy even when W is float64 (folded in place)
        if self.whole:
            self.pages.release(s, e)
        else:
            self.pages.release_all()
        return out

    def _fold(self, X: torch.Tensor) -> torch.Tensor:
        X.mul_(self.model.gain)
        if self.model.centred:
            X.sub_(X.mean(1, keepdim=True))                 # rows projected on sum(u) = 0
        return X.mul_(self.scale) if self.scale != 1.0 else X

    def shift_and_mean(self, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``W[ids] @ shift`` (the rows before the gain) [n] and the mean row of W' [d], one pass."""
        cs, tot = [], torch.zeros(self.W.shape[1], dtype=torch.float64)
        for s in range(0, len(self.ids), self.step):
            X = self._raw(s, s + self.step)
            cs.append(X @ shift)
            tot += self._fold(X).sum(0)
        c = torch.cat(cs) if cs else torch.zeros(0, dtype=torch.float64)
        return c, tot / max(1, len(self.ids))

    def blocks(self):
        """``(start, W'[start:start + b])`` by blocks, float64 [b, d]."""
        for s in range(0, len(self.ids), self.step):
            yield s, self._fold(self._raw(s, s + self.step))

    def take(self, pos: torch.Tensor) -> torch.Tensor:
        """``W'[pos]`` float64 [len(pos), d] for positions into ``ids``."""
        rows = self.ids[pos]
        if not self.pages.active:
            return self._fold(self.W[rows].to(torch.float64, copy=True))
        X = torch.empty(len(rows), self.W.shape[1], dtype=torch.float64)
        for s in range(0, len(rows), GATHER_ROWS):      # scattered rows: a few pages at a time
            X[s:s + GATHER_ROWS] = self.W[rows[s:s + GATHER_ROWS]]
            self.pages.release_all()
        return self._fold(X)

    def take32(self, pos: torch.Tensor) -> torch.Tensor:
        """``W'[pos]`` rounded to float32 [len(pos), d], made by blocks (one float32 result)."""
        out = torch.empty(len(pos), self.W.shape[1], dtype=torch.float32)
        for s in range(0, len(pos), self.step):
            out[s:s + self.step] = self.take(pos[s:s + self.step])
        return out

    def select_scores(self, U: torch.Tensor) -> torch.Tensor:
        """``W' U`` in float32 [n, k] for U [d, k], as ``W (gain * U') * scale`` (``U'`` centred for
        a LayerNorm): the gain acts on the hidden side, so no float64 copy of the rows is made.
        Only picks the active set (the rounding differs from W' in float32 by a few ulps; the
        bounds are evaluated exactly in float64 over every row)."""
        if self.model.centred:
            U = U - U.mean(0, keepdim=True)
        X = (U * self.model.gain[:, None] * self.scale).float()    # [d, k]
        if self.whole and self.W.dtype == torch.float32:
            out = self.W @ X
        else:
            out = torch.cat([(self.W[self.ids[s:s + self.step]].float() @ X)
                             for s in range(0, len(self.ids), self.step)])
        self.pages.release_all()
        return out

    def t_matmul(self, P: torch.Tensor) -> torch.Tensor:
        """``W'^T P`` float64 [d, k] for P [n, k], summed over the blocks."""
        out = torch.zeros(self.W.shape[1], P.shape[1], dtype=torch.float64)
        for s, Wb in self.blocks():
            out += Wb.T @ P[s:s + len(Wb)]
        return out


def norm_reachability(
    W: torch.Tensor,
    tokens: torch.Tensor | list[int],
    model: NormModel,
    bias: torch.Tensor | None = None,
    competitors: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    iters: int = 200,
    homogeneous_verdicts: dict[int, bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
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
        progress: ``progress(done, iters)`` after each round of ``refresh`` gradient steps (and
            ``(0, iters)`` before the first).

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
    # memory: the rows W' = (W diag(gain), centred) * logit_scale are never held whole; they are
    # made afresh by blocks of NORM_BLOCK_BYTES (float64), so the peak is W itself plus [n, k] scores
    rows = _Rows(W.detach().cpu(), ids, model, logit_scale)
    c, mu = rows.shift_and_mean(model.shift)                    # [n], [d] float64
    if bias is not None:
        c = c + bias.detach().cpu().double()[ids]
    c = c * logit_scale
    R = model.radius
    k = len(tok)
    tp = pos[tok]
    Wown = rows.take(tp)                                           # [k, d] float64 own rows
    best_U = _ascend(rows, Wown, tp, c, mu, R, iters, progress)
    p_lower, p_upper, m_lo, m_up = _bounds(rows, best_U, Wown, tp, c, R)
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


def _ascend(rows: "_Rows", Wown: torch.Tensor, tp: torch.Tensor, c: torch.Tensor, mu: torch.Tensor, R: float,
            iters: int, progress) -> torch.Tensor:
    """Maximise each own row's log-probability over the norm ball ``||u|| <= R``: ``iters`` steps of
    accelerated projected gradient (Nesterov/FISTA) on an active set. Returns U float64 [d, k].

    ``Wown`` float64 [k, d] the own rows, ``tp`` [k] their positions among the rows, ``c`` [n] the
    rows' offsets (bias, shift), ``mu`` [d] the rows' mean. Every ``refresh`` steps the M rows with
    the largest logits (per token) are taken from one full product."""
    d, k, n = Wown.shape[1], len(tp), len(c)
    # Lipschitz constant of grad f: Var_p(v.w) <= max ||w - mu||^2
    L = max(float(((Wb - mu) ** 2).sum(1).max()) for _, Wb in rows.blocks()) + 1e-12
    U = torch.zeros(d, k, dtype=torch.float64)
    Yv = U.clone()
    tk = 1.0
    refresh, M = 20, min(n, 512)
    ar = torch.arange(k)
    Wt = Wown.float()                                              # [k, d] own rows
    cf = c.float()
    Ws = cs = None
    if progress is not None:
        progress(0, iters)
    for it0 in range(0, iters, refresh):
        if progress is not None and it0:
            progress(it0, iters)
        Ws = cs = None                          # the last refresh's rows [k, M, d] go before W is read whole
        Lg = rows.select_scores(U) + cf[:, None]                   # [n, k] float32
        Lg[tp, ar] = math.inf
        top = torch.topk(Lg, M, dim=0).indices.T                    # [k, M], own row included
        del Lg
        Ws = rows.take32(top.reshape(-1)).reshape(k, M, d)        # [k, M, d]
        cs = cf[top]                                               # [k, M]
        Uf, Yf = U.T.float().contiguous(), Yv.T.float().contiguous()
        for _ in range(min(refresh, iters - it0)):
            lg = torch.bmm(Ws, Yf[:, :, None])[:, :, 0] + cs      # [k, M]
            P = row_softmax(lg, 1)                                 # over the M candidate rows
            G = torch.bmm(P[:, None, :], Ws)[:, 0, :] - Wt         # [k, d]
            Un = Yf - G / L
            Un = Un * torch.clamp(R / Un.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
            tn = (1 + math.sqrt(1 + 4 * tk * tk)) / 2
            Yf = Un + ((tk - 1) / tn) * (Un - Uf)
            Yf = Yf * torch.clamp(R / Yf.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
            Uf, tk = Un, tn
        U, Yv = Uf.T.double(), Yf.T.double()
    if progress is not None:
        progress(iters, iters)
    return U


def _bounds(rows: "_Rows", U: torch.Tensor, Wown: torch.Tensor, tp: torch.Tensor, c: torch.Tensor, R: float):
    """Certified bounds at the final vectors U [d, k], in float64 over all rows: ``(p_lower, p_upper,
    margin_lower, margin_upper)`` [k] each (the probability at U and the duality bound on the best
    reachable one; the own logit's margin at U and the bound from the softmax-weighted competitors)."""
    k = len(tp)
    LgE = torch.cat([Wb @ U for _, Wb in rows.blocks()]) + c[:, None]    # [n, k]
    lpE = row_logprobs(LgE, 0)                                 # [n, k] float64 log-probs over the vocabulary
    fE = -lpE[tp, torch.arange(k)]
    PE = lpE.exp()
    Pm = PE.clone()
    Pm[tp, torch.arange(k)] = 0
    Pm = Pm / Pm.sum(0, keepdim=True).clamp_min(1e-300)
    WP = rows.t_matmul(torch.cat([PE, Pm], 1))                    # [d, 2k]: one pass for both
    GE = WP[:, :k] - Wown.T                                        # gradient of f at U
    p_lower = torch.exp(-fE)
    gap_lb = fE - (GE * U).sum(0) - R * GE.norm(dim=0)             # lower bound on f*
    p_upper = torch.exp(-torch.clamp(gap_lb, min=0.0))
    own = LgE[tp, torch.arange(k)]
    Lx = LgE.clone()
    Lx[tp, torch.arange(k)] = -math.inf
    m_lo = own - Lx.max(0).values
    diff = Wown.T - WP[:, k:]                                      # sum mu_j (w'_t - w'_j) [d, k]
    m_up = R * diff.norm(dim=0) + (c[tp] - Pm.T @ c)
    return p_lower, p_upper, m_lo, m_up


def reach_hidden(model: NormModel, u: torch.Tensor) -> torch.Tensor:
    """The LM-head input ``h = gain * u + shift`` [..., d] for norm-space vectors u [..., d] (float64)."""
    return u.double() * model.gain + model.shift

