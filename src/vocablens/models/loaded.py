"""What every loader returns: :class:`LoadedModel` (the model, its tokenizer, its borders, its provenance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vocablens.models.provenance import Provenance


@dataclass
class LoadedModel:
    """What :func:`load` returns: the model, its tokenizer, its two borders and its provenance.

    Unpacks as ``model, tokenizer, borders, provenance = vocablens.load(...)``.
    """

    model: Any
    tokenizer: Any
    borders: Any
    provenance: Provenance

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.borders, self.provenance))

    def without_tokenizer(self) -> "LoadedModel":
        """This model with its tokenizer swapped for a :class:`~vocablens.models.token_table.TokenTable`
        of its token strings (~0.6 MiB for SmolLM2's 49,152 tokens; the tokenizer holds ~14 MiB).

        For commands that encode a little input, then run a memory-heavy analysis, then print token
        strings (``project``): encode first, then ``lm = lm.without_tokenizer()`` before the heavy
        phase. The new object's ``tokenizer`` gives the same :func:`~vocablens.models.tokens.token_str`
        strings but cannot encode; the model, borders and provenance are shared. ``self`` is left as it
        is (a caller's model keeps its tokenizer), so the tokenizer is freed only once nothing else
        refers to it (the borders keep no reference); its heap returns to the OS after a
        ``malloc_trim`` (the CLI's ``trim_heap``). On a model that has a table already: itself.
        """
        import dataclasses

        from vocablens.models.token_table import TokenTable

        if isinstance(self.tokenizer, TokenTable):
            return self
        return dataclasses.replace(self, tokenizer=TokenTable(self.tokenizer))


__all__ = ["LoadedModel"]
