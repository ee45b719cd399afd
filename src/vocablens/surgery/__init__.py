"""Vocabulary surgery (layer 3): add tokens to a causal LM, or trim its vocabulary to a corpus.

- :func:`expand_vocab` adds tokens, growing the embedding and the LM head together (tied models
  stay tied), with new rows initialised from what exists (subtoken mean, Hewitt's global mean).
- :func:`verify_expansion` measures what the expansion did to held-out text: new-token mass
  against Hewitt's k/(V+k) bound, KL(old ‖ new), perplexity before and after.
- :func:`trim_vocab` keeps the tokens a corpus uses (plus specials and what BPE needs to stay
  lossless), rewrites the tokenizer and slices both matrices; :func:`verify_trim` proves the
  trimmed model computes the same logits.
- :mod:`vocablens.surgery.io` writes the result as a plain Hugging Face directory, atomically.
"""

from vocablens.surgery.expand import (
    INIT_METHODS, ExpandResult, Expansion, NewToken, expand_vocab, init_rows,
)
from vocablens.surgery.trim import TrimResult, Trimmed, corpus_token_ids, plan_bpe_trim, trim_vocab
from vocablens.surgery.verify import (
    TRIM_LOGPROB_TOLERANCE, ExpandVerification, TrimVerification, accept_trim, verify_expansion, verify_trim,
)

__all__ = [
    "INIT_METHODS", "ExpandResult", "Expansion", "NewToken", "expand_vocab", "init_rows",
    "TrimResult", "Trimmed", "corpus_token_ids", "plan_bpe_trim", "trim_vocab",
    "ExpandVerification", "TrimVerification", "verify_expansion", "verify_trim", "accept_trim",
    "TRIM_LOGPROB_TOLERANCE",
]
