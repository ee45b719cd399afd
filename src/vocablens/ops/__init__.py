"""Layer 2: computing through the two borders efficiently (tensors in, tensors out; no model knowledge).

* :mod:`~vocablens.ops.embedding` — the lookup as a gather with two backwards, and its address arithmetic.
* :mod:`~vocablens.ops.head` — the LM head at the last (or chosen) positions only.
* :mod:`~vocablens.ops.logprobs` — chunked log-probabilities, top-k, entropy, logsumexp, and a fused
  chunked cross-entropy with backward, never materializing [N, V].
* :mod:`~vocablens.ops.sampling` — temperature, top-k, top-p, min-p sampling without a full sort.
* :mod:`~vocablens.ops.vocab_parallel` — vocabulary-parallel embedding and LM head on torch.distributed.
"""

from vocablens.ops.embedding import LookupCost, embedding_lookup, lookup_cost
from vocablens.ops.head import lm_head_last
from vocablens.ops.logprobs import LinearCrossEntropy, TokenLogprobs, linear_cross_entropy, token_logprobs
from vocablens.ops.sampling import probs_after_filters, sample
from vocablens.ops.vocab_parallel import (
    VocabParallelEmbedding, VocabParallelLMHead, copy_to_region, reduce_from_region, shard_range, shard_sizes,
    vocab_parallel_argmax, vocab_parallel_cross_entropy, vocab_parallel_embedding, vocab_parallel_gather_logits,
    vocab_parallel_log_softmax, vocab_parallel_logits, vocab_parallel_logsumexp, vocab_parallel_topk,
)

__all__ = [
    "LookupCost", "embedding_lookup", "lookup_cost", "lm_head_last",
    "LinearCrossEntropy", "TokenLogprobs", "linear_cross_entropy", "token_logprobs", "probs_after_filters", "sample",
    "VocabParallelEmbedding", "VocabParallelLMHead", "copy_to_region", "reduce_from_region", "shard_range",
    "shard_sizes", "vocab_parallel_argmax", "vocab_parallel_cross_entropy", "vocab_parallel_embedding",
    "vocab_parallel_gather_logits", "vocab_parallel_log_softmax", "vocab_parallel_logits",
    "vocab_parallel_logsumexp", "vocab_parallel_topk",
]
