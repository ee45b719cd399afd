"""Sampling the next token over a large vocabulary without a full sort.

Temperature, top-k, top-p (nucleus; Holtzman et al. 2020) and min-p (Nguyen et al. 2024) are each a
per-row threshold, applied in transformers' order (temperature -> top-k -> top-p -> min-p):

* top-k keeps every token whose scaled logit is >= the k-th largest (ties at the k-th are all kept,
  as transformers' ``TopKLogitsWarper`` and T5X's ``topk_mask`` do);
* top-p, on the top-k-renormalised distribution, keeps every token whose logit is >= that of the
  token at rank m, the first rank (probabilities in descending order) where the cumulative mass
  reaches p (ties kept; at least one token always stays);
* min-p keeps tokens with p_i >= min_p * p_max, i.e. exp(s_i - s_max) >= min_p (renormalisation
  does not change a ratio to the maximum, so min-p is an intersection).

How it avoids sorting V entries (the answer is the full sort's, computed with fewer operations):
top-k runs first (a partial selection, O(V)), and top-p is then solved inside the k sorted
survivors. Without top-k, top-p looks at the top ``window`` tokens (a partial selection) and a
logsumexp over V; when the window's mass reaches p and the cut is not a tie at the window's edge, the
nucleus lies inside it (the fallback rule of vllm-project/vllm#48913). Otherwise a sort-free threshold
search (bisection on the logit threshold, as t5x's ``binary_search.py`` does on probabilities) finds
the cut in O(V) work per step. Min-p needs only the row maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import check_float

#: tokens examined by the top-p fast path when no top-k is given
TOP_P_WINDOW = 1024

#: a cumulative mass within this much of top_p counts as reaching it. Masses are summed in float64,
#: but float32 logits hold a probability only to ~1e-7 relative per unit of logit magnitude (a
#: logit of 64 is rounded by up to 3.8e-6), so an exact comparison at a boundary (probs .3/.1/.1/.5,
#: top_p=0.8) would keep 2 tokens from float64 logits and 4 from the same logits in float32.
#: With the slack both dtypes keep the same set for logits of magnitude up to ~64.
TOP_P_SLACK = 1e-5


@dataclass(frozen=True)
class _Plan:
    """The filtered distribution of every row: either on a window of candidate ids or dense over V.

    ``ids`` [B, n] int64 (None when dense), ``probs`` [B, n] or [B, V] in the compute dtype (zero
    outside the kept set), ``greedy`` [B] int64 or None.
    """

    ids: torch.Tensor | None
    probs: torch.Tensor | None
    greedy: torch.Tensor | None = None


# ------------------------------------------------------------------------------------- argument checks
def _number(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise BadInput(f"`{name}` must be a number; got {x!r}")
    x = float(x)
    if not math.isfinite(x):
        raise BadInput(f"`{name}` must be finite; got {x}")
    return x


def check_sampling_args(temperature=1.0, top_k=None, top_p=None, min_p=None) -> None:
    """Raise :class:`BadInput` naming the argument: temperature >= 0, top_k an int >= 1 (not a bool),
    top_p in (0, 1], min_p in [0, 1]."""
    if _number("temperature", temperature) < 0:
        raise BadInput(f"`temperature` must be >= 0 (0 = greedy); got {temperature}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise BadInput(f"`top_k` must be an int >= 1 or None; got {top_k!r}")
        if top_k < 1:
            raise BadInput(f"`top_k` must be >= 1; got {top_k}")
    if top_p is not None and not 0 < _number("top_p", top_p) <= 1:
        raise BadInput(f"`top_p` must be in (0, 1]; got {top_p}")
    if min_p is not None and not 0 <= _number("min_p", min_p) <= 1:
        raise BadInput(f"`min_p` must be in [0, 1]; got {min_p}")


def _prepare(logits: torch.Tensor, mask: torch.Tensor | None, temperature: float) -> tuple[torch.Tensor, bool]:
    """-> scaled logits s [B, V] in float32 (float64 for float64 input), masked columns -inf."""
    check_float("logits", logits)
    squeeze = logits.dim() == 1
    x = logits[None] if squeeze else logits
    if x.dim() != 2:
        raise ShapeMismatch(f"logits must be [B, V] or [V]; got {tuple(logits.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise BadInput(f"logits {tuple(logits.shape)} are empty")
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.to(dt)
    defined = (s < math.inf).all()  # checked below, with the masked rows: one host sync for both
    if mask is not None:
        if mask.dtype != torch.bool or tuple(mask.shape) not in ((s.shape[1],), tuple(s.shape)):
            raise ShapeMismatch(f"mask must be bool [V] or [B, V] for logits {tuple(s.shape)}; "
                                f"got {mask.dtype} {tuple(mask.shape)}")
        s = s.masked_fill(~mask.to(s.device).expand_as(s), float("-inf"))
    alive = s.amax(1) > -math.inf
    ok_defined, ok_alive = torch.stack([defined, alive.all()]).tolist()
    if not ok_defined:
        raise BadInput("logits hold NaN or +inf: the distribution is undefined")
    if not ok_alive:
        bad = int((~alive).nonzero()[0])
        raise BadInput(f"row {bad} of the logits is masked entirely (all -inf): no token can be sampled")
    if temperature > 0 and temperature != 1.0:
        s = _scale(s, temperature)
    return s, squeeze


def _scale(s: torch.Tensor, temperature: float) -> torch.Tensor:
    """(s - max) / temperature, computed in float64 and returned in s's dtype: every temperature > 0
    works, down to the smallest float (1e-40 overflows a float32 division; a gap over T that leaves
    the float range becomes -inf, i.e. probability 0, which is the limit T -> 0 tends to)."""
    s64 = s.to(torch.float64)
    return ((s64 - s64.amax(1, keepdim=True)) / temperature).to(s.dtype)


# ------------------------------------------------------------------------------------- the filters
def _cut_sorted(vals: torch.Tensor, lse: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of descending ``vals`` [B, n] and their float64 logsumexp over the row ``lse`` [B, 1] ->
    (logit threshold [B], float64 mass of the n values [B]). The threshold is the value at the first
    rank whose cumulative probability reaches p (see :data:`TOP_P_SLACK`; the last rank when the row
    never reaches it); masses are summed in float64 whatever the logits' dtype."""
    cum = torch.exp(vals.to(torch.float64) - lse).cumsum(1)
    m = (cum < p - TOP_P_SLACK).sum(1).clamp(max=vals.shape[1] - 1)
    return vals.gather(1, m[:, None])[:, 0], cum[:, -1]


def _window_plan(s: torch.Tensor, top_k, top_p, min_p, window: int) -> _Plan | None:
    """The filtered distribution on a sorted window of the top scores, or None when the kept set
    may reach beyond the window (then the dense path decides)."""
    B, V = s.shape
    n = V if top_k is None else min(int(top_k), V)
    if top_k is None:
        if top_p is None or top_p >= 1:
            return None
        n = min(window, V)
    vals, ids = torch.topk(s, n, dim=1, sorted=True)
    if top_k is not None and n < V:
        kth = vals[:, -1:]
        n_ge = int(((s >= kth) & torch.isfinite(s)).sum(1).max())
        if n_ge > n:  # ties at the k-th value: keep them all, so widen the window to hold them
            vals, ids = torch.topk(s, n_ge, dim=1, sorted=True)
            vals = vals.masked_fill(vals < kth, float("-inf"))
    keep = torch.isfinite(vals)
    if top_p is not None and top_p < 1:
        lse64 = torch.logsumexp((s if top_k is None else vals).to(torch.float64), 1, keepdim=True)
        cut, cum_end = _cut_sorted(vals, lse64, top_p)
        if top_k is None and vals.shape[1] < V:
            # the nucleus must end inside the window, and its last logit must not tie the window's edge
            inside = (cum_end >= top_p - TOP_P_SLACK) & (cut > vals[:, -1])
            if not bool(inside.all()):
                return _mixed(s, vals, ids, inside, top_p, min_p) if bool(inside.any()) else None
        keep &= vals >= cut[:, None]
    if min_p is not None and min_p > 0:
        keep &= torch.exp(vals - vals[:, :1]) >= min_p
    w = torch.where(keep, torch.exp(vals - vals[:, :1]), torch.zeros_like(vals))
    return _Plan(ids=ids, probs=w / w.sum(1, keepdim=True))


def _mixed(s, vals, ids, inside, top_p, min_p) -> _Plan:
    """Rows whose nucleus fits the window keep its result; the others take the dense path."""
    out = torch.zeros_like(s)
    win = _window_plan(s[inside], None, top_p, min_p, vals.shape[1])
    out[inside] = torch.zeros_like(s[inside]).scatter_(1, win.ids, win.probs)
    out[~inside] = _dense_plan(s[~inside], None, top_p, min_p).probs
    return _Plan(ids=None, probs=out)


def _top_p_threshold(s: torch.Tensor, p: float, small: int = 2048, sample: int = 4096) -> torch.Tensor:
    """Sort-free top-p cut per row, [B]: the largest logit value t among the row's values with
    sum_{s_i >= t} softmax(s)_i >= p - :data:`TOP_P_SLACK` (masses in float64).

    A selection by value: the cut lies in a candidate set C with M < p <= M + mass(C), M the exact
    mass above C. Each round sorts a strided sample of C (``sample`` values) to estimate where the
    cumulative mass crosses p, takes two pivots a few standard errors either side of it, measures
    the exact mass above each (one pass over C) and keeps the part of C that holds the cut
    (FlashInfer's dual-pivot idea; the pivots only narrow the search, the masses are exact). Once C
    has at most ``small`` values, a sort of C alone finishes it. A round that cannot narrow C splits
    it at the midpoint of its values instead.
    """
    s64 = s.to(torch.float64)  # masses in float64 whatever the logits' dtype; the cut is one of s's values
    e = torch.exp(s64 - torch.logsumexp(s64, 1, keepdim=True))
    p = p - TOP_P_SLACK
    cut = torch.empty(s.shape[0], dtype=s.dtype, device=s.device)
    for r in range(s.shape[0]):
        c, ec = s64[r], e[r]
        if float(c.min()) == -math.inf:
            fin = torch.isfinite(c)
            c, ec = c[fin], ec[fin]
        M = 0.0
        while c.numel() > small:
            n = c.numel()
            sub_c, sub_e = c[:: max(1, n // sample)], ec[:: max(1, n // sample)]
            sv, so = torch.sort(sub_c, descending=True)
            est = M + (n / sub_c.numel()) * sub_e[so].cumsum(0)
            j = int((est < p).sum())
            delta = max(16, int(4 * math.sqrt(sub_c.numel())))
            hi_t, lo_t = sv[max(j - delta, 0)], sv[min(j + delta, sv.numel() - 1)]
            above_hi, below_lo = c > hi_t, c < lo_t
            m_hi = M + float(ec[above_hi].sum())
            if m_hi >= p:
                keep = above_hi
            else:
                m_lo = m_hi + float(ec[~above_hi & ~below_lo].sum())
                keep, M = (below_lo, m_lo) if m_lo < p else (~above_hi & ~below_lo, m_hi)
            if int(keep.sum()) == n:  # no progress: split at the midpoint of the values
                lo, hi = float(c.min()), float(c.max())
                if lo == hi:
                    break
                t = (lo + hi) / 2
                up = c >= (t if lo < t <= hi else hi)
                m_up = M + float(ec[up].sum())
                keep, M = (up, M) if m_up >= p else (~up, m_up)
            c, ec = c[keep], ec[keep]
        vals, order = torch.sort(c, descending=True)
        cum = M + ec[order].cumsum(0)
        m = min(int((cum < p).sum()), vals.numel() - 1)
        cut[r] = vals[m]
    return cut


def _dense_plan(s: torch.Tensor, top_k, top_p, min_p) -> _Plan:
    """The filtered distribution over all V columns (thresholds, no sort)."""
    smax = s.amax(1, keepdim=True)
    t = s
    thr = torch.full_like(smax, -math.inf)
    if top_k is not None:
        thr = torch.topk(s, int(top_k), dim=1, sorted=False).values.amin(1, keepdim=True)
        if top_p is not None:
            t = s.masked_fill(s < thr, float("-inf"))
    if top_p is not None:
        thr = torch.maximum(thr, _top_p_threshold(t, float(top_p))[:, None])
    e = torch.exp(s - smax)
    keep = (s >= thr) if min_p is None else (s >= thr) & (e >= min_p)
    w = torch.where(keep, e, torch.zeros_like(e))
    return _Plan(ids=None, probs=w / w.sum(1, keepdim=True))


def _plan(logits, temperature, top_k, top_p, min_p, mask, window, method) -> tuple[_Plan, torch.Tensor, bool]:
    check_sampling_args(temperature, top_k, top_p, min_p)
    if method not in ("auto", "dense", "sort"):
        raise BadInput(f"method must be 'auto', 'dense' or 'sort'; got {method!r}")
    s, squeeze = _prepare(logits, mask, float(temperature))
    V = s.shape[1]
    top_k = None if top_k is None or top_k >= V else int(top_k)
    top_p = None if top_p is None or top_p >= 1 else float(top_p)
    min_p = None if not min_p else float(min_p)
    if float(temperature) == 0:
        return _Plan(ids=None, probs=None, greedy=s.argmax(1)), s, squeeze
    if method == "sort":
        return _Plan(ids=None, probs=reference_probs(s, 1.0, top_k, top_p, min_p)), s, squeeze
    plan = None
    if method == "auto" and (top_k is not None or top_p is not None):
        plan = _window_plan(s, top_k, top_p, min_p, int(window))
    if plan is None:
        plan = _dense_plan(s, top_k, top_p, min_p)
    return plan, s, squeeze


# ------------------------------------------------------------------------------------- public API
def probs_after_filters(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                        top_p: float | None = None, min_p: float | None = None, *,
                        mask: torch.Tensor | None = None, window: int = TOP_P_WINDOW,
                        method: str = "auto") -> torch.Tensor:
    """The exact distribution :func:`sample` draws from, [B, V] (or [V] for a [V] input).

    Args:
        logits: [B, V] or [V], float32/bfloat16/float16 (computed in float32) or float64 (in float64).
            -inf columns are never drawn; NaN or +inf raise.
        temperature: >= 0; 0 is greedy (a one-hot row at the argmax, the lowest id on ties).
        top_k: int >= 1 or None; top_p: (0, 1] or None; min_p: [0, 1] or None (see the module doc for
            the order and the tie rules).
        mask: bool [V] or [B, V], True for columns that may be drawn (e.g. the real vocabulary, so
            padding rows never are).
        window: tokens the top-p fast path examines before falling back to the threshold search.
        method: ``auto`` (top-k/window fast path, else thresholds), ``dense`` (thresholds over V only)
            or ``sort`` (the full-sort reference, for benchmarks).

    Returns:
        float32 (float64 for float64 input) probabilities summing to 1 per row; 0 outside the kept set.

    Raises:
        BadInput: an argument out of range (naming it), NaN/+inf logits, a row masked entirely.
        ShapeMismatch: logits not [B, V]/[V] or not floating; a mask of the wrong shape.
    """
    plan, s, squeeze = _plan(logits, temperature, top_k, top_p, min_p, mask, window, method)
    if plan.greedy is not None:
        out = torch.zeros_like(s)
        out.scatter_(1, plan.greedy[:, None], 1.0)
    elif plan.ids is None:
        out = plan.probs
    else:
        out = torch.zeros_like(s).scatter_(1, plan.ids, plan.probs)
    return out[0] if squeeze else out


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, min_p: float | None = None,
           generator: torch.Generator | None = None, *, mask: torch.Tensor | None = None,
           num_samples: int = 1, window: int = TOP_P_WINDOW, method: str = "auto") -> torch.Tensor:
    """Draw token ids from the filtered distribution of :func:`probs_after_filters`.

    The arguments not listed below are those of :func:`probs_after_filters`.

    Args:
        generator: a seeded ``torch.Generator`` makes the draw reproducible (greedy draws no random
            numbers).
        num_samples: independent draws per row, with replacement.

    Returns:
        int64 [B] (``num_samples=1``), [B, num_samples] otherwise; [] / [num_samples] for a [V] input.

    Raises:
        BadInput, ShapeMismatch: as :func:`probs_after_filters`; num_samples < 1.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise BadInput(f"num_samples must be an int >= 1; got {num_samples!r}")
    plan, s, squeeze = _plan(logits, temperature, top_k, top_p, min_p, mask, window, method)
    if plan.greedy is not None:
        out = plan.greedy[:, None].expand(-1, num_samples)
    else:
        pick = torch.multinomial(plan.probs.float() if plan.probs.dtype == torch.float16 else plan.probs,
                                 num_samples, replacement=True, generator=generator)
        out = pick if plan.ids is None else plan.ids.gather(1, pick)
    out = out[:, 0] if num_samples == 1 else out
    return out[0] if squeeze else out


def reference_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, min_p: float | None = None) -> torch.Tensor:
    """The same filters computed the plain way, with a full sort of every row (for tests and
    benchmarks): [B, V] -> [B, V] probabilities in the input's dtype (float32 at least)."""
    s = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    if temperature > 0 and temperature != 1.0:
        s = _scale(s, temperature)
    vals, order = torch.sort(s, dim=1, descending=True, stable=True)
    keep = torch.isfinite(vals)
    if top_k is not None and top_k < s.shape[1]:
        keep &= vals >= vals[:, top_k - 1:top_k]
    t = vals.masked_fill(~keep, float("-inf"))
    if top_p is not None and top_p < 1:
        t64 = t.to(torch.float64)
        cum = torch.exp(t64 - torch.logsumexp(t64, 1, keepdim=True)).cumsum(1)
        m = (cum < top_p - TOP_P_SLACK).sum(1).clamp(max=s.shape[1] - 1)
        keep &= vals >= vals.gather(1, m[:, None])
    if min_p is not None and min_p > 0:
        keep &= torch.exp(vals - vals[:, :1]) >= min_p
    w = torch.where(keep, torch.exp(vals - vals[:, :1]), torch.zeros_like(vals))
    w = w / w.sum(1, keepdim=True)
    return torch.zeros_like(s).scatter_(1, order, w)


__all__ = ["TOP_P_SLACK", "TOP_P_WINDOW", "check_sampling_args", "probs_after_filters", "reference_probs", "sample"]
