"""The geometry of the two matrices, on :class:`vocablens.Model`: what they cost (``anatomy``), whether the
head is tied (``tie_check``), a token's nearest neighbours (``neighbors``) and words in 3-D (``pca``)."""

from __future__ import annotations

from typing import Sequence

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsMatrices


class Geometry:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsMatrices`)."""

    def anatomy(self: NeedsMatrices, batch: int = 1, context: int = 4096, dtype: str = "float32",
                name: str | None = None, notes: Sequence[str] | None = None) -> R.Anatomy:
        """Parameters, bytes and FLOPs of the embedding and LM head, counted on the loaded weights
        (``vocablens anatomy --load --json``; :func:`~vocablens.accounting.anatomy.anatomy`).

        Args:
            batch: the batch of the logits tensor [batch, context, V] sized.
            context: its context length, also for attention FLOPs.
            dtype: the logits' dtype (``float32``, ``bfloat16``, ``float16``).
            name: the column's name (default: the spec it was loaded from).
            notes: notes put first (default: the provenance's, e.g. a GGUF file's metadata that
                disagrees with its tensors).

        Raises:
            BadInput: batch or context < 1, an unknown dtype.
        """
        from vocablens.accounting.anatomy import anatomy, logits_memory

        logits_memory(1, batch, context, dtype)
        return self._result(R.Anatomy, anatomy(self.borders, name=name or self.spec or self.provenance.name,
                                               batch=batch, context=context, logits_dtype=dtype,
                                               source="loaded model",
                                               notes=tuple(getattr(self.provenance, "notes", ()) or ())
                                               if notes is None else tuple(notes)))

    def tie_check(self: NeedsMatrices) -> R.TieCheck:
        """Whether the head is tied, by storage and by value (:func:`~vocablens.geometry.tying.tie_check`)."""
        from vocablens.geometry.tying import tie_check

        return self._result(R.TieCheck, tie_check(self.borders))

    def neighbors(self: NeedsMatrices, tokens: str | Sequence[str], k: int = 10, mean: bool = False) -> R.Neighbors:
        """Cosine nearest neighbours of token strings in the embedding and an untied head
        (``vocablens neighbors TOKEN... -k K --json``; :func:`~vocablens.geometry.embedding.nearest_neighbors`).

        Args:
            tokens: a token string (``" king"``: the leading space is part of a word-initial token; ``"4"``
                is the text "4"), an id (an int or ``"id:N"``), or several.
            k: neighbours per token, >= 1.
            mean: a string of several tokens uses the mean of their rows (default: its first token).

        Raises:
            BadInput: k < 1. TokenNotInVocabulary: an empty string, or one that encodes to no token.
        """
        from vocablens.geometry.embedding import nearest_neighbors

        tokens = [tokens] if isinstance(tokens, (str, int)) else list(tokens)
        tokens = [f"id:{t}" if isinstance(t, int) and not isinstance(t, bool) else t for t in tokens]  # as shown
        checks.at_least("k", k)
        checks.token_strings(tokens)
        return self._result(R.Neighbors, nearest_neighbors(self.borders, self.tokenizer, tokens, k=k, use_mean=mean))

    def pca(self: NeedsMatrices, words: Sequence[str] | dict[str, Sequence[str]] | None = None, prefix: str = " ",
            seed: int = 0) -> R.WordPCA:
        """3-D PCA of the embedding rows of words (the report's figure; ``.figure()`` draws it).

        Args:
            words: a list of words, or group name -> words (default: the report's groups).
            prefix: put in front of each word (a leading space: the word-initial token).
            seed: the random projection's seed.

        Raises:
            BadInput: fewer than 4 of the words are single tokens.
        """
        from vocablens.geometry.embedding import word_pca

        groups = {"words": list(words)} if words is not None and not isinstance(words, dict) else words
        return self._result(R.WordPCA, word_pca(self.borders, self.tokenizer, groups, prefix=prefix, seed=seed))


__all__ = ["Geometry"]
