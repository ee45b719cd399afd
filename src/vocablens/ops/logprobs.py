"""Chunked log-probabilities and cross-entropy through the LM head, never materializing [N, V].

Two entry points:

* :func:`token_logprobs` (forward only): per-token log-probability of given targets, and on request
  the top-k log-probabilities, the entropy and the logsumexp, for ``hidden [N, d]`` and
  ``weight [V, d]`` (+ bias, logit scale, final-logit softcap). It chunks over tokens and, when a
  chunk of full rows would not fit the memory budget, over the vocabulary too, with an online
  log-sum-exp (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; the same
  blockwise LSE as Cut Cross-Entropy, Wijmans et al. 2024, arXiv 2411.09009, §3).
* :func:`linear_cross_entropy` (training): a custom autograd Function with two strategies.
  - one pass (default when chunks of >= 256 full rows fit 512 MiB; scalar reductions): Liger-Kernel's
    fused linear cross-entropy (Hsu et al. 2024, arXiv 2410.10989, §3.2) — per token chunk, one GEMM
    into a reused float32 [n, V] buffer, one fused in-place softmax, the one-hot correction by a
    scatter, and the grad_hidden / grad_W GEMMs of the same pass; the row scale (1/count) is applied
    on the small [n, d] side, so the [n, V] buffer is touched by one elementwise pass only.
    Backward only multiplies the stored gradients by the upstream scalar.
  - two passes over vocabulary tiles (``reduction="none"``, or when full rows do not fit): forward
    keeps only the per-token logsumexp, computed tile by tile (fused in-place log-softmax per tile,
    logaddexp across tiles; the blockwise LSE of Cut Cross-Entropy, Wijmans et al. 2024, arXiv
    2411.09009, §4); backward recomputes each tile once and applies per-token upstream gradients
    before any sum over tokens (the Liger #968 bug).

Numerics: logits may come out of the GEMM in the input dtype (bf16 GEMMs are the fast path), but the
max, the exp-sum, the per-token loss and every reduction are float32; weight and bias gradients are
accumulated across chunks in float32 and cast once at the end (Liger #512, PR #830); the loss is
returned in float32 whatever the input dtype (torch 2.13's chunked bf16 path returns a bf16 sum ~3% off).
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
        vocab_tiles: allow tiling the vocabulary; False forces full rows.

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


def train_chunk_sizes(N: int, V: int, chunk_bytes: int | None = None, *, max_tokens: int = 8192,
                      min_vocab: int = 256, low_precision_grad: bool = False) -> tuple[int, int]:
    """Token-chunk and vocabulary-tile sizes of the training path for a float32 tile of ``chunk_bytes``.

    By default, full vocabulary rows for chunks of max(clamp(N/16, 128, 256), budget/4V) tokens (the one-pass fused
    path) when that fits 512 MiB. Otherwise (or with an explicit budget), token chunks are as long as possible (each chunk reads the whole of W four times: two logit
    GEMMs, grad_hidden, grad_W), vocabulary tiles fill the rest of the budget but keep at least
    ``min_vocab`` columns for GEMM efficiency. ``low_precision_grad`` (bf16/fp16 inputs, gradients
    wanted, default budget): full-row chunks of at least 256 tokens. Measured (N=2048, d=576, V=49152
    bf16, 2 threads, shared CPU): 128-token chunks ran fwd+bwd at 1.25-1.32x naive, 256-token chunks at
    0.97-1.13x (512: 0.92-1.01x): each chunk's float32 weight-gradient GEMM reads and writes the whole
    float32 [V, d] accumulator, so fewer, longer chunks halve that traffic and the bf16 GEMMs run at
    full speed; it costs one more [128, V] float32 + bf16 chunk of memory.
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(N, V)
        # full rows (one-pass fused path) for N/16 tokens, clamped to [128, 256], when they fit 512 MiB:
        # GEMMs with 256 rows run near full speed on CPU (measured; 128 rows at ~2/3), while the
        # chunk stays ~6% of the full [N, V] logits; a row-complete chunk needs a single pass
        n_full = max(chunk_bytes // (4 * V), min(N, max(128, min(256, N // 16))))
        if low_precision_grad:
            n_full = max(n_full, min(N, 256))
        if n_full * V * 4 <= 512 * 2**20:
            return int(min(N, n_full)), int(V)
    n = max(1, min(N, max_tokens))
    v = chunk_bytes // (4 * n)
    if v < min_vocab:
        v = min(V, min_vocab)
        n = max(1, min(n, chunk_bytes // (4 * v)))
    return int(n), int(max(1, min(V, v)))


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
                 "n_tok", "n_voc", "count", "V")

    def __init__(self, **kw):
        for key, val in kw.items():
            setattr(self, key, val)


_INPLACE_LOG_SOFTMAX: bool | None = None


def _log_softmax_inplace(z: torch.Tensor) -> torch.Tensor:
    """Row log-softmax of a float32 [n, v] buffer written over itself (one fused, vectorized kernel).

    ATen's kernels read each row's max and exp-sum before writing that row, so ``out=z`` is safe;
    this is checked once on a small tensor, with an out-of-place fallback.
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


_INPLACE_SOFTMAX: bool | None = None


def _softmax_inplace(z: torch.Tensor) -> torch.Tensor:
    """Row softmax of a float32 [n, V] buffer written over itself (fused kernel; checked once, with fallback)."""
    global _INPLACE_SOFTMAX
    if _INPLACE_SOFTMAX is None:
        x = torch.randn(3, 4099, generator=torch.Generator().manual_seed(0)).to(z.device) * 7
        ref = torch.softmax(x, 1)
        try:
            torch._softmax(x, 1, False, out=x)
            _INPLACE_SOFTMAX = bool(torch.equal(x, ref))
        except Exception:  # pragma: no cover
            _INPLACE_SOFTMAX = False
    if _INPLACE_SOFTMAX:
        torch._softmax(z, 1, False, out=z)
    else:  # pragma: no cover
        z.copy_(torch.softmax(z, 1))
    return z


def _exact_lse(h_rows, weight, bias, cfg: _Cfg) -> torch.Tensor:
    """float32 logsumexp of a few rows, from freshly computed logits (fallback for underflowed rows)."""
    z = torch.nn.functional.linear(h_rows, weight, bias).float() * cfg.logit_scale
    if cfg.softcap is not None:
        z = torch.tanh(z / cfg.softcap) * cfg.softcap
    return torch.logsumexp(z, 1)


def _fused_chunk(h_c, weight, bias, tc, valid, rs, cfg: _Cfg, buf32, lowbuf, aux32, gh_c, gW32, gb32):
    """One-pass loss and gradients of one token chunk with full vocabulary rows (scalar reductions).

    Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024, arXiv 2410.10989 §3.2) on CPU: one
    GEMM into the reused float32 [n, V] buffer, one fused in-place softmax (the only elementwise
    pass over the chunk), lse = z_t - log p_t (rows where p_t underflows are recomputed exactly),
    the one-hot correction by a scatter, then the grad_hidden and grad_W GEMMs on the same buffer.
    The row scale ``rs`` (1/count or 1; 0 on ignored rows) is applied on the [n, d] side.
    Returns the per-token losses [n] (float32).
    """
    V, ls = cfg.V, cfg.label_smoothing
    z = _logits_into(h_c, weight, bias, 0, V, cfg.logit_scale, cfg.softcap, buf32, lowbuf)
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    zt = z.gather(1, tsafe[:, None]).squeeze(1)
    zsum = z.sum(1) if ls > 0 else None
    dcap = None
    if cfg.softcap is not None:
        dcap = aux32[: z.numel()].view_as(z)
        torch.div(z, cfg.softcap, out=dcap)
        dcap.square_().neg_().add_(1.0)  # d softcap(u)/du = 1 - tanh²(u/c) = 1 - (z/c)²
    _softmax_inplace(z)
    pt = z.gather(1, tsafe[:, None]).squeeze(1)
    lse = zt - torch.log(pt)
    bad = valid & ~(torch.isfinite(lse) & (pt > 0))
    if cfg.z_loss:
        bad = bad | ~torch.isfinite(lse)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(1)
        lse[rows] = _exact_lse(h_c[rows], weight, bias, cfg)
    lse = torch.where(valid | (cfg.z_loss != 0), lse, torch.zeros_like(lse))
    loss = _token_loss(lse, zt, zsum, valid, cfg)
    # gradient: G = c·p - (1-a)·onehot - a/V, times the softcap derivative; rows scaled on the small side
    if cfg.z_loss:
        z.mul_((1.0 + 2.0 * cfg.z_loss * lse)[:, None])
    if ls > 0:
        z.sub_(ls / V)
    z.scatter_add_(1, tsafe[:, None], (-(1.0 - ls) * valid.to(torch.float32))[:, None])
    if dcap is not None:
        z.mul_(dcap)
    rs = rs * cfg.logit_scale
    if gb32 is not None:
        gb32 += torch.mv(z.t(), rs)
    if gh_c is not None:
        if weight.dtype == torch.float32:
            torch.mm(z, weight, out=gh_c)
            gh_c.mul_(rs[:, None])
        else:
            lo = lowbuf[: z.numel()].view_as(z)
            lo.copy_(z)
            gh_c.copy_(torch.mm(lo, weight).float() * rs[:, None])
    if gW32 is not None:
        gW32.addmm_(z.t(), h_c.float() * rs[:, None])
    return loss


def _lse_pass(h_c, weight, bias, tc, valid, cfg: _Cfg, buf32, lowbuf):
    """Pass 1 over the vocabulary tiles of one token chunk: lse [n], target logit [n], Σ_j z [n] (float32).

    Per tile: one GEMM into the reused buffer, the tile max, an in-place fused log-softmax, and
    lse = logaddexp(lse, lse_tile) with lse_tile = max - logp[argmax] (exact, no underflow).
    """
    V, n = cfg.V, h_c.shape[0]
    dev = h_c.device
    lse = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
    zt = torch.zeros(n, dtype=torch.float32, device=dev)
    zsum = torch.zeros(n, dtype=torch.float32, device=dev) if cfg.label_smoothing > 0 else None
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    for v0 in range(0, V, cfg.n_voc):
        v1 = min(V, v0 + cfg.n_voc)
        z = _logits_into(h_c, weight, bias, v0, v1, cfg.logit_scale, cfg.softcap, buf32, lowbuf)
        if zsum is not None:
            zsum += z.sum(1)
        if v0 == 0 and v1 == V:
            # one tile: lse = z_c - logp_c at the target column (no max pass); non-finite rows exactly
            zc = z.gather(1, tsafe[:, None]).squeeze(1)
            _log_softmax_inplace(z)
            lse = zc - z.gather(1, tsafe[:, None]).squeeze(1)
            bad = ~torch.isfinite(lse)
            if bool(bad.any()):
                rows = bad.nonzero().squeeze(1)
                lse[rows] = _exact_lse(h_c[rows], weight, bias, cfg)
            return lse, torch.where(valid, zc, torch.zeros_like(zc)), zsum
        inside = valid & (tsafe >= v0) & (tsafe < v1)
        zt = torch.where(inside, z.gather(1, (tsafe - v0).clamp(0, v1 - v0 - 1)[:, None]).squeeze(1), zt)
        m, am = torch.max(z, 1)
        _log_softmax_inplace(z)
        lse_t = torch.where(torch.isfinite(m), m - z.gather(1, am[:, None]).squeeze(1), m)
        lse = torch.logaddexp(lse, lse_t)
    return lse, zt, zsum


def _token_loss(lse, zt, zsum, valid, cfg: _Cfg):
    ls = cfg.label_smoothing
    loss = lse - (1.0 - ls) * zt
    if zsum is not None:
        loss = loss - (ls / cfg.V) * zsum
    if cfg.z_loss:
        loss = loss + cfg.z_loss * lse * lse
    return torch.where(valid, loss, torch.zeros_like(loss))


def _grad_pass(h_c, weight, bias, tc, valid, lse, rs, cfg: _Cfg, buf32, lowbuf, aux32, gh_c, gW, gW_acc, gb32):
    """Pass 2 over the vocabulary tiles of one token chunk: gradients, given lse from pass 1.

    Per tile: recompute z, p = exp(z - lse) in place, G = c·p - (1-a)·onehot - a/V (times the softcap
    derivative), then grad_h += G W_tile, grad_W[tile] (+)= Gᵀ (rs·h), grad_b[tile] += Gᵀ rs.
    ``rs`` [n] is the per-row scale (1/count, upstream grads, 0 for ignored rows); it is applied on
    the small [n, d] side of the GEMMs, never on the [n, v] tile. Each weight-gradient tile is one
    GEMM over the whole token chunk (K = n), accumulated in float32.
    """
    V, ls = cfg.V, cfg.label_smoothing
    rs = rs * cfg.logit_scale
    hs = h_c.float() * rs[:, None]
    gh32 = None
    if gh_c is not None:
        gh32 = gh_c if gh_c.dtype == torch.float32 else torch.zeros(gh_c.shape, dtype=torch.float32, device=h_c.device)
    coef = (1.0 + 2.0 * cfg.z_loss * lse) if cfg.z_loss else None
    tsafe = torch.where(valid, tc, torch.zeros_like(tc))
    for v0 in range(0, V, cfg.n_voc):
        v1 = min(V, v0 + cfg.n_voc)
        nv = v1 - v0
        z = _logits_into(h_c, weight, bias, v0, v1, cfg.logit_scale, cfg.softcap, buf32, lowbuf)
        dcap = None
        if cfg.softcap is not None:
            dcap = aux32[: z.numel()].view_as(z)
            torch.div(z, cfg.softcap, out=dcap)
            dcap.square_().neg_().add_(1.0)  # d softcap(u)/du = 1 - tanh²(u/c) = 1 - (z/c)²
        z.sub_(lse[:, None]).exp_()  # softmax slice p
        if coef is not None:
            z.mul_(coef[:, None])
        if ls > 0:
            z.sub_(ls / V)
        inside = (valid & (tsafe >= v0) & (tsafe < v1)).to(torch.float32)
        z.scatter_add_(1, (tsafe - v0).clamp(0, nv - 1)[:, None], (-(1.0 - ls) * inside)[:, None])
        if dcap is not None:
            z.mul_(dcap)
        W = weight[v0:v1]
        if gh32 is not None:
            if W.dtype == torch.float32:
                gh32.addmm_(z, W)
            else:
                lo = lowbuf[: z.numel()].view_as(z)
                lo.copy_(z)
                gh32.add_(torch.mm(lo, W))
        if gW is not None:
            if gW_acc is not None:
                gW_acc[v0:v1].addmm_(z.t(), hs)
            elif gW.dtype == torch.float32:
                torch.mm(z.t(), hs, out=gW[v0:v1])
            else:
                gW[v0:v1].copy_(torch.mm(z.t(), hs))
        if gb32 is not None:
            gb32[v0:v1] += torch.mv(z.t(), rs)
    if gh32 is not None:
        gh32.mul_(rs[:, None])
        if gh32 is not gh_c:
            gh_c.copy_(gh32)


def _buffers(cfg: _Cfg, dtype, dev, softcap: bool):
    size = cfg.n_tok * cfg.n_voc
    buf32 = torch.empty(size, dtype=torch.float32, device=dev)
    lowbuf = None if dtype == torch.float32 else torch.empty(size, dtype=dtype, device=dev)
    aux32 = torch.empty(size, dtype=torch.float32, device=dev) if softcap else None
    return buf32, lowbuf, aux32


class LinearCrossEntropy(torch.autograd.Function):
    """Autograd Function behind :func:`linear_cross_entropy` (see there).

    Forward keeps only the per-token logsumexp [N] (float32); backward recomputes the logit tiles
    once (Cut Cross-Entropy's recompute strategy, Wijmans et al. 2024 §4), so a per-token upstream
    gradient (reduction="none") is applied before any sum over tokens (the Liger #968 bug).
    """

    @staticmethod
    def forward(ctx, h, weight, bias, t, cfg: _Cfg, need_h: bool, need_w: bool, need_b: bool):
        ctx.cfg, ctx.needs = cfg, (need_h, need_w, need_b)
        ctx.fused = cfg.reduction != "none" and cfg.n_voc >= cfg.V
        if not ctx.fused:
            losses, lses = _loss_all(h, weight, bias, t, cfg)
            ctx.save_for_backward(h, weight, bias, t, lses)
            return _reduce(losses, cfg)
        # scalar reduction and full rows: gradients now, in the same pass (scaled in backward)
        N, V = h.shape[0], weight.shape[0]
        dev = h.device
        buf32, lowbuf, aux32 = _buffers(cfg, h.dtype, dev, cfg.softcap is not None)
        gh = torch.empty_like(h) if need_h else None
        gW32 = None
        if need_w:
            gW32 = torch.zeros(weight.shape, dtype=torch.float32, device=dev)
        gb32 = torch.zeros(V, dtype=torch.float32, device=dev) if need_b else None
        scale = 1.0 / cfg.count if (cfg.reduction == "mean" and cfg.count > 0) else 1.0
        losses = torch.empty(N, dtype=torch.float32, device=dev)
        for a in range(0, N, cfg.n_tok):
            b = min(N, a + cfg.n_tok)
            tc = t[a:b]
            valid = tc != cfg.ignore_index
            rs = valid.to(torch.float32) * scale
            losses[a:b] = _fused_chunk(h[a:b], weight, bias, tc, valid, rs, cfg, buf32, lowbuf, aux32,
                                       gh[a:b] if gh is not None else None, gW32, gb32)
        del buf32, lowbuf, aux32
        ctx.grads = (gh, None if gW32 is None else gW32.to(weight.dtype),
                     None if gb32 is None else gb32.to(bias.dtype))
        return _reduce(losses, cfg)

    @staticmethod
    def backward(ctx, grad_out):
        cfg = ctx.cfg
        need_h, need_w, need_b = ctx.needs
        if ctx.fused:
            grads, ctx.grads = ctx.grads, None
            go = grad_out.to(torch.float32)
            if float(go) != 1.0:
                grads = tuple(None if g is None else (g.float() * go).to(g.dtype) for g in grads)
            return (*grads, None, None, None, None, None)
        h, weight, bias, t, lses = ctx.saved_tensors
        N, V = h.shape[0], weight.shape[0]
        dev = h.device
        go = grad_out.to(torch.float32)
        if cfg.reduction == "none":
            row = go.reshape(-1)
        else:
            sc = (1.0 / cfg.count) if (cfg.reduction == "mean" and cfg.count > 0) else 1.0
            row = (go * sc).expand(N)
        buf32, lowbuf, aux32 = _buffers(cfg, h.dtype, dev, cfg.softcap is not None)
        gh = torch.zeros_like(h) if need_h else None
        gW = torch.empty_like(weight) if need_w else None
        multi = N > cfg.n_tok
        gW_acc = None
        if need_w and multi:
            gW_acc = gW if weight.dtype == torch.float32 else torch.zeros(weight.shape, dtype=torch.float32, device=dev)
            gW_acc.zero_()
        gb32 = torch.zeros(V, dtype=torch.float32, device=dev) if need_b else None
        for a in range(0, N, cfg.n_tok):
            b = min(N, a + cfg.n_tok)
            tc = t[a:b]
            valid = tc != cfg.ignore_index
            rs = row[a:b] * valid.to(torch.float32)
            _grad_pass(h[a:b], weight, bias, tc, valid, lses[a:b], rs, cfg, buf32, lowbuf, aux32,
                       gh[a:b] if gh is not None else None, gW, gW_acc, gb32)
        if gW_acc is not None and gW_acc is not gW:
            gW.copy_(gW_acc)
        return gh, gW, None if gb32 is None else gb32.to(bias.dtype), None, None, None, None, None


def _loss_all(h, weight, bias, t, cfg: _Cfg):
    N = h.shape[0]
    buf32, lowbuf, _ = _buffers(cfg, h.dtype, h.device, False)
    losses = torch.empty(N, dtype=torch.float32, device=h.device)
    lses = torch.empty(N, dtype=torch.float32, device=h.device)
    for a in range(0, N, cfg.n_tok):
        b = min(N, a + cfg.n_tok)
        tc = t[a:b]
        valid = tc != cfg.ignore_index
        lse, zt, zsum = _lse_pass(h[a:b], weight, bias, tc, valid, cfg, buf32, lowbuf)
        losses[a:b] = _token_loss(lse, zt, zsum, valid, cfg)
        lses[a:b] = lse
    return losses, lses


def _reduce(losses: torch.Tensor, cfg: _Cfg) -> torch.Tensor:
    if cfg.reduction == "none":
        return losses
    total = losses.sum(dtype=torch.float64).to(torch.float32)
    if cfg.reduction == "mean":
        return total / cfg.count if cfg.count > 0 else torch.zeros((), dtype=torch.float32, device=losses.device)
    return total


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, *, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                         logit_scale: float = 1.0, chunk_bytes: int | None = None,
                         chunk_tokens: int | None = None, chunk_vocab: int | None = None) -> torch.Tensor:
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
        chunk_bytes / chunk_tokens / chunk_vocab: size of one float32 tile of logits [n, v] (bytes,
            default :func:`default_chunk_bytes`; or tokens and vocabulary columns).

    Returns:
        float32 scalar (mean/sum) or [...] float32 per-token losses (none), in nats.

    Raises:
        ShapeMismatch: d, dtypes or target shape disagree. BadInput: empty input, unknown reduction,
        targets outside [0, V) other than ignore_index, label_smoothing outside [0, 1], bad softcap.

    Algorithm (two passes over vocabulary tiles, per token chunk): forward computes each token's
    logsumexp tile by tile (GEMM into a reused float32 buffer, fused in-place log-softmax, logaddexp)
    and keeps only lse [N]; backward recomputes each tile, turns it into the gradient in place and
    feeds the grad_hidden and grad_W GEMMs of the same tile. Tiling the vocabulary rather than the
    tokens means W is streamed a handful of times instead of once per small token chunk, and each
    weight-gradient tile is one GEMM over the whole token chunk, accumulated in float32.

    Memory: one [n, v] float32 tile (two with softcap, plus one in the input dtype for bf16/fp16
    inputs), lse [N], and the gradients (plus a float32 [V, d] accumulator only for low-precision
    weights when N exceeds one token chunk). Under ``torch.no_grad()`` or when no input requires
    grad, only the forward pass runs.
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
    grad_on = torch.is_grad_enabled()
    need_h = grad_on and hidden.requires_grad
    need_w = grad_on and weight.requires_grad
    need_b = grad_on and bias is not None and bias.requires_grad
    lowp_grad = h.dtype != torch.float32 and (need_h or need_w or need_b)
    n_tok, n_voc = train_chunk_sizes(h.shape[0], V, chunk_bytes, low_precision_grad=lowp_grad)
    if chunk_tokens:
        n_tok = max(1, min(int(chunk_tokens), h.shape[0]))
    if chunk_vocab:
        n_voc = max(1, min(int(chunk_vocab), V))
    cfg = _Cfg(reduction=reduction, ignore_index=ignore_index, label_smoothing=float(label_smoothing),
               z_loss=float(z_loss), softcap=None if softcap is None else float(softcap),
               logit_scale=float(logit_scale), n_tok=n_tok, n_voc=n_voc, count=count, V=V)
    if not (need_h or need_w or need_b):
        with torch.no_grad():
            out = _reduce(_loss_all(h, weight, bias, t, cfg)[0], cfg)
        return out.reshape(lead) if reduction == "none" else out
    h_in = h.contiguous() if not h.is_contiguous() else h
    out = LinearCrossEntropy.apply(h_in, weight, bias, t, cfg, need_h, need_w, need_b)
    return out.reshape(lead) if reduction == "none" else out


