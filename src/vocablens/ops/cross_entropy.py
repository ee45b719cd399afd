"""Cross-entropy through the LM head, chunked, with a fused backward, never materializing [N, V].

:func:`linear_cross_entropy` is a custom autograd Function with two strategies (the per-chunk
passes live in :mod:`vocablens.ops.ce_passes`):

* one pass (default when chunks of >= 128 full rows fit 512 MiB; scalar reductions): Liger-Kernel's
  fused linear cross-entropy (Hsu et al. 2024, arXiv 2410.10989, §3.2) — per token chunk, one GEMM
  into a reused float32 [n, V] buffer, one fused in-place softmax, the one-hot correction by a
  scatter, and the grad_hidden / grad_W GEMMs of the same pass; the row scale (1/count) is applied
  on the small [n, d] side. Backward only multiplies the stored gradients by the upstream scalar.
* two passes over vocabulary tiles (``reduction="none"``, or when full rows do not fit): forward
  keeps only each token's row max and log-normalizer (Cut Cross-Entropy's blockwise LSE, Wijmans et
  al. 2024, arXiv 2411.09009, §4); backward recomputes each tile once and applies per-token upstream
  gradients before any sum over tokens (the Liger #968 bug).

Numerics: bf16/fp16 inputs run float32 GEMMs on CPU (exact products, float32 sums; see
:func:`vocablens.ops.chunking.gemm_operands`) and low-precision GEMMs on accelerators; the max,
the exp-sum, the per-token loss and every reduction are float32 (sums over tokens in float64); the
loss depends only on logit differences; weight and bias gradients are accumulated across chunks
in float32 and cast once at the end (Liger #512, PR #830); the loss is float32 whatever the input
dtype (torch 2.13's chunked bf16 path returns a bf16 sum ~3% off).
"""

from __future__ import annotations

import torch

from vocablens.errors import ShapeMismatch
from vocablens.ops._checks import (
    REDUCTIONS, check_choice, check_head, check_head_transform, check_ids, check_int, check_nonempty, check_real,
    check_size,
)
from vocablens.ops.ce_passes import CEConfig, fused_chunk, grad_pass, lse_pass, token_loss
from vocablens.ops.chunking import ChunkBuffers, flatten_tokens, gemm_operands, override_sizes, train_chunk_sizes


def _mean_scale(cfg: CEConfig) -> float:
    """The factor of each token's loss in the reduced loss: 1/count for "mean" (0 tokens: 1), else 1."""
    return 1.0 / cfg.count if (cfg.reduction == "mean" and cfg.count > 0) else 1.0


def _reduce(losses: torch.Tensor, cfg: CEConfig) -> torch.Tensor:
    if cfg.reduction == "none":
        return losses
    return (losses.sum(dtype=torch.float64) * _mean_scale(cfg)).to(torch.float32)


def _loss_all(h, weight, bias, t, cfg: CEConfig):
    """Forward of the two-pass strategy: per-token losses [N], row max [N] and log s [N] (float32)."""
    N = h.shape[0]
    h, weight, bias = gemm_operands(h, weight, bias)
    bufs = ChunkBuffers(cfg.n_tok, cfg.n_voc, h.dtype, h.device)
    losses, ms, lss = (torch.empty(N, dtype=torch.float32, device=h.device) for _ in range(3))
    for a in range(0, N, cfg.n_tok):
        b = min(N, a + cfg.n_tok)
        valid = t[a:b] != cfg.ignore_index
        m, log_s, zt, zsum = lse_pass(h[a:b], weight, bias, t[a:b], valid, cfg, bufs)
        losses[a:b] = token_loss(m, log_s, zt, zsum, valid, cfg)
        ms[a:b], lss[a:b] = m, log_s
    return losses, ms, lss


class LinearCrossEntropy(torch.autograd.Function):
    """Autograd Function behind :func:`linear_cross_entropy` (see there).

    Fused (scalar reduction, full rows): forward computes the gradients too and backward scales
    them. Otherwise forward keeps the per-token row max and log-normalizer [N] (float32) and backward
    recomputes the logit tiles once (Cut Cross-Entropy's recompute strategy, Wijmans et al. 2024 §4).
    """

    @staticmethod
    def forward(ctx, h, weight, bias, t, cfg: CEConfig, need_h: bool, need_w: bool, need_b: bool):
        ctx.cfg, ctx.needs = cfg, (need_h, need_w, need_b)
        ctx.fused = cfg.reduction != "none" and cfg.n_voc >= cfg.V
        if not ctx.fused:
            losses, ms, lss = _loss_all(h, weight, bias, t, cfg)
            ctx.save_for_backward(h, weight, bias, t, ms, lss)
            return _reduce(losses, cfg)
        N, dev = h.shape[0], h.device
        hg, Wg, bg = gemm_operands(h, weight, bias)
        bufs = ChunkBuffers(cfg.n_tok, cfg.n_voc, hg.dtype, dev, aux=cfg.softcap is not None)
        gh = torch.empty_like(h) if need_h else None
        gW32 = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        gb32 = torch.zeros(cfg.V, dtype=torch.float32, device=dev) if need_b else None
        losses = torch.empty(N, dtype=torch.float32, device=dev)
        for a in range(0, N, cfg.n_tok):
            b = min(N, a + cfg.n_tok)
            valid = t[a:b] != cfg.ignore_index
            rs = valid.to(torch.float32) * _mean_scale(cfg)
            losses[a:b] = fused_chunk(hg[a:b], Wg, bg, t[a:b], valid, rs, cfg, bufs,
                                      None if gh is None else gh[a:b], gW32, gb32)
        ctx.grads = (gh, None if gW32 is None else gW32.to(weight.dtype),
                     None if gb32 is None else gb32.to(bias.dtype))
        return _reduce(losses, cfg)

    @staticmethod
    def backward(ctx, grad_out):
        cfg = ctx.cfg
        need_h, need_w, need_b = ctx.needs
        go = grad_out.detach().to(torch.float32)
        if ctx.fused:
            grads, ctx.grads = ctx.grads, None
            if go.item() != 1.0:
                grads = tuple(None if g is None else (g.float() * go).to(g.dtype) for g in grads)
            return (*grads, None, None, None, None, None)
        h, weight, bias, t, ms, lss = ctx.saved_tensors
        N, dev = h.shape[0], h.device
        row = go.reshape(-1) if cfg.reduction == "none" else (go * _mean_scale(cfg)).expand(N)
        hg, Wg, bg = gemm_operands(h, weight, bias)
        bufs = ChunkBuffers(cfg.n_tok, cfg.n_voc, hg.dtype, dev, aux=cfg.softcap is not None)
        gh = torch.zeros_like(h) if need_h else None
        gW = torch.empty_like(weight) if need_w else None
        gW_acc = None
        if need_w and N > cfg.n_tok:
            gW_acc = gW if weight.dtype == torch.float32 else torch.empty(weight.shape, dtype=torch.float32, device=dev)
            gW_acc.zero_()
        gb32 = torch.zeros(cfg.V, dtype=torch.float32, device=dev) if need_b else None
        for a in range(0, N, cfg.n_tok):
            b = min(N, a + cfg.n_tok)
            valid = t[a:b] != cfg.ignore_index
            rs = row[a:b] * valid.to(torch.float32)
            grad_pass(hg[a:b], Wg, bg, t[a:b], valid, ms[a:b], lss[a:b], rs, cfg, bufs,
                      None if gh is None else gh[a:b], gW, gW_acc, gb32)
        if gW_acc is not None and gW_acc is not gW:
            gW.copy_(gW_acc)
        return gh, gW, None if gb32 is None else gb32.to(bias.dtype), None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, *, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                         logit_scale: float = 1.0, chunk_bytes: int | None = None,
                         chunk_tokens: int | None = None, chunk_vocab: int | None = None) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against targets, chunked, with a fused backward.

    Per valid token i with logits z (after :func:`vocablens.logit_transform.transform_logits`, i.e.
    ``logit_scale`` and the softcap): ``loss_i = lse_i - (1-a)·z_{i,y_i} - (a/V)·Σ_j z_ij + λ·lse_i²``
    with a = label_smoothing (PyTorch's formula, ``torch.nn.CrossEntropyLoss``) and λ = z_loss (PaLM,
    Chowdhery et al. 2022, §5). Computed from logit differences only (see :mod:`vocablens.ops.ce_passes`).

    Args:
        hidden: [N, d] or [..., d] float32/bf16/fp16/float64. weight: [V, d], same dtype. targets:
            hidden's leading shape, int ids in [0, V) or ``ignore_index``. bias: [V] optional.
        reduction: "mean" (over non-ignored tokens), "sum" or "none" ([...] per-token losses).
        ignore_index: int; targets equal to it give loss 0 and no gradient. A batch where every
            target is ignored gives 0 for "mean" and "sum" (not NaN) and zero gradients.
        label_smoothing: in [0, 1]. z_loss: coefficient of lse², >= 0 (0 = off).
        softcap: final-logit softcap c or None; logit_scale: factor before the softcap.
        chunk_bytes: None or an int >= 1, the size in bytes of one float32 tile of logits [n, v]
            (default :func:`~vocablens.ops.chunking.default_chunk_bytes`).
        chunk_tokens: None or an int >= 1, the tile's tokens n (instead of ``chunk_bytes``).
        chunk_vocab: None or an int >= 1, the tile's vocabulary columns v.

    Returns:
        float32 scalar (mean/sum) or [...] float32 per-token losses (none), in nats.

    Raises:
        ShapeMismatch: d, dtypes or target shape disagree.
        BadInput: empty input, reduction not in (mean, sum, none), targets outside [0, V) other than
            ignore_index, ignore_index not an int, label_smoothing outside [0, 1], z_loss negative, a
            chunk size not None or an int >= 1, bad logit_scale / softcap.

    Memory: one [n, v] float32 tile (two with softcap), two floats per token, and the gradients;
    for bf16/fp16 inputs also a float32 [V, d] gradient accumulator and, on CPU, a float32 copy of
    W (elsewhere one tile in the input dtype). Under ``torch.no_grad()`` or when no input requires grad, only the
    forward pass runs.
    """
    check_choice("reduction", reduction, REDUCTIONS)
    check_head(hidden, weight, bias)
    logit_scale, softcap = check_head_transform(logit_scale, softcap)
    ignore_index = check_int("ignore_index", ignore_index)
    label_smoothing = check_real("label_smoothing", label_smoothing, 0.0, 1.0)
    z_loss = check_real("z_loss", z_loss, 0.0)
    sizes = [check_size(n, v) for n, v in (("chunk_bytes", chunk_bytes), ("chunk_tokens", chunk_tokens),
                                           ("chunk_vocab", chunk_vocab))]
    if not isinstance(targets, torch.Tensor):
        raise ShapeMismatch(f"targets must be a tensor of token ids; got {type(targets).__name__}")
    h, t, lead = flatten_tokens(hidden, targets)
    check_nonempty("hidden", h)
    N, V = h.shape[0], weight.shape[0]
    check_ids("targets", t, V, ignore_index=ignore_index)
    grad_on = torch.is_grad_enabled()
    need_h = grad_on and hidden.requires_grad
    need_w = grad_on and weight.requires_grad
    need_b = grad_on and bias is not None and bias.requires_grad
    lowp_grad = h.dtype != torch.float32 and (need_h or need_w or need_b)
    n_tok, n_voc = override_sizes(*train_chunk_sizes(N, V, sizes[0], low_precision_grad=lowp_grad), N, V,
                                  sizes[1], sizes[2])
    cfg = CEConfig(reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                   softcap=softcap, logit_scale=logit_scale, n_tok=n_tok, n_voc=n_voc,
                   count=int((t != ignore_index).sum()), V=V)
    if not (need_h or need_w or need_b):
        with torch.no_grad():
            out = _reduce(_loss_all(h, weight, bias, t, cfg)[0], cfg)
    else:
        out = LinearCrossEntropy.apply(h.contiguous(), weight, bias, t, cfg, need_h, need_w, need_b)
    return out.reshape(lead) if reduction == "none" else out


__all__ = ["LinearCrossEntropy", "linear_cross_entropy"]
