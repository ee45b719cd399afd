"""What every loader returns: :class:`LoadedModel` (the model, its tokenizer, its borders, its provenance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vocablens.models.files.provenance import Provenance


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

    # ------------------------------------------------------------------ text -> ids (the one place)
    def encode(self, text: str, *, chat: bool = False, prefix: str = "", special_text: str = "parse"):
        """One prompt -> input ids [1, T] int64: THE rule every surface encodes user text by
        (:func:`~vocablens.models.tokens.encode_prompt`: BOS as the tokenizer adds it and never doubled,
        special-token strings parsed or ``plain``, the chat template as a user turn with ``chat``,
        ``prefix`` continuing the prompt or the assistant turn), refused past the model's context.

        Raises:
            BadInput: empty text, text a tokenizer cannot take, ``chat`` without a chat template.
            PromptTooLong: more tokens than the model's context.
            TokenNotInVocabulary: a token id with no row in the matrices (a tokenizer longer than
                them: :func:`~vocablens.models.tokens.check_ids_fit`).
        """
        from vocablens.models.tokens import context_length, encode_prompt

        return encode_prompt(self.tokenizer, text, context_length(self.model.config), chat=chat, prefix=prefix,
                             special_text=special_text, rows=getattr(self.borders, "vocab_size", None))

    def prompt_ids(self, ids, batch: bool = False, what: str = "ids"):
        """Token ids a caller gave -> ``[ids [T] int64, ...]`` (one prompt, or B with ``batch``), checked
        as text is: an integer tensor [T] / [1, T] / [B, T], a list of ints or a list of id lists
        (:func:`~vocablens.models.token_input.prompt_ids`); never cast.

        Raises:
            BadInput: a float, bool or complex tensor (named by its dtype), an empty prompt, several
                prompts without ``batch``. TokenNotInVocabulary: an id outside [0, V).
            PromptTooLong: a prompt over the model's context (the check text passes).
        """
        from vocablens.models.token_input import prompt_ids
        from vocablens.models.tokens import context_length

        return prompt_ids(ids, rows=getattr(self.borders, "vocab_size", None),
                          context=context_length(self.model.config), batch=batch, what=what)

    def encode_batch(self, texts, *, chat: bool = False, prefix: str = "", special_text: str = "parse"):
        """Several prompts -> ``(input_ids [B, T] int64, attention_mask [B, T] int64)``, right-padded
        (padding id: the tokenizer's pad, else EOS, else 0; mask 1 = token, 0 = padding), each prompt
        encoded as :meth:`encode` encodes it.

        Raises:
            BadInput: no prompts, or as :meth:`encode` (the message names the prompt).
        """
        import torch

        from vocablens.errors import BadInput

        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise BadInput("no prompts: give at least one text")
        seqs = []
        for i, t in enumerate(texts):
            try:
                seqs.append(self.encode(t, chat=chat, prefix=prefix, special_text=special_text)[0])
            except BadInput as exc:
                raise type(exc)(str(exc) if len(texts) == 1 else f"prompt {i + 1}: {exc}") from None
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else (getattr(self.tokenizer, "eos_token_id", None) or 0)
        T = max(int(x.numel()) for x in seqs)
        ids = torch.full((len(seqs), T), int(pad), dtype=torch.int64)
        mask = torch.zeros((len(seqs), T), dtype=torch.int64)
        for i, x in enumerate(seqs):
            ids[i, : x.numel()] = x
            mask[i, : x.numel()] = 1
        return ids, mask

    def encode_raw(self, text: str, max_tokens: int | None = None):
        """Text as the tokenizer encodes it by default (its special tokens added, special-token strings
        parsed), cut to the first ``max_tokens`` tokens: ids [T] int64. For held-out and probe texts
        that are read in part, not refused when long.

        Raises:
            BadInput: text a tokenizer cannot take.
            TokenNotInVocabulary: a token id with no row in the matrices.
        """
        import torch

        from vocablens.models.tokens import check_text

        from vocablens.models.tokens import check_ids_fit

        check_text(text)
        ids = torch.tensor(self.tokenizer(text).input_ids, dtype=torch.int64)
        ids = ids if max_tokens is None else ids[:max_tokens]
        check_ids_fit(ids, self.borders.vocab_size, self.tokenizer)
        return ids

    def pack(self, docs, seq_len: int, max_tokens: int | None = None, shrink: bool = False):
        """Corpus documents -> rows [N, seq_len] int64, packed with EOS between documents
        (:func:`vocablens.corpus.pack_tokens`): the text -> ids of every corpus a workflow reads.

        Raises:
            BadInput: fewer tokens than one row (unless ``shrink``: then one shorter row of them all).
        """
        from vocablens.corpus import pack_tokens

        return pack_tokens(docs, self.tokenizer, seq_len, max_tokens=max_tokens, shrink=shrink)

    def pieces(self, text: str) -> list[int]:
        """The token ids of ``text`` without BOS or other special tokens added ([] when it has none)."""
        from vocablens.models.tokens import check_text

        check_text(text)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def tokens(self, ids) -> list[str]:
        """Token ids (ints, a list or a tensor) -> their display strings
        (:func:`~vocablens.models.tokens.token_str`)."""
        from vocablens.models.tokens import token_str

        flat = ids.reshape(-1).tolist() if hasattr(ids, "reshape") else list(ids)
        return [token_str(self.tokenizer, int(i)) for i in flat]

    def n_bytes(self, ids) -> int:
        """UTF-8 bytes of the tokens ``ids`` (special tokens with their text): what bits per byte divide by."""
        from vocablens.models.tokens import token_bytes

        flat = ids.reshape(-1).tolist() if hasattr(ids, "reshape") else list(ids)
        return sum(len(token_bytes(self.tokenizer, int(i)) or b"") for i in flat)

    def without_tokenizer(self) -> "LoadedModel":
        """This model with its tokenizer swapped for a :class:`~vocablens.models.token_table.TokenTable`
        of its token strings (a packed buffer, a small fraction of what the tokenizer holds).

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


def with_note(lm: LoadedModel, note: str | None) -> LoadedModel:
    """``lm``, with ``note`` added to its provenance's notes (once; None adds nothing)."""
    if note and note not in lm.provenance.notes:
        lm.provenance = Provenance(**{**lm.provenance.__dict__, "notes": tuple(lm.provenance.notes) + (note,)})
    return lm
