"""A tokenizer's token strings without the tokenizer: :class:`TokenTable` (see its docstring)."""

from __future__ import annotations

from vocablens.models.tokens import token_piece, special_ids, vocab_kind


class _Strings:
    """A list of ``str | None`` packed into one UTF-8 buffer and its offsets (two allocations, not one
    Python object per string: no small-object heap left behind)."""

    def __init__(self, items: list) -> None:
        from array import array
        from itertools import accumulate

        enc = [b"" if x is None else x.encode("utf-8", "surrogatepass") for x in items]
        self._none = frozenset(i for i, x in enumerate(items) if x is None)
        self._blob = b"".join(enc)
        self._offsets = array("q", accumulate((len(e) for e in enc), initial=0))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, i: int) -> str | None:
        if not 0 <= i < len(self) or i in self._none:
            return None
        return self._blob[self._offsets[i]:self._offsets[i + 1]].decode("utf-8", "surrogatepass")


class TokenTable:
    """What :func:`token_str` and :func:`token_bytes` read of a tokenizer, kept without the tokenizer.

    A loaded fast tokenizer stays resident at about 14 MiB (SmolLM2's 49,152 tokens: vocabulary,
    merges, the Rust model), more than a borders-only analysis can spare in its heavy phase. This
    table keeps, per id, the tokenizer's piece (``convert_ids_to_tokens``), the special and added ids,
    and how pieces become bytes (byte-level or SentencePiece; any other tokenizer: each id's own
    decoding), packed in one buffer (a few bytes per token).
    ``token_str(table, i) == token_str(tokenizer, i)`` for every int ``i`` (the same code reads the
    same pieces). It cannot encode text: encode what you need first
    (:meth:`vocablens.models.LoadedModel.without_tokenizer`).
    """

    def __init__(self, tokenizer) -> None:
        n = int(len(tokenizer))
        added = [int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})]
        n = max([n] + [i + 1 for i in added])  # an added token may sit beyond len() (a gap in the ids)
        self._vocablens_kind = vocab_kind(tokenizer)
        self._vocablens_specials = frozenset(special_ids(tokenizer))
        try:  # one call (a fast tokenizer maps each id as the one-id call does)
            pieces = list(tokenizer.convert_ids_to_tokens(list(range(n))))
        except Exception:
            pieces = []
        if len(pieces) != n:
            pieces = [token_piece(tokenizer, i) for i in range(n)]
        self._pieces = _Strings(pieces)
        del pieces
        self._decoded = None
        if self._vocablens_kind == "plain":  # token_bytes decodes these id by id: keep each decoding
            self._decoded = _Strings([self._decode_one(tokenizer, i) for i in range(n)])
        self._len = int(len(tokenizer))

    @staticmethod
    def _decode_one(tokenizer, i: int) -> str | None:
        try:
            return tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:
            return None

    def __len__(self) -> int:
        """``len(tokenizer)`` of the tokenizer it was built from."""
        return self._len

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        """The piece of one id, as the tokenizer gave it; None for an id it has not."""
        return self._pieces.get(int(token_id))

    def decode(self, ids, **_) -> str:
        """One id's decoding (kept for tokenizers that are neither byte-level nor SentencePiece)."""
        got = None if self._decoded is None or len(ids) != 1 else self._decoded.get(int(ids[0]))
        if got is None:
            raise ValueError("no decoding kept for this id")
        return got


__all__ = ["TokenTable"]
