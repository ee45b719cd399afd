"""Chunked log-probabilities and cross-entropy through the LM head, never materializing [N, V].

Two entry points:

* :func:`token_logprobs` (forward only): per-token log-probability of given targets, and on request
  the top-k log-probabilities, the entropy and the logsumexp, for ``hidden [N, d]`` and
  ``weight [V, d]`` (+ bias, logit scale, final-logit softcap). It chunks over tokens and, when a
  chunk of full rows would not fit the memory budget, over the vocabulary too, with an online
  log-sum-exp (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; the same
  blockwise LSE as Cut Cross-Entropy, Wijmans et al. 2024, arXiv 2411.09009, §3).
* :func:`linear_cross_entropy` (training): a custom autograd Function. For scalar reductions the
  gradient is computed during the forward pass, chunk by chunk, as in Liger-Kernel's fused linear
  cross-entropy (Hsu et al. 2024, arXiv 2410.10989, §3.2): chunk logits are written by one GEMM into
  a reused float32 buffer, turned into the softmax in place, corrected into ``dL/dlogits`` in place,
  and consumed by the two gradient GEMMs of the same pass. ``reduction="none"`` keeps only the
  per-token logsumexp and recomputes chunk logits in backward, so per-token upstream gradients are
  applied before the sum over tokens (the Liger #968 bug).

Numerics: logits may come out of the GEMM in the input dtype (bf16 GEMMs are the fast path), but the
max, the exp-sum, the per-token loss and every reduction are float32; gradients for weight and bias
are accumulated across chunks in float32 and cast once at the end (Liger #512, PR #830).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import INT_DTYPES, check_head, check_ids, check_nonempty, check_softcap

#: bounds of the default budget for one chunk of float32 logits, in bytes.
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 4 * 2**20, 64 * 2**20


def default_chunk_bytes(N: int, V: int) -> int:
    """Default float32 chunk budget: 1/32 of the full [N, V] float32 logits, within [4 MiB, 64 MiB]."""
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, N * V * 4 // 32)))


@dataclass(frozen=True)
class TokenLogprobs:
    """Result of :func:`token_logprobs` (all float32 except ids).

    Attributes:
        logprob: [N] log p(target) in nats, or None when no targets were given.
        lse: [N] logsumexp of the (scaled, softcapped) logits, nats.
        entropy: [N] entropy of the next-token distribution in nats, or None.
        topk_logprobs: [N, k] the k largest log-probabilities, descending, or None.
        topk_ids: [N, k] int64 their token ids (lowest id first among ties), or None.
    """

    logprob: torch.Tensor | None
    lse: torch.Tensor
    entropy: torch.Tensor | None
    topk_logprobs: torch.Tensor | None
    topk_ids: torch.Tensor | None


def chunk_sizes(N: int, V: int, chunk_bytes: int | None = None, *, min_tokens: int = 16,
                vocab_tiles: bool = True) -> tuple[int, int]:
    """Tokens per chunk and vocabulary columns per tile for a float32 chunk of ``chunk_bytes``.

    Args:
        N: number of tokens; V: vocabulary rows; chunk_bytes: budget for one [n, v] float32 chunk.
        min_tokens: never fewer tokens per chunk than this (GEMM efficiency).
        vocab_tiles: allow tiling the vocabulary (forward-only path); the training path needs full rows.

    Returns:
        ``(n_tokens, n_vocab)`` with ``n_tokens * n_vocab * 4 <= max(chunk_bytes, min_tokens * n_vocab * 4)``.
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(N, V)
    per_row = 4 * V
    n = max(1, chunk_bytes // per_row)
    if not vocab_tiles:
        return int(max(1, min(N, max(n, min_tokens)))), V
    if n >= min(min_tokens, N):
        return int(max(1, min(N, n))), V
    n = max(1, min(N, min_tokens))
    v = max(256, chunk_bytes // (4 * n))
    return int(n), int(min(V, v))


def _logits_into(h_c: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int, v1: int,
                 logit_scale: float, softcap: float | None, buf32: torch.Tensor,
                 lowbuf: torch.Tensor | None) -> torch.Tensor:
    """float32 logits [n, v1-v0] of a chunk written into ``buf32`` (a view of a reused buffer).

    logits = softcap(scale · (h W[v0:v1]ᵀ + b[v0:v1])), with softcap(x) = c·tanh(x / c).
    """
    W = weight[v0:v1]
    n, v = h_c.shape[0], v1 - v0
    z = buf32[: n * v].view(n, v)
    if h_c.dtype == torch.float32:
        if bias is not None:
            torch.addmm(bias[v0:v1], h_c, W.t(), out=z)
        else:
            torch.mm(h_c, W.t(), out=z)
    else:
        lo = lowbuf[: n * v].view(n, v)
        if bias is not None:
            torch.addmm(bias[v0:v1], h_c, W.t(), out=lo)
        else:
            torch.mm(h_c, W.t(), out=lo)
        z.copy_(lo)
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def _flatten(hidden: torch.Tensor, targets: torch.Tensor | None):
    if hidden.dim() < 2:
        raise ShapeMismatch(f"hidden must be [N, d] or [B, T, d]; got {tuple(hidden.shape)}")
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    t = None
    if targets is not None:
        if tuple(targets.shape) != tuple(lead):
            raise ShapeMismatch(f"targets {tuple(targets.shape)} must match hidden {tuple(hidden.shape)} "
                                f"without its last dim, i.e. {tuple(lead)}")
        if targets.dtype not in INT_DTYPES:
            raise ShapeMismatch(f"targets must hold integer ids (int64/int32); got {targets.dtype} {tuple(targets.shape)}")
        t = targets.reshape(-1).to(torch.int64)
    return h, t, lead


@torch.no_grad()
def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None = None, *,
                   bias: torch.Tensor | None = None, logit_scale: float = 1.0, softcap: float | None = None,
                   top_k: int = 0, entropy: bool = False, chunk_bytes: int | None = None,
                   chunk_tokens: int | None = None, chunk_vocab: int | None = None) -> TokenLogprobs:
    """Forward-only log-probabilities through the LM head, chunked, never materializing [N, V].

    Args:
        hidden: [N, d] or [..., d] normed hidden states (the LM head's input), any float dtype.
        weight: [V, d] the unembedding ``W_U`` (same dtype as hidden).
        targets: [N] (or hidden's leading shape) int token ids in [0, V), or None.
        bias: [V] optional head bias. logit_scale: factor applied before the softcap.
        softcap: final-logit softcap c (logits = c·tanh(logits / c)), or None.
        top_k: also return the k most likely tokens per position (0 = no).
        entropy: also return the entropy (nats) per position.
        chunk_bytes: budget for one float32 chunk of logits (bytes; default
            :func:`default_chunk_bytes`); chunk_tokens / chunk_vocab
            override the derived sizes (the vocabulary is tiled when a chunk of full rows would not fit).

    Returns:
        :class:`TokenLogprobs` with tensors shaped like hidden's leading dims, float32.

    Raises:
        ShapeMismatch: d or dtypes disagree, targets' shape differs. BadInput: empty input,
        targets outside [0, V), top_k not in [0, V], bad softcap.

    Peak extra memory is one [n, v] float32 chunk (plus one in the input dtype for low-precision
    inputs) and O(N·k) outputs; the logsumexp is accumulated online over vocabulary tiles in float32.
    """
    check_head(hidden, weight, bias)
    check_softcap(softcap)
    h, t, lead = _flatten(hidden, targets)
    check_nonempty("hidden", h)
    V = weight.shape[0]
    if t is not None:
        check_ids("targets", t, V)
    if not (0 <= int(top_k) <= V):
        raise BadInput(f"top_k must be in [0, V={V}]; got {top_k}")
    N = h.shape[0]
    n_tok, n_voc = chunk_sizes(N, V, chunk_bytes)
    if chunk_tokens:
        n_tok = int(chunk_tokens)
    if chunk_vocab:
        n_voc = int(chunk_vocab)
    n_tok, n_voc = max(1, min(n_tok, N)), max(1, min(n_voc, V))
    dev = h.device
    buf32 = torch.empty(n_tok * n_voc, dtype=torch.float32, device=dev)
    lowbuf = None if h.dtype == torch.float32 else torch.empty(n_tok * n_voc, dtype=h.dtype, device=dev)
    lse_out = torch.empty(N, dtype=torch.float32, device=dev)
    lp_out = torch.empty(N, dtype=torch.float32, device=dev) if t is not None else None
    ent_out = torch.empty(N, dtype=torch.float32, device=dev) if entropy else None
    k = int(top_k)
    tv_out = torch.empty(N, k, dtype=torch.float32, device=dev) if k else None
    ti_out = torch.empty(N, k, dtype=torch.int64, device=dev) if k else None
    single_tile = n_voc >= V
    for a in range(0, N, n_tok):
        b = min(N, a + n_tok)
        h_c = h[a:b]
        n = b - a
        m = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
        s = torch.zeros(n, dtype=torch.float32, device=dev)
        q = torch.zeros(n, dtype=torch.float32, device=dev) if entropy else None
        zt = torch.zeros(n, dtype=torch.float32, device=dev) if t is not None else None
        tv = ti = None
        for v0 in range(0, V, n_voc):
            v1 = min(V, v0 + n_voc)
            z = _logits_into(h_c, weight, bias, v0, v1, logit_scale, softcap, buf32, lowbuf)
            if t is not None:
                tc = t[a:b]
                inside = (tc >= v0) & (tc < v1)
                if single_tile:
                    zt = z.gather(1, tc[:, None]).squeeze(1)
                elif bool(inside.any()):
                    rows = inside.nonzero().squeeze(1)
                    zt[rows] = z[rows, tc[rows] - v0]
            if k:
                kk = min(k, v1 - v0)
                cv, ci = _topk_lowest_id(z, kk)
                ci = ci + v0
                if tv is None:
                    tv, ti = cv, ci
                else:
                    tv, ti = _merge_topk(tv, ti, cv, ci, k)
            m_new = torch.maximum(m, z.amax(1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(torch.where(s > 0, m - m_safe, torch.full_like(m, -math.inf)))
            z.sub_(m_safe[:, None]).exp_()  # z is now e = exp(logit - m_new), in place
            if entropy:
                # q = sum e·(logit - m); moving the reference from m to m_new adds (m - m_new)·s
                shift = torch.where(s > 0, (m - m_safe) * s, torch.zeros_like(s))
                q = alpha * (q + shift) + torch.special.xlogy(z, z).sum(1)
            s = alpha * s + z.sum(1)
            m = m_new
        lse = m + torch.log(s)
        lse_out[a:b] = lse
        if t is not None:
            lp_out[a:b] = zt - lse
        if entropy:
            ent_out[a:b] = torch.log(s) - q / s
        if k:
            tv_out[a:b] = tv - lse[:, None]
            ti_out[a:b] = ti

    def shape(x, extra=()):
        return None if x is None else x.reshape(*lead, *extra)

    return TokenLogprobs(logprob=shape(lp_out), lse=shape(lse_out), entropy=shape(ent_out),
                         topk_logprobs=shape(tv_out, (k,)) if k else None,
                         topk_ids=shape(ti_out, (k,)) if k else None)


def _topk_lowest_id(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim with ties broken by the lowest index (deterministic).

    torch.topk returns the same values, but its order among equal values is unspecified; this
    returns the values of torch.topk and the ids of ``torch.sort(descending=True, stable=True)``.
    NaN counts as the largest value (as in torch.topk / torch.sort).
    """
    vals, _ = torch.topk(z, k, dim=-1)
    thr = vals[..., -1:]
    # the candidates are everything >= the k-th value (NaN included), a small set unless heavy ties
    cand = (z >= thr) | torch.isnan(z)
    if bool((cand.sum(-1) == k).all()):
        sv, si = torch.sort(torch.where(cand, z, torch.full_like(z, -math.inf)), dim=-1, descending=True, stable=True)
        return sv[..., :k].clone(), si[..., :k].clone()
    sv, si = torch.sort(z, dim=-1, descending=True, stable=True)
    return sv[..., :k].clone(), si[..., :k].clone()


def _merge_topk(v1: torch.Tensor, i1: torch.Tensor, v2: torch.Tensor, i2: torch.Tensor, k: int):
    """Merge two top-k lists (ids of list 1 all lower than those of list 2) keeping lowest id first on ties."""
    v = torch.cat([v1, v2], -1)
    i = torch.cat([i1, i2], -1)
    # order candidates by id so that a stable sort keeps the lowest id first among ties
    order = torch.argsort(i, dim=-1, stable=True)
    v = v.gather(-1, order)
    i = i.gather(-1, order)
    sv, si = torch.sort(v, dim=-1, descending=True, stable=True)
    k = min(k, v.shape[-1])
    return sv[..., :k], i.gather(-1, si[..., :k])


# ---------------------------------------------------------------------------------------------- training

_REDUCTIONS = ("mean", "sum", "none")


class _Cfg:
    __slots__ = ("reduction", "ignore_index", "label_smoothing", "z_loss", "softcap", "logit_scale",
                 "n_tok", "count", "V")

    def __init__(self, **kw):
        for key, val in kw.items():
            setattr(self, key, val)


_INPLACE_LOG_SOFTMAX: bool | None = None


def _log_softmax_inplace(z: torch.Tensor) -> torch.Tensor:
    """Row log-softmax of a float32 [n, V] buffer written over itself (one fused, vectorized kernel).

    ATen's CPU/CUDA kernels read each row's max and exp-sum before writing it, so ``out=z`` is safe;
    this is checked once on a small tensor and falls back to an out-of-place call otherwise.
    """
    global _INPLACE_LOG_SOFTMAX
    if _INPLACE_LOG_SOFTMAX is None:
        x = torch.randn(3, 4099, generator=torch.Generator().manual_seed(0)).to(z.device) * 7
        ref = torch.log_softmax(x, 1)
        try:
            torch._log_softmax(x, 1, False, out=x)
            _INPLACE_LOG_SOFTMAX = bool(torch.equal(x, ref))
        except Exception:  # pragma: no cover - op signature differs
            _INPLACE_LOG_SOFTMAX = False
    if _INPLACE_LOG_SOFTMAX:
        torch._log_softmax(z, 1, False, out=z)
    else:  # pragma: no cover
        z.copy_(torch.log_softmax(z, 1))
    return z


def _chunk_pass(h, weight, bias, t, cfg: _Cfg, a: int, b: int, buf32, lowbuf, aux32,
                row_scale: torch.Tensor | None, want_grad: bool):
    """One token chunk: per-token loss and lse (float32); if want_grad, the logits gradient.

    Returns ``(loss [n], lse [n], G [n, V] or None, rs [n] or None)``. When ``rs`` is not None the
    true gradient with respect to the raw GEMM output ``h Wᵀ + b`` is ``diag(rs) · G`` (the row
    scale is applied on the small side of the gradient GEMMs); otherwise G is already scaled.
    ``row_scale`` [n] holds 1/count (mean), 1 (sum) or the upstream per-token gradients (none);
    ignored rows get 0.
    """
    V = cfg.V
    h_c = h[a:b]
    n = b - a
    z = _logits_into(h_c, weight, bias, 0, V, cfg.logit_scale, cfg.softcap, buf32, lowbuf)
    tc = t[a:b]
    valid = tc != cfg.ignore_index
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    zt = z.gather(1, tsafe[:, None]).squeeze(1)
    ls = cfg.label_smoothing
    zsum = z.sum(1, dtype=torch.float32) if ls > 0 else None
    dcap = None
    if want_grad and cfg.softcap is not None:
        # d softcap(u)/du = 1 - tanh²(u/c) = 1 - (z/c)²
        dcap = aux32[: n * V].view(n, V)
        torch.div(z, cfg.softcap, out=dcap)
        dcap.square_().neg_().add_(1.0)
    m, am = torch.max(z, 1)
    _log_softmax_inplace(z)  # z is now log p
    lse = m - z.gather(1, am[:, None]).squeeze(1)  # log p at the argmax is m - lse
    lse = torch.where(torch.isfinite(m), lse, m)
    loss = lse - (1.0 - ls) * zt
    if ls > 0:
        loss = loss - (ls / V) * zsum
    if cfg.z_loss:
        loss = loss + cfg.z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if not want_grad:
        return loss, lse, None, None
    z.exp_()  # softmax p, in place
    rs = row_scale * valid.to(torch.float32)
    simple = ls == 0 and not cfg.z_loss and dcap is None
    if simple:
        # G = p - onehot(target) on valid rows; the row scale goes to the small side of the GEMMs
        z.scatter_add_(1, tsafe[:, None], -valid.to(torch.float32)[:, None])
        return loss, lse, z, rs * cfg.logit_scale
    # dL/dz = p·(1 + 2·zl·lse) - (1-ls)·onehot - ls/V, times the row scale
    coef = rs
    if cfg.z_loss:
        coef = coef * (1.0 + 2.0 * cfg.z_loss * lse)
    z.mul_(coef[:, None])
    if ls > 0:
        z.sub_((ls / V) * rs[:, None])
    z.scatter_add_(1, tsafe[:, None], (-(1.0 - ls) * rs)[:, None])
    if dcap is not None:
        z.mul_(dcap)
    if cfg.logit_scale != 1.0:
        z.mul_(cfg.logit_scale)
    return loss, lse, z, None


def _grad_gemms(g32: torch.Tensor, rs: torch.Tensor | None, h_c: torch.Tensor, weight: torch.Tensor, lowbuf,
                gh_out, gW32, gb32):
    """grad_hidden[chunk] = diag(rs)·G @ W; grad_W += Gᵀ @ (diag(rs)·h) in float32; grad_b += Gᵀ rs.

    For low-precision inputs, G is cast once to the input dtype for the grad_hidden GEMM, and the
    weight-gradient GEMM runs in float32 (no rounding of G, no [V, d] low-precision temporary).
    """
    if gb32 is not None:
        gb32.add_(g32.sum(0) if rs is None else torch.mv(g32.t(), rs))
    hs = h_c if h_c.dtype == torch.float32 else h_c.float()
    if rs is not None:
        hs = hs * rs[:, None]
    if gh_out is not None:
        if h_c.dtype == torch.float32:
            torch.mm(g32, weight, out=gh_out)
            if rs is not None:
                gh_out.mul_(rs[:, None])
        else:
            g = lowbuf[: g32.numel()].view_as(g32)
            g.copy_(g32)
            gh = torch.mm(g, weight).float()
            gh_out.copy_(gh if rs is None else gh * rs[:, None])
    if gW32 is not None:
        gW32.addmm_(g32.t(), hs)


class LinearCrossEntropy(torch.autograd.Function):
    """Autograd Function behind :func:`linear_cross_entropy` (see there)."""

    @staticmethod
    def forward(ctx, h, weight, bias, t, cfg: _Cfg, need_h: bool, need_w: bool, need_b: bool):
        N, V = h.shape[0], weight.shape[0]
        dev = h.device
        n_tok = cfg.n_tok
        buf32 = torch.empty(n_tok * V, dtype=torch.float32, device=dev)
        lowbuf = None if h.dtype == torch.float32 else torch.empty(n_tok * V, dtype=h.dtype, device=dev)
        aux32 = torch.empty(n_tok * V, dtype=torch.float32, device=dev) if cfg.softcap is not None else None
        losses = torch.empty(N, dtype=torch.float32, device=dev)
        ctx.cfg = cfg
        ctx.needs = (need_h, need_w, need_b)
        if cfg.reduction == "none":
            lses = torch.empty(N, dtype=torch.float32, device=dev)
            for a in range(0, N, n_tok):
                b = min(N, a + n_tok)
                loss, lse, _, _ = _chunk_pass(h, weight, bias, t, cfg, a, b, buf32, lowbuf, aux32, None, False)
                losses[a:b] = loss
                lses[a:b] = lse
            ctx.save_for_backward(h, weight, bias, t)
            return losses
        # scalar reduction: gradients now, scaled by the upstream scalar in backward
        scale = 1.0 / cfg.count if (cfg.reduction == "mean" and cfg.count > 0) else 1.0
        gh = torch.empty_like(h) if need_h else None
        gW32 = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        gb32 = torch.zeros(V, dtype=torch.float32, device=dev) if need_b else None
        rs_full = torch.full((n_tok,), scale, dtype=torch.float32, device=dev)
        for a in range(0, N, n_tok):
            b = min(N, a + n_tok)
            loss, _, g, rs = _chunk_pass(h, weight, bias, t, cfg, a, b, buf32, lowbuf, aux32, rs_full[: b - a], True)
            losses[a:b] = loss
            _grad_gemms(g, rs, h[a:b], weight, lowbuf, gh[a:b] if gh is not None else None, gW32, gb32)
        del buf32, lowbuf, aux32
        total = losses.sum(dtype=torch.float64).to(torch.float32)
        if cfg.reduction == "mean":
            total = total / cfg.count if cfg.count > 0 else torch.zeros((), dtype=torch.float32, device=dev)
        ctx.grads = (gh, None if gW32 is None else gW32.to(weight.dtype),
                     None if gb32 is None else gb32.to(bias.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_out):
        cfg = ctx.cfg
        need_h, need_w, need_b = ctx.needs
        if cfg.reduction != "none":
            gh, gW, gb = ctx.grads
            ctx.grads = None
            go = grad_out.to(torch.float32)
            if not (go.numel() == 1 and float(go) == 1.0):
                gh = None if gh is None else (gh * go).to(gh.dtype)
                gW = None if gW is None else (gW * go).to(gW.dtype)
                gb = None if gb is None else (gb * go).to(gb.dtype)
            return gh, gW, gb, None, None, None, None, None
        h, weight, bias, t = ctx.saved_tensors
        N, V = h.shape[0], weight.shape[0]
        dev = h.device
        n_tok = cfg.n_tok
        buf32 = torch.empty(n_tok * V, dtype=torch.float32, device=dev)
        lowbuf = None if h.dtype == torch.float32 else torch.empty(n_tok * V, dtype=h.dtype, device=dev)
        aux32 = torch.empty(n_tok * V, dtype=torch.float32, device=dev) if cfg.softcap is not None else None
        gh = torch.empty_like(h) if need_h else None
        gW32 = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        gb32 = torch.zeros(V, dtype=torch.float32, device=dev) if need_b else None
        go = grad_out.to(torch.float32).reshape(-1)
        for a in range(0, N, n_tok):
            b = min(N, a + n_tok)
            _, _, g, rs = _chunk_pass(h, weight, bias, t, cfg, a, b, buf32, lowbuf, aux32, go[a:b], True)
            _grad_gemms(g, rs, h[a:b], weight, lowbuf, gh[a:b] if gh is not None else None, gW32, gb32)
        return (gh, None if gW32 is None else gW32.to(weight.dtype),
                None if gb32 is None else gb32.to(bias.dtype), None, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, *, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                         logit_scale: float = 1.0, chunk_bytes: int | None = None,
                         chunk_tokens: int | None = None) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against targets, chunked, with a fused backward.

    Per valid token i with logits z (after ``logit_scale`` and the softcap c·tanh(·/c)):
    ``loss_i = lse_i - (1-a)·z_{i,y_i} - (a/V)·Σ_j z_ij + λ·lse_i²`` with a = label_smoothing (PyTorch's
    formula, ``torch.nn.CrossEntropyLoss``) and λ = z_loss (PaLM, Chowdhery et al. 2022, §5).

    Args:
        hidden: [N, d] or [..., d] float32/bf16/fp16. weight: [V, d], same dtype. targets: hidden's
            leading shape, int ids in [0, V) or ``ignore_index``. bias: [V] optional.
        reduction: "mean" (over non-ignored tokens), "sum" or "none" ([...] per-token losses).
        ignore_index: targets equal to it give loss 0 and no gradient. A batch where every target
            is ignored gives 0 for "mean" and "sum" (not NaN) and zero gradients.
        label_smoothing: in [0, 1]. z_loss: coefficient of lse² (0 = off).
        softcap: final-logit softcap c or None; logit_scale: factor before the softcap.
        chunk_bytes / chunk_tokens: size of one float32 chunk of logits [n, V] (bytes / tokens).

    Returns:
        float32 scalar (mean/sum) or [...] float32 per-token losses (none), in nats.

    Raises:
        ShapeMismatch: d, dtypes or target shape disagree. BadInput: empty input, unknown reduction,
        targets outside [0, V) other than ignore_index, label_smoothing outside [0, 1], bad softcap.

    Memory: one [n, V] float32 chunk (two with softcap, plus one in the input dtype for bf16/fp16
    inputs), the float32 weight-gradient accumulator [V, d] and the outputs. Gradients of weight and
    bias are accumulated in float32 across chunks. Under ``torch.no_grad()`` or when no input
    requires grad, no gradient is computed.
    """
    if reduction not in _REDUCTIONS:
        raise BadInput(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    check_head(hidden, weight, bias)
    check_softcap(softcap)
    if not (0.0 <= float(label_smoothing) <= 1.0):
        raise BadInput(f"label_smoothing must be in [0, 1]; got {label_smoothing}")
    if not isinstance(targets, torch.Tensor):
        raise ShapeMismatch(f"targets must be a tensor of token ids; got {type(targets).__name__}")
    h, t, lead = _flatten(hidden, targets)
    check_nonempty("hidden", h)
    V = weight.shape[0]
    check_ids("targets", t, V, ignore_index=ignore_index)
    count = int((t != ignore_index).sum())
    n_tok, _ = chunk_sizes(h.shape[0], V, chunk_bytes, vocab_tiles=False)
    if chunk_tokens:
        n_tok = max(1, min(int(chunk_tokens), h.shape[0]))
    cfg = _Cfg(reduction=reduction, ignore_index=ignore_index, label_smoothing=float(label_smoothing),
               z_loss=float(z_loss), softcap=None if softcap is None else float(softcap),
               logit_scale=float(logit_scale), n_tok=n_tok, count=count, V=V)
    grad_on = torch.is_grad_enabled()
    need_h = grad_on and hidden.requires_grad
    need_w = grad_on and weight.requires_grad
    need_b = grad_on and bias is not None and bias.requires_grad
    if not (need_h or need_w or need_b):
        with torch.no_grad():
            return _forward_only(h, weight, bias, t, cfg).reshape(lead) if reduction == "none" \
                else _forward_only(h, weight, bias, t, cfg)
    h_in = h.contiguous() if not h.is_contiguous() else h
    out = LinearCrossEntropy.apply(h_in, weight, bias, t, cfg, need_h, need_w, need_b)
    return out.reshape(lead) if reduction == "none" else out


def _forward_only(h, weight, bias, t, cfg: _Cfg) -> torch.Tensor:
    N, V = h.shape[0], weight.shape[0]
    buf32 = torch.empty(cfg.n_tok * V, dtype=torch.float32, device=h.device)
    lowbuf = None if h.dtype == torch.float32 else torch.empty(cfg.n_tok * V, dtype=h.dtype, device=h.device)
    losses = torch.empty(N, dtype=torch.float32, device=h.device)
    for a in range(0, N, cfg.n_tok):
        b = min(N, a + cfg.n_tok)
        losses[a:b] = _chunk_pass(h, weight, bias, t, cfg, a, b, buf32, lowbuf, None, None, False)[0]
    if cfg.reduction == "none":
        return losses
    total = losses.sum(dtype=torch.float64).to(torch.float32)
    if cfg.reduction == "mean":
        return total / cfg.count if cfg.count > 0 else torch.zeros((), dtype=torch.float32, device=h.device)
    return total
