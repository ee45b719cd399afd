"""Score a text under a model: per-token log-probabilities through the chunked LM-head path (layer 3).

The model's blocks run without its LM head (:func:`vocablens.models.blocks_forward.blocks_forward`: the
forward stops after the last block, so the [T, V] logits of ``model(ids)`` are never made), and the
residual stream at the last layer goes through the model's unembedding (``borders.unembedding``:
final norm and project_out by ``U.normed``) and then :func:`vocablens.ops.token_logprobs` on
``U.weight`` with ``U.head_kwargs()`` (bias, logit scale, softcap), so the [T, V] logits are never
materialized. Token t (t >= 1) is scored by the distribution at position
t - 1; the first token has no prefix and is not scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.models.blocks_forward import blocks_forward
from vocablens.ops import token_logprobs
from vocablens.units import plural


@dataclass(frozen=True)
class ScoreResult:
    """Per-token log-probabilities of a text (nats).

    Attributes:
        input_ids: [T] int64 the tokens of the text.
        logprobs: [T-1] float32 log p(token t | tokens < t) for t = 1..T-1.
        entropy: [T-1] float32 entropy (nats) of the distribution that scored token t, or None when
            :func:`score_ids` ran with ``entropy=False``.
        topk_ids: [T-1, k] int64 the k most likely tokens at each scored position (k may be 0).
        topk_logprobs: [T-1, k] float32 their log-probabilities.
        n_bytes: UTF-8 bytes of the scored text (tokens 1..T-1 decoded).
    """

    input_ids: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    n_bytes: int

    @property
    def total_logprob(self) -> float:
        """Sum of the scored tokens' log-probabilities (nats, float64 sum)."""
        return float(self.logprobs.double().sum())

    @property
    def logprob_per_byte(self) -> float:
        """total_logprob / n_bytes (nats per byte; NaN when no byte is scored)."""
        return self.total_logprob / self.n_bytes if self.n_bytes else math.nan

    @property
    def bits_per_byte(self) -> float:
        """-logprob_per_byte / ln 2."""
        return -self.logprob_per_byte / math.log(2)

    @property
    def perplexity(self) -> float:
        """exp(-mean log-probability per scored token)."""
        return math.exp(-self.total_logprob / max(1, self.logprobs.numel()))


@torch.no_grad()
def score_ids(borders, input_ids: torch.Tensor, top_k: int = 0, n_bytes: int = 0, *,
              entropy: bool = True) -> ScoreResult:
    """Score token ids under the model behind ``borders``.

    Args:
        borders: a :class:`vocablens.models.Borders`.
        input_ids: [T] or [1, T] int64, T >= 2.
        top_k: alternatives per position (0..V).
        n_bytes: UTF-8 bytes of the scored text (for per-byte figures).
        entropy: also the entropy of each scoring distribution (``vocablens score`` prints it); False
            skips its passes over the [T-1, V] logits (``ScoreResult.entropy`` is then None).

    Returns:
        :class:`ScoreResult`.

    Raises:
        BadInput: fewer than 2 tokens, top_k outside [0, V], entropy not a bool.
    """
    ids = input_ids.reshape(-1).to(borders.device, torch.int64)
    if ids.numel() < 2:
        raise BadInput(f"the text has {plural(ids.numel(), 'token')}: scoring needs at least 2 (the first has no prefix)")
    U = borders.unembedding
    V = U.vocab_size
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= V:
        raise BadInput(f"`top_k` must be an int in [0, {V}]; got {top_k!r}")
    if not isinstance(entropy, bool):
        raise BadInput(f"`entropy` must be True or False; got {entropy!r}")
    h = U.normed(blocks_forward(borders, ids[None])[0])  # [T, d_emb]: layer L, final norm once
    r = token_logprobs(h[:-1], U.weight, ids[1:], **U.head_kwargs(), top_k=top_k, entropy=entropy)
    k = top_k
    empty_i = torch.zeros(ids.numel() - 1, 0, dtype=torch.int64, device=ids.device)
    empty_f = torch.zeros(ids.numel() - 1, 0, dtype=torch.float32, device=ids.device)
    return ScoreResult(input_ids=ids, logprobs=r.logprob, entropy=r.entropy,
                       topk_ids=r.topk_ids if k else empty_i, topk_logprobs=r.topk_logprobs if k else empty_f,
                       n_bytes=int(n_bytes))
