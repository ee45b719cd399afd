"""Chosen tokens followed through the lens layer by layer (the explorer's trajectory), streamed over V."""

from __future__ import annotations

from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.lens.logit import Translator, lens_states
from vocablens.models import Borders


def layer_readout(borders: Borders, resid: torch.Tensor, layers: Sequence[int], targets: torch.Tensor, k: int = 1,
                  translator: Translator | None = None):
    """Chosen tokens read through the lens at several layers, streamed over V: their log-probability and
    rank, and the top-k, over the real vocabulary (what the explorer's trajectory shows).

    Args:
        borders: the model's :class:`Borders`.
        resid: the residual stream [L+1, P, d_model] (or [L+1, d_model] at one position), indexed by layer.
        layers: the layers read (0..L); the translator (tuned lens) maps those < L, as in :func:`lens_states`.
        targets: int64 [P] (or a scalar for a 2-D ``resid``), the token followed at each position.
        k: top tokens per (layer, position), 1..real vocabulary.

    Returns:
        :class:`vocablens.ops.TokenLogprobs` with tensors [S, P] ([S] for a 2-D ``resid``), S =
        len(layers): ``logprob`` (nats, normalized over all V), ``target_rank`` (real tokens whose
        logit exceeds the target's, the rank ``logit_lens`` reports as ``final_top1_rank``),
        ``topk_ids`` / ``topk_logprobs`` [.., k] over the real tokens. One LM-head pass
        (:func:`vocablens.ops.token_logprobs`); no [S·P, V] log-probabilities.

    Raises:
        BadInput: k or a target outside the real vocabulary, a layer outside 0..L.
    """
    from vocablens.ops import token_logprobs

    one = resid.dim() == 2
    R = resid[:, None] if one else resid
    real, L = borders.real_vocab_size, borders.n_layers
    bad = [int(x) for x in layers if not 0 <= int(x) <= L]
    if bad:
        raise BadInput(f"layer {bad[0]} is outside 0..{L}")
    t = torch.as_tensor(targets, dtype=torch.int64).reshape(-1).to(R.device)
    if t.numel() != R.shape[1] or bool(((t < 0) | (t >= real)).any()):
        raise BadInput(f"targets must be {R.shape[1]} token ids in 0..{real - 1}; got {t.tolist()[:8]}")
    U = borders.unembedding.float32()
    X = lens_states(borders, R, list(layers), translator)  # [S, P, d_emb] float32
    S, P = X.shape[0], X.shape[1]
    r = token_logprobs(X.to(U.weight.dtype), U.weight, t.expand(S, P).contiguous(), top_k=k, topk_cols=real,
                       rank=True, **U.head_kwargs())
    if not one:
        return r
    return type(r)(**{f: None if v is None else v[:, 0] for f, v in vars(r).items()})


__all__ = ["layer_readout"]
