"""Vocabulary-parallel embedding and LM head on torch.distributed (gloo on CPU, NCCL on GPU).

Each rank holds a contiguous shard of rows ``[start, stop)`` of the [V, d] matrix; shards may be
uneven, with no padding rows that could leak into a softmax.

* :mod:`~vocablens.ops.vocab_parallel.comm` — shard ranges and the autograd-aware collectives
  (Megatron-LM's copy-to / reduce-from / gather-from region; Shoeybi et al. 2019, arXiv 1909.08053 §3).
* :mod:`~vocablens.ops.vocab_parallel.functional` — embedding, the head's local logits, gathered
  logits, argmax and top-k equal to torch's on the full logits.
* :mod:`~vocablens.ops.vocab_parallel.losses` — logsumexp, log-softmax and cross-entropy over the
  global V without gathering logits, from logit differences only.
* :mod:`~vocablens.ops.vocab_parallel.modules` — ``VocabParallelEmbedding`` and ``VocabParallelLMHead``.

Gradient convention: replicated outputs (the loss, the logsumexp, the embedding output) are assumed
to be computed identically on every rank and receive the same upstream gradient there; sharded
outputs (local logits, local log-probabilities) receive each rank's own slice of the gradient.
Every collective runs on ``group`` (default: the world). Inputs are checked before any collective.
"""

from vocablens.ops.vocab_parallel.comm import copy_to_region, reduce_from_region, shard_range, shard_sizes
from vocablens.ops.vocab_parallel.functional import (
    vocab_parallel_argmax, vocab_parallel_embedding, vocab_parallel_gather_logits, vocab_parallel_logits,
    vocab_parallel_topk,
)
from vocablens.ops.vocab_parallel.losses import (
    vocab_parallel_cross_entropy, vocab_parallel_log_softmax, vocab_parallel_logsumexp,
)
from vocablens.ops.vocab_parallel.modules import VocabParallelEmbedding, VocabParallelLMHead

__all__ = [
    "VocabParallelEmbedding", "VocabParallelLMHead", "copy_to_region", "reduce_from_region", "shard_range",
    "shard_sizes", "vocab_parallel_argmax", "vocab_parallel_cross_entropy", "vocab_parallel_embedding",
    "vocab_parallel_gather_logits", "vocab_parallel_log_softmax", "vocab_parallel_logits",
    "vocab_parallel_logsumexp", "vocab_parallel_topk",
]
