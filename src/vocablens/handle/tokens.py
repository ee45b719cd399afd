"""Tokens and positions as a caller names them, on :class:`vocablens.Model`: ``token_id`` (THE way to get
one token's id, from its text or its id) and ``position`` (a position of a prompt, negative from the end).
Text becomes ids in :class:`~vocablens.models.LoadedModel` (``encode``, ``prompt_ids``); this topic only
names single tokens and positions in what was encoded.
"""

from __future__ import annotations

import torch

from vocablens.handle.protocols import NeedsTokens


class TokenInput:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsTokens`)."""

    def token_id(self: NeedsTokens, token: str | int, what: str = "token") -> int:
        """A single token named by its text (``" Paris"``; ``"4"`` is the text "4") or explicitly by its
        id (an int, or the string ``"id:4"``) -> the id: THE rule of every place that takes a token
        (:func:`vocablens.models.token_input.resolve_token`). A text that spells several tokens is
        refused, never replaced by its first token.

        Args:
            what: how the caller named the argument (``target``, ``--target`` ...), for the messages.

        Raises:
            BadInput: ``id:`` not followed by an integer, a type other than str or int.
            TokenNotInVocabulary: empty, several tokens, or an id outside the real vocabulary.
        """
        from vocablens.models.token_input import resolve_token

        b = self.borders
        return resolve_token(self.tokenizer, token, b.vocab_size, b.real_vocab_size, what=what)[0][0]

    def position(self: NeedsTokens, text, position: int) -> int:
        """A position of a prompt (text, or ids [T] / [1, T]; negative counts from the end) -> 0..T-1.

        Raises:
            BadInput: outside [-T, T).
        """
        from vocablens.lens.logit import resolve_positions

        return int(resolve_positions(int(self._ids(text).shape[-1]), [position])[0])

    def _ids(self: NeedsTokens, x, chat: bool = False, prefix: str = "", what: str = "text") -> torch.Tensor:
        """Text (encoded by :meth:`encode`) or the ids of one prompt (checked by :meth:`prompt_ids`,
        never cast) -> [1, T] int64.

        Raises:
            BadInput: as :meth:`encode` / :meth:`prompt_ids` (ids of several prompts included).
        """
        if isinstance(x, str):
            return self.encode(x, chat=chat, prefix=prefix)
        return self.prompt_ids(x, what=what)[0].reshape(1, -1)

    def _first_token(self: NeedsTokens, text: str | int, what: str = "token") -> tuple[int, str | None]:
        """A token string that may spell several tokens -> ``(its first token's id, a note naming them
        all or None)``, for the workflows that take a word and say which token they read (``steer``);
        every other place takes exactly one token (:meth:`token_id`).

        Raises:
            BadInput, TokenNotInVocabulary: as :meth:`token_id`, save several tokens.
        """
        from vocablens.models.token_input import resolve_token

        ids, note = resolve_token(self.tokenizer, text, self.borders.vocab_size, several="first", what=what)
        return int(ids[0]), note


__all__ = ["TokenInput"]
