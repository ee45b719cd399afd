"""Layer 2: computing through the two borders efficiently (tensors in, tensors out; no model knowledge).

* :mod:`~vocablens.ops.embedding` — the lookup as a gather with two backwards, and its address arithmetic.
* :mod:`~vocablens.ops.head` — the LM head at the last (or chosen) positions only.
* :mod:`~vocablens.ops.chunking` — the chunked path over V: chunk sizes, reused buffers, one chunk of
  logits through :func:`vocablens.logit_transform.transform_logits`, exact row statistics.
* :mod:`~vocablens.ops.topk` — deterministic top-k (lowest id first among ties), merged across tiles.
* :mod:`~vocablens.ops.rows` — log-probs / top-1 probability of logit rows already in memory, and their
  float64 statistics (logsumexp, chosen log-probs, KL, max |Δ log p|) one block of rows at a time.
* :mod:`~vocablens.ops.gram` — float64 Grams of W and of the log-probabilities, streamed over V.
* :mod:`~vocablens.ops.logprobs` — chunked log-probabilities of targets, top-k, entropy, logsumexp.
* :mod:`~vocablens.ops.kl` (with :mod:`~vocablens.ops.kl_block`) — KL to a reference through the head,
  forward only; :mod:`~vocablens.ops.kl_train` — the same KL with its gradient (the tuned lens's loss).
* :mod:`~vocablens.ops.cross_entropy` (with :mod:`~vocablens.ops.ce_passes`) — a fused chunked
  cross-entropy with backward, never materializing [N, V].
* :mod:`~vocablens.ops.sampling` — temperature, top-k, top-p, min-p sampling without a full sort.
* :mod:`~vocablens.ops.vocab_parallel` — vocabulary-parallel embedding and LM head on torch.distributed.

Every log-probability and loss here depends only on logit differences (exact for a target 100+ nats
below the max and for logits offset by 1e8), and every public function validates its arguments
(:class:`vocablens.errors.BadInput` naming the argument).
"""

from vocablens.ops.embedding import LookupCost, embedding_lookup, lookup_cost
from vocablens.ops.head import lm_head_last
from vocablens.ops.cross_entropy import LinearCrossEntropy, linear_cross_entropy
from vocablens.ops.logprobs import TokenLogprobs, token_logprobs
from vocablens.ops.rows import (
    row_kl, row_logprobs, row_logprobs_at, row_logsumexp, row_max_abs_logprob_diff, row_top1_prob,
)
from vocablens.ops.sampling import probs_after_filters, sample
from vocablens.ops.vocab_parallel import (
    VocabParallelEmbedding, VocabParallelLMHead, copy_to_region, reduce_from_region, shard_range, shard_sizes,
    vocab_parallel_argmax, vocab_parallel_cross_entropy, vocab_parallel_embedding, vocab_parallel_gather_logits,
    vocab_parallel_log_softmax, vocab_parallel_logits, vocab_parallel_logsumexp, vocab_parallel_topk,
)

__all__ = [
    "LookupCost", "embedding_lookup", "lookup_cost", "lm_head_last",
    "LinearCrossEntropy", "TokenLogprobs", "linear_cross_entropy", "token_logprobs", "row_kl", "row_logprobs", "row_logprobs_at", "row_logsumexp",
    "row_max_abs_logprob_diff", "row_top1_prob", "probs_after_filters", "sample",
    "VocabParallelEmbedding", "VocabParallelLMHead", "copy_to_region", "reduce_from_region", "shard_range",
    "shard_sizes", "vocab_parallel_argmax", "vocab_parallel_cross_entropy", "vocab_parallel_embedding",
    "vocab_parallel_gather_logits", "vocab_parallel_log_softmax", "vocab_parallel_logits",
    "vocab_parallel_logsumexp", "vocab_parallel_topk",
]
from vocablens.ops.kl import KLReadout, kl_readout, logits_readout  # noqa: E402,F401  (KL to a reference)
from vocablens.ops.kl_train import LinearKL, linear_kl  # noqa: E402,F401  (the same KL with its gradient)
