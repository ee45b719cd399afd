"""Scoring a text and continuing it, on :class:`vocablens.Model`: ``score`` (``vocablens score``:
per-token log-probabilities through the chunked head) and ``generate`` (``vocablens generate``:
greedy or sampled, with early exit), one process, vocab-parallel or tensor-parallel under torchrun.
"""

from __future__ import annotations

from typing import Sequence

import torch

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsScoring
from vocablens.models.tensor_parallel import is_tensor_parallel


class Scoring:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsScoring`)."""

    def score(self: NeedsScoring, text: str | Sequence[int] | torch.Tensor, top_k: int = 3, special_text: str = "parse",
              vocab_parallel: bool = False) -> R.Score:
        """Per-token log-probabilities (nats) of a text, total and per byte
        (``vocablens score TEXT --json``; :func:`~vocablens.generate.score.score_ids`).

        The first token is scored only when the tokenizer adds BOS; bits per byte divide by the bytes
        of exactly the scored tokens (special tokens with their text).

        Args:
            text: a string (encoded by :meth:`encode`) or its ids as the model reads them (an integer
                tensor [T] / [1, T] or a list of ints; ids of several prompts are refused).
            top_k: alternatives per position (0 = none).
            special_text: ``parse`` or ``plain`` (:meth:`encode`), for a string.
            vocab_parallel: under torchrun, split the embedding and head rows over the ranks (tp=True: always).

        Raises:
            BadInput: empty text, top_k < 0, fewer than 2 tokens; ids that are not an integer tensor
                or list of ints, or of several prompts. TokenNotInVocabulary: an id outside [0, V).
            PromptTooLong: over the context (text or ids).
        """
        from vocablens.generate.score import score_ids

        checks.at_least_ge("top_k", top_k, 0)
        checks.score_text(text)
        ids = self.encode(text, special_text=special_text)[0] if isinstance(text, str) else self._ids(text)[0]
        n_bytes = self.n_bytes(ids[1:])
        if vocab_parallel or is_tensor_parallel(self.borders):
            from vocablens.parallel.processes import VocabParallelModel

            res = VocabParallelModel(self.borders).score(ids, top_k=top_k, n_bytes=n_bytes)
        else:
            res = score_ids(self.borders, ids, top_k=top_k, n_bytes=n_bytes)
        return self._result(R.Score, res, text=text)

    def generate(self: NeedsScoring, text: str, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 seed: int | None = None, top: int = 0,
                 chat: bool = False, early_exit=None, on_token=None, head=None,
                 vocab_parallel: bool = False) -> R.Generation:
        """Continue a text (``vocablens generate TEXT --json``; :func:`vocablens.generate.generate`):
        greedy by default, sampled with a temperature and top-k / top-p / min-p.

        Args:
            top: alternatives kept per new token. early_exit: an
                :class:`~vocablens.generate.ExitRule` (tuned: this model's lens).
            on_token: called with each :class:`~vocablens.generate.loop.GeneratedToken` as it comes.
            head: a vocabulary-parallel head (torchrun), else None.
            vocab_parallel: under torchrun, split the embedding and head rows over the ranks (builds ``head``; tp=True: always).

        Raises:
            BadInput: empty prompt, max_new_tokens < 1, bad sampling arguments.
        """
        from vocablens.generate import generate

        checks.at_least("max_new_tokens", max_new_tokens)
        ids = self.encode(text, chat=chat)
        if early_exit is not None:
            early_exit.validate(self.borders.n_layers)
        if (vocab_parallel or is_tensor_parallel(self.borders)) and head is None:
            from vocablens.parallel.processes import VocabParallelModel

            head = VocabParallelModel(self.borders)  # each rank keeps V/world rows
        res = generate(self.borders, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, min_p=min_p, seed=seed, stop_ids=self.stop_ids(),
                       top_n=top, early_exit=early_exit, on_token=on_token, head=head)
        return self._result(R.Generation, res)

    def stop_ids(self: NeedsScoring) -> list[int]:
        """EOS ids from the generation config and the tokenizer (generation ends after one)."""
        ids: set[int] = set()
        gc = getattr(self.model, "generation_config", None)
        for src in (getattr(gc, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        return sorted(ids)


__all__ = ["Scoring"]
