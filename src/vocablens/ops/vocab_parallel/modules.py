"""``nn.Module`` wrappers: a vocab-parallel embedding and LM head holding this rank's shard of rows."""

from __future__ import annotations

import torch
from torch import nn

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import FLOAT_DTYPES, check_bool, check_float, check_head, check_head_transform, check_int
from vocablens.ops.vocab_parallel.comm import shard_range, world
from vocablens.ops.vocab_parallel.functional import (
    vocab_parallel_argmax, vocab_parallel_embedding, vocab_parallel_gather_logits, vocab_parallel_logits,
    vocab_parallel_topk,
)
from vocablens.ops.vocab_parallel.losses import (
    vocab_parallel_cross_entropy, vocab_parallel_log_softmax, vocab_parallel_logsumexp,
)


def _shard_param(V: int, d: int, group, dtype, device) -> tuple[int, int, nn.Parameter]:
    """(start, stop, an uninitialized [stop - start, d] parameter) of this rank; checks V, d and dtype."""
    V, d = check_int("num_embeddings", V, 1), check_int("embedding_dim", d, 1)
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise BadInput(f"dtype must be one of {', '.join(map(str, FLOAT_DTYPES))}; got {dtype!r}")
    rank, ws = world(group)
    start, stop = shard_range(V, ws, rank)
    return start, stop, nn.Parameter(torch.empty(stop - start, d, dtype=dtype, device=device))


class VocabParallelEmbedding(nn.Module):
    """Embedding whose [V, d] rows are split over the ranks of ``group``
    (:func:`~vocablens.ops.vocab_parallel.functional.vocab_parallel_embedding`).

    Args:
        num_embeddings: global V. embedding_dim: d. group: process group (None = world).
        scale: optional input scale. dtype/device: of this rank's shard [V_r, d].

    Raises:
        BadInput: world size > V, V or d not a positive int, dtype not a float dtype.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None, *, scale: float | None = None,
                 dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.vocab_start, self.vocab_stop, self.weight = _shard_param(num_embeddings, embedding_dim, group, dtype, device)
        self.V, self.d, self.group, self.scale = num_embeddings, embedding_dim, group, scale
        nn.init.normal_(self.weight)

    @classmethod
    def from_full(cls, W: torch.Tensor, group=None, *, scale: float | None = None) -> "VocabParallelEmbedding":
        """This rank's shard copied from a full [V, d] matrix (the same on every rank)."""
        check_float("W", W)
        if W.dim() != 2:
            raise ShapeMismatch(f"W must be [V, d]; got {tuple(W.shape)}")
        mod = cls(W.shape[0], W.shape[1], group, scale=scale, dtype=W.dtype, device=W.device)
        with torch.no_grad():
            mod.weight.copy_(W[mod.vocab_start:mod.vocab_stop])
        return mod

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] in [0, V) -> [..., d] (the same on every rank)."""
        return vocab_parallel_embedding(ids, self.weight, self.vocab_start, self.V, self.group, self.scale)


class VocabParallelLMHead(nn.Module):
    """LM head whose [V, d] rows (and bias) are split over ranks; logits never gathered unless asked.

    Args:
        in_features: d. num_embeddings: global V. bias: add a [V] bias (sharded).
        softcap: final-logit softcap or None; logit_scale: factor before it. group: process group.

    Raises:
        BadInput: world size > V, V or d not a positive int, bias not a bool, dtype not a float
            dtype, bad logit_scale / softcap.
    """

    def __init__(self, in_features: int, num_embeddings: int, bias: bool = False, group=None, *,
                 softcap: float | None = None, logit_scale: float = 1.0,
                 dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        self.vocab_start, self.vocab_stop, self.weight = _shard_param(num_embeddings, in_features, group, dtype, device)
        self.logit_scale, self.softcap = check_head_transform(logit_scale, softcap)
        self.V, self.d, self.group = num_embeddings, in_features, group
        nn.init.normal_(self.weight, std=in_features ** -0.5)
        n = self.vocab_stop - self.vocab_start
        self.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device)) if check_bool("bias", bias) else None

    @classmethod
    def from_full(cls, W: torch.Tensor, b: torch.Tensor | None = None, group=None, *,
                  softcap: float | None = None, logit_scale: float = 1.0) -> "VocabParallelLMHead":
        """This rank's shard copied from a full head W [V, d] (+ b [V])."""
        check_head(W[:1], W, b, hname="W")
        mod = cls(W.shape[1], W.shape[0], b is not None, group, softcap=softcap, logit_scale=logit_scale,
                  dtype=W.dtype, device=W.device)
        with torch.no_grad():
            mod.weight.copy_(W[mod.vocab_start:mod.vocab_stop])
            if b is not None:
                mod.bias.copy_(b[mod.vocab_start:mod.vocab_stop])
        return mod

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> this rank's float32 logits [..., V_r]."""
        return vocab_parallel_logits(hidden, self.weight, self.bias, self.group,
                                     softcap=self.softcap, logit_scale=self.logit_scale)

    def logsumexp(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> global logsumexp [...] float32."""
        return vocab_parallel_logsumexp(self(hidden), self.group)

    def log_softmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> this rank's slice [..., V_r] of the global log-softmax."""
        return vocab_parallel_log_softmax(self(hidden), self.group)

    def cross_entropy(self, hidden: torch.Tensor, targets: torch.Tensor, **kw) -> torch.Tensor:
        """[N, d], [N] -> cross-entropy (see :func:`vocab_parallel_cross_entropy` for keywords)."""
        return vocab_parallel_cross_entropy(self(hidden), targets, self.vocab_start, self.V, self.group, **kw)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d] -> global argmax ids [N]."""
        return vocab_parallel_argmax(self(hidden), self.vocab_start, self.group)

    def topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, d] -> global top-k (values float32, ids)."""
        return vocab_parallel_topk(self(hidden), k, self.vocab_start, self.V, self.group)

    def gather_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> the full float32 logits [..., V] on every rank."""
        return vocab_parallel_gather_logits(self(hidden), self.V, self.group)


__all__ = ["VocabParallelEmbedding", "VocabParallelLMHead"]
