"""Parameters and residual-stream updates read in vocabulary space (analysis layer).

Three readings, for every family :class:`~vocablens.models.Borders` and :mod:`vocablens.models.blocks`
support, with no family ``if``:

1. **Parameters** (no forward pass; Dar et al. 2022, "Analyzing Transformers in Embedding Space",
   §2-3): a parameter vector in the residual space is read by multiplying it with the unembedding.
   - :mod:`.readout`: the readout matrix (``borders.unembedding.readout``, logit scale and, by
     default, the final norm's gain folded in) and the input embedding.
   - :mod:`.vectors`: :func:`project_vectors`, FFN value vectors through the readout and key vectors
     through the input embedding; :func:`sample_neurons`.
   - :mod:`.search`: :func:`search_tokens`, the reverse direction: the value vectors that most single
     out a token, ranked by the token's z-score among each vector's own logits (Geva et al. 2022,
     "Transformer Feed-Forward Layers Build Predictions by Promoting Concepts in the Vocabulary
     Space", §3), exact and without projecting every vector.
   - :mod:`.interpretable`: :func:`interpretable_vectors`, the sampled value vectors whose top
     tokens stand out most of their own logits (the criterion is returned with the result).
   - :mod:`.circuits`: :func:`head_circuit`, one head's OV circuit ``E W_V W_O Rᵀ`` or QK circuit
     ``E W_Q W_Kᵀ Eᵀ`` (Dar et al. §2.2; Elhage et al. 2021), its top token pairs.

   **The final norm's gain.** The unembedding reads the stream *after* the final norm, which multiplies
   each coordinate by a learned gain (and divides by a per-position scale that does not change which
   token wins). With ``apply_norm_gain=True`` (the default) a vector v is read as ``U (g ⊙ v)``, the
   map the model applies up to that positive scale; ``False`` reads ``U v`` as Dar et al. do. Nothing
   is folded into the checkpoint. Nothing here holds more than one chunk of rows x V at a time.

2. **Updates** (:mod:`.explain`, one forward pass; Geva et al. 2022 §2): per block, the attention and
   FFN updates, FFN sub-updates and direct logit attribution at one position.

3. **Settling** (:mod:`.settle`): where the lens's top-1 settles over a corpus, and early exits
   (Geva et al. 2022 §5.2).

All results are frozen dataclasses of tensors and numbers; scores are logits (nats of unnormalized
log-probability) per unit of the vector read, log-probabilities are in nats, all math is float32.
"""

from vocablens.vocab_space.circuits import HeadCircuit, head_circuit
from vocablens.vocab_space.explain import APPROXIMATION, Explanation, BlockExplanation, SubUpdate, explain
from vocablens.vocab_space.interpretable import InterpretableVectors, interpretable_vectors
from vocablens.vocab_space.readout import input_embedding, readout
from vocablens.vocab_space.search import CRITERION, TokenSearch, ValueStats, search_token, search_tokens, value_stats
from vocablens.vocab_space.settle import DEFAULT_THRESHOLDS, ExitPoint, SettleResult, settle
from vocablens.vocab_space.vectors import VectorProjection, project_vectors, sample_neurons

__all__ = [
    "APPROXIMATION", "CRITERION", "DEFAULT_THRESHOLDS", "ExitPoint", "Explanation", "HeadCircuit",
    "InterpretableVectors", "BlockExplanation", "SettleResult", "SubUpdate", "TokenSearch", "ValueStats",
    "VectorProjection", "explain", "head_circuit", "input_embedding", "interpretable_vectors",
    "project_vectors", "readout", "sample_neurons", "search_token", "search_tokens", "settle", "value_stats",
]
