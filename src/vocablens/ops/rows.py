"""Log-probabilities of logit rows already in memory: the one place outside ``ops`` / ``models``
code normalizes scores over the vocabulary.

Callers that hold a block of complete logit rows (a few generated positions, one streamed block of
the head, a verified [T, V] slice) read them through here; callers with many positions use
:func:`vocablens.ops.token_logprobs` / :func:`vocablens.ops.kl_readout`, which never form [N, V].
"""

from __future__ import annotations

import torch


def row_logprobs(z: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None,
                 inplace: bool = False) -> torch.Tensor:
    """Logits z [..., V, ...] -> log-probabilities (nats) over ``dim``: ``z - logsumexp(z, dim)``.

    Args:
        z: logits, any float dtype; -inf entries (masked rows) stay -inf.
        dim: the vocabulary dimension.
        dtype: compute and return in this dtype (e.g. torch.float64 where changes below float32's
            resolution are measured); None keeps z's dtype.
        inplace: overwrite z (only when no dtype change is asked; saves one [..., V] buffer).

    Returns:
        log-probs, z's shape, ``dtype`` (or z's).
    """
    if dtype is not None and z.dtype != dtype:
        z, inplace = z.to(dtype), True
    lse = torch.logsumexp(z, dim, keepdim=True)
    return z.sub_(lse) if inplace else z - lse


def row_top1_prob(z: torch.Tensor) -> torch.Tensor:
    """Logits z [..., V] -> probability of each row's most likely entry [...], z's dtype:
    ``exp(max z - logsumexp z)`` (no [..., V] probabilities formed)."""
    return torch.exp(z.amax(-1) - torch.logsumexp(z, -1))
