"""One optimizer step of tuned-lens training (:func:`vocablens.lens.train.train`; Belrose et al. 2023,
§3): the micro-batches' losses and gradients (:func:`vocablens.ops.linear_kl`: token-chunked, analytic,
so the [T, V] distributions of all layers never exist at once), summed over torch.distributed
processes, checked for non-finite values, clipped and applied. ``settings`` is a
:class:`~vocablens.lens.train.TrainSettings`.
"""

from __future__ import annotations

import math

import torch

from vocablens.errors import TrainingDiverged
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders
from vocablens.ops.kl_train import linear_kl


def optimizer_step(U, weight: torch.Tensor, lens: TunedLens, opt: torch.optim.Optimizer, borders: Borders,
                   mine: torch.Tensor, settings, dist, step: int, checkpoint_dir) -> tuple[list[float], float, float]:
    """One optimizer step on this process's rows ``mine`` [n, seq_len] int64, in micro-batches of
    ``settings.micro_batch`` rows; gradients and per-layer losses summed over processes (``dist``: the
    ``torch.distributed`` module, or None), clipped to ``settings.grad_clip``.

    Args:
        U: the float32 :class:`~vocablens.models.unembed.Unembedding`; ``weight`` [V, d] its matrix in the
            GEMM dtype. ``step``: 0-based (for messages); ``checkpoint_dir``: named when it diverges.

    Returns:
        (per-layer mean losses [L] in nats, their sum, the gradient norm before clipping).

    Raises:
        TrainingDiverged: a non-finite loss or gradient (naming the layer), or translators that became
            non-finite after the step.
    """
    opt.zero_grad(set_to_none=False)
    layer_loss = torch.zeros(borders.n_layers, dtype=torch.float64, device=weight.device)
    per_row = settings.seq_len if settings.loss == "kl" else settings.seq_len - 1
    scale = 1.0 / (settings.rows_per_step() * per_row)
    for mb in range(0, len(mine), settings.micro_batch):
        layer_loss += _train_microbatch(U, weight, lens, borders, mine[mb: mb + settings.micro_batch], settings, scale)
    if dist is not None:
        layer_loss = _all_reduce(dist, lens, layer_loss)
    means, loss_sum = _checked_losses(lens, layer_loss * scale, step, checkpoint_dir)
    if settings.grad_clip > 0:
        gnorm = float(torch.nn.utils.clip_grad_norm_([lens.weight, lens.bias], settings.grad_clip))
    else:
        gnorm = float(torch.sqrt(lens.weight.grad.pow(2).sum() + lens.bias.grad.pow(2).sum()))
    opt.step()
    if not bool(torch.isfinite(lens.weight).all() & torch.isfinite(lens.bias).all()):
        raise TrainingDiverged(f"training diverged at step {step + 1}: the translators became non-finite")
    return means, loss_sum, gnorm


def _all_reduce(dist, lens: TunedLens, layer_loss: torch.Tensor) -> torch.Tensor:
    """Sum the lens's gradients (in place) and the per-layer losses [L] over processes, in one call."""
    packed = torch.cat([lens.weight.grad.flatten(), lens.bias.grad.flatten(), layer_loss.float()])
    dist.all_reduce(packed)
    nW = lens.weight.numel()
    lens.weight.grad.copy_(packed[:nW].view_as(lens.weight))
    lens.bias.grad.copy_(packed[nW: nW + lens.bias.numel()].view_as(lens.bias))
    return packed[nW + lens.bias.numel():].double()


def _checked_losses(lens: TunedLens, layer_mean: torch.Tensor, step: int, checkpoint_dir) -> tuple[list[float], float]:
    """The per-layer mean losses [L] and their sum as floats (nats), in one host transfer with the
    finite-gradient flags. Raises TrainingDiverged naming the first layer whose loss or gradient is
    not finite."""
    L = layer_mean.shape[0]
    gfin = torch.isfinite(lens.weight.grad).flatten(1).all(1) & torch.isfinite(lens.bias.grad).all(1)
    host = torch.cat([layer_mean, layer_mean.sum()[None], gfin.double()]).tolist()
    means, loss_sum, grad_ok = host[:L], host[L], host[L + 1:]
    bad = [i for i in range(L) if not math.isfinite(means[i])]
    if not bad:
        bad = [i for i in range(L) if not grad_ok[i]]
    if bad:
        where = f"; the last good checkpoint in {checkpoint_dir} is kept" if checkpoint_dir else ""
        raise TrainingDiverged(
            f"training diverged at step {step + 1}: non-finite loss or gradient at layer {bad[0]}"
            f" (layers {bad[:8]}); lower `lr`{where}")
    return means, loss_sum


def _train_microbatch(U, weight: torch.Tensor, lens: TunedLens, borders: Borders, ids: torch.Tensor,
                      settings, scale: float) -> torch.Tensor:
    """Accumulate gradients of one micro-batch into the lens; returns the summed loss per layer [L].

    The loss and its gradient with respect to the normed lens states come from
    :func:`vocablens.ops.linear_kl` (token-chunked, analytic); autograd only runs the translators
    and the float32 final norm.
    """
    L = borders.n_layers
    with torch.no_grad():
        resid, logits = borders.residual_stream(ids)
        B, T = ids.shape
        N = B * T
        H = resid[:L].reshape(L, N, -1).float()
        del resid
        kw: dict = {}
        if settings.loss == "kl":
            kw["reference"] = logits.reshape(N, -1)
        else:
            targets = torch.zeros(B, T, dtype=torch.long, device=logits.device)
            targets[:, :-1] = ids[:, 1:]
            valid = torch.ones(B, T, dtype=torch.bool, device=logits.device)
            valid[:, -1] = False
            kw.update(targets=targets.reshape(N), valid=valid.reshape(N))
    with torch.enable_grad():
        X = U.normed(lens.translate_all(H), torch.float32)
        res = linear_kl(X.detach(), weight, **kw, **U.head_kwargs(), grad_scale=scale,
                        chunk_rows=settings.chunk_rows)
        X.backward(res.grad)
    return res.loss


__all__ = ["optimizer_step"]
