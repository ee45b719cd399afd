"""Tokenizer helpers: readable token strings, single-token lookup, prompt encoding with checks."""

from __future__ import annotations

import functools

import torch

from vocablens.errors import BadInput, PromptTooLong, TokenNotInVocabulary
from vocablens.models.shown_bytes import (  # noqa: F401  (re-exported: the display rule's home is there)
    BYTE_PIECE, escape_char, escape_text, invisible, show_bytes, shown_to_bytes)


@functools.lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table (byte-level BPE stores byte b as a printable char)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def vocab_kind(tokenizer) -> str:
    """``"bytelevel"`` (GPT-2/Llama-3/Qwen style), ``"sentencepiece"`` (▁ and <0xNN> byte fallback) or
    ``"plain"`` (decode token by token), from the fast tokenizer's decoder; cached on the tokenizer."""
    kind = getattr(tokenizer, "_vocablens_kind", None)
    if kind is not None:
        return kind
    kind = "plain"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    dec = repr(getattr(backend, "decoder", None)) if backend is not None else ""
    if "ByteLevel" in dec:
        kind = "bytelevel"
    elif "Metaspace" in dec or "ByteFallback" in dec or "<0x00>" in (tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}):
        kind = "sentencepiece"
    try:
        tokenizer._vocablens_kind = kind
    except Exception:  # pragma: no cover - a tokenizer that refuses attributes
        pass
    return kind


def special_ids(tokenizer) -> set[int]:
    got = getattr(tokenizer, "_vocablens_specials", None)
    if got is None:
        got = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        got |= set(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
        try:
            tokenizer._vocablens_specials = got
        except Exception:  # pragma: no cover
            pass
    return got


def token_piece(tokenizer, token_id: int) -> str | None:
    """The tokenizer's own string for ``token_id`` (``convert_ids_to_tokens``), or None (no such id)."""
    try:
        return tokenizer.convert_ids_to_tokens(token_id)
    except (IndexError, KeyError, ValueError, OverflowError, TypeError):
        return None


def token_bytes(tokenizer, token_id: int) -> bytes | None:
    """The bytes token ``token_id`` stands for (what it adds to decoded text), or None when the
    tokenizer has no such id. Special and added tokens are their own text, UTF-8 encoded."""
    token_id = int(token_id)
    raw = token_piece(tokenizer, token_id)
    if raw is None:
        return None
    if token_id in special_ids(tokenizer):
        return raw.encode("utf-8")
    kind = vocab_kind(tokenizer)
    if kind == "bytelevel":
        dec = byte_decoder()
        if all(c in dec for c in raw):
            return bytes(dec[c] for c in raw)
        return raw.encode("utf-8")
    if kind == "sentencepiece":
        m = BYTE_PIECE.fullmatch(raw)
        if m:
            return bytes([int(m.group(1), 16)])
        return raw.replace("▁", " ").encode("utf-8")
    try:
        return tokenizer.decode([token_id], skip_special_tokens=False,
                                clean_up_tokenization_spaces=False).encode("utf-8", "surrogatepass")
    except Exception:
        return raw.encode("utf-8")


def token_str(tokenizer, token_id: int) -> str:
    """A readable form of one token, THE display rule of every table, figure and JSON: its bytes
    (:func:`token_bytes`: byte-level ``Ġ``/``Ċ`` and SentencePiece ``▁`` become space/newline) shown
    by :func:`show_bytes` — complete characters as text, control characters and the backslash
    escaped once (``\\n``, ``\\\\``), bytes of an incomplete UTF-8 sequence as ``<0xE2>``. A
    SentencePiece byte-fallback row is always ``<0xNN>`` (its piece), so the byte row ``<0x65>`` and
    the piece ``e`` stay two tokens on the page. Unknown ids are ``<id N>``. :func:`shown_to_bytes`
    inverts it."""
    b = token_bytes(tokenizer, token_id)
    if b is None:
        return f"<id {int(token_id)}>"
    if len(b) == 1 and vocab_kind(tokenizer) == "sentencepiece" and int(token_id) not in special_ids(tokenizer):
        raw = token_piece(tokenizer, int(token_id))
        if raw is not None and BYTE_PIECE.fullmatch(raw):
            return f"<0x{b[0]:02X}>"
    return show_bytes(b)


def quoted(text: str) -> str:
    """A readable token (from :func:`token_str`) in single quotes, without escaping it twice
    (``repr`` would turn the ``\\n`` that token_str wrote into ``\\\\n``)."""
    return f"'{text}'"


def token_strs(tokenizer, ids) -> list[str]:
    """:func:`token_str` for every id of a list or 1-D tensor."""
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    return [token_str(tokenizer, i) for i in ids]


def check_ids_fit(ids, rows: int, tokenizer=None) -> None:
    """THE check that token ids have rows in the matrices, called by every path that turns text into
    ids (:func:`encode_text`, :func:`encode_prompt`, :func:`single_token_id`) and by every forward
    (:func:`vocablens.models.blocks_forward.check_forward_input`), so a tokenizer longer than the embedding
    and head (tokens added after training, a mismatched checkpoint) is one message for every command.

    Args:
        ids: token ids, a list or an int tensor of any shape.
        rows: the matrices' rows V (the embedding's, ``Borders.W_E.shape[0]``).
        tokenizer: optional, to name the token and the tokenizer's length in the message.

    Raises:
        TokenNotInVocabulary (a BadInput): the first id (in order) outside [0, rows), e.g.
            "token id 49,155 ('<|x|>') has no row in the matrices (49,152 rows; the tokenizer has
            49,156 tokens)".
    """
    if isinstance(ids, torch.Tensor):
        if ids.numel() == 0:
            return
        flat = ids.detach().reshape(-1)
        bad = (flat < 0) | (flat >= rows)
        if not bool(bad.any()):
            return
        first = int(flat[int(bad.nonzero()[0, 0])])
    else:
        first = next((int(i) for i in ids if not 0 <= int(i) < rows), None)
        if first is None:
            return
    name = ""
    extra = ""
    if tokenizer is not None:
        piece = token_piece(tokenizer, first) if first >= 0 else None
        name = f" ({quoted(token_str(tokenizer, first))})" if piece is not None else ""
        try:
            extra = f"; the tokenizer has {len(tokenizer):,} tokens"
        except TypeError:  # pragma: no cover - a tokenizer without a length
            extra = ""
    raise TokenNotInVocabulary(f"token id {first:,}{name} has no row in the matrices ({int(rows):,} rows{extra})")


def check_text(text, what: str = "text") -> str:
    """``text`` if a tokenizer can take it, else :class:`BadInput`: not a string, or a lone surrogate
    (what Python makes of bytes that are not UTF-8 in a command-line argument or a file name)."""
    if not isinstance(text, str):
        raise BadInput(f"{what} must be a string; got {type(text).__name__}")
    for i, ch in enumerate(text):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise BadInput(f"{what} holds U+{ord(ch):04X} at character {i + 1}: bytes that are not UTF-8 "
                           "(pass the text as UTF-8, or in a UTF-8 file)")
    return text


def special_strings(tokenizer) -> list[str]:
    """The special tokens' strings (BOS, EOS, chat markers, added special tokens), longest first."""
    got = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            got.add(str(tok.content))
    return sorted((t for t in got if t), key=len, reverse=True)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS in front of a text by itself (then the first text token is
    scored; without it the first token has no prefix and is not)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    try:
        ids = tokenizer("a").input_ids
    except Exception:  # pragma: no cover
        return False
    return bool(ids) and ids[0] == bos


def encode_text(tokenizer, text: str, special_text: str = "parse", add_special_tokens: bool = True,
                rows: int | None = None) -> list[int]:
    """Text -> token ids, by THE rule every command uses for user text.

    * Text a tokenizer cannot take (a lone surrogate, not a string) is :class:`BadInput`.
    * ``special_text="parse"`` (default): special-token strings in the text (``<|im_end|>``, ``<s>``)
      become those tokens, and a :class:`~vocablens.errors.VocabLensNote` warning names them (the
      CLI prints it on stderr as a note); ``"plain"``: they are tokenized as ordinary text.
    * Never a doubled BOS: when the tokenizer adds BOS and the text starts with it, one is dropped.
    * ``rows`` (the matrices' rows V): every id must have a row (:func:`check_ids_fit`).

    Raises:
        BadInput: as above, or ``special_text`` not parse|plain.
        TokenNotInVocabulary: an id at or beyond ``rows`` (a tokenizer longer than the matrices).
    """
    import warnings

    from vocablens.errors import VocabLensNote

    check_text(text)
    if special_text not in ("parse", "plain"):
        raise BadInput(f"special_text must be parse or plain; got {special_text!r}")
    if special_text == "plain":
        ids = list(tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=True).input_ids)
    else:
        ids = list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
        found = [t for t in special_strings(tokenizer) if t in text]
        if found:
            warnings.warn(VocabLensNote(
                f"the text contains special tokens {found}, read as those tokens (`special_text` plain "
                "reads them as ordinary text)"), stacklevel=2)
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_special_tokens and bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos and adds_bos(tokenizer):
        ids = ids[1:]
    if rows is not None:
        check_ids_fit(ids, rows, tokenizer)
    return ids


def check_context(n_tokens: int, max_len: int | None) -> None:
    """THE check that a prompt fits the model's context, for text (:func:`encode_prompt`) and ids
    (:func:`vocablens.models.token_input.prompt_ids`) alike.

    Raises:
        PromptTooLong: more than ``max_len`` tokens (None: no limit known).
    """
    if max_len is not None and n_tokens > max_len:
        raise PromptTooLong(f"prompt has {n_tokens} tokens, more than the model's context of {max_len}")


def encode_prompt(tokenizer, prompt: str, max_len: int | None = None, chat: bool = False,
                  prefix: str = "", special_text: str = "parse", rows: int | None = None) -> torch.Tensor:
    """Prompt text -> input ids [1, T] int64, by the rule of :func:`encode_text`.

    Args:
        chat: wrap the prompt in the tokenizer's chat template as a user turn, open the assistant
            turn, and continue it with ``prefix``.
        max_len: the model's context length; longer prompts raise.
        special_text: ``parse`` or ``plain`` (see :func:`encode_text`).
        rows: the matrices' rows V; every id must have one (:func:`check_ids_fit`).

    Raises:
        BadInput: empty prompt, text a tokenizer cannot take, or ``chat`` without a chat template.
        PromptTooLong: more tokens than ``max_len``.
        TokenNotInVocabulary: an id at or beyond ``rows`` (a tokenizer longer than the matrices).
    """
    if prompt is None or not str(prompt).strip():
        raise BadInput("empty prompt: give some text")
    check_text(prompt, "the prompt")
    check_text(prefix or "", "`prefix`")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise BadInput("`chat`: this tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True) + (prefix or "")
        ids = torch.tensor([tokenizer(text, add_special_tokens=False).input_ids], dtype=torch.int64)
    else:
        ids = torch.tensor([encode_text(tokenizer, prompt + (prefix or ""), special_text)], dtype=torch.int64)
    if ids.numel() == 0:
        raise BadInput("the prompt encodes to no tokens")
    check_context(int(ids.shape[1]), max_len)
    if rows is not None:
        check_ids_fit(ids, rows, tokenizer)
    return ids


_VOCABS: "weakref.WeakKeyDictionary" = None  # tokenizer -> (len(tokenizer), its get_vocab())


def vocab_table(tokenizer) -> dict:
    """``tokenizer.get_vocab()`` (piece -> id), built once per tokenizer and kept while its length is
    unchanged (an added token rebuilds it); ``{}`` for an object without ``get_vocab``. A fast
    tokenizer builds a new 49,152-entry dict on every ``get_vocab()`` call (half of each
    ``neighbors`` lookup before this table)."""
    global _VOCABS
    import weakref

    if not hasattr(tokenizer, "get_vocab"):
        return {}
    if _VOCABS is None:
        _VOCABS = weakref.WeakKeyDictionary()
    n = len(tokenizer)
    try:
        got = _VOCABS.get(tokenizer)
    except TypeError:  # not weak-referenceable: no table
        return tokenizer.get_vocab()
    if got is None or got[0] != n:
        got = (n, tokenizer.get_vocab())
        _VOCABS[tokenizer] = got
    return got[1]


def single_token_id(tokenizer, text: str, vocab_size: int | None = None, use_mean: bool = False
                    ) -> tuple[list[int], str | None]:
    """Ids that spell ``text`` and a note when it is several tokens.

    Returns:
        ``(ids, note)``: ``ids`` is ``[id]`` for a single token, else all its tokens (callers use the
        first, or the mean with ``use_mean``); ``note`` says what happened, or None.

    Raises:
        TokenNotInVocabulary: the text encodes to no token, or (with ``vocab_size``) to an id with no
            row in the matrices (:func:`check_ids_fit`).
    """
    if text is None or text == "":
        raise TokenNotInVocabulary("empty token string")
    check_text(text, "the token")
    vocab = vocab_table(tokenizer)
    if text in vocab:
        ids = [int(vocab[text])]
    else:
        ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise TokenNotInVocabulary(f"{text!r} encodes to no token")
    if vocab_size is not None:
        check_ids_fit(ids, vocab_size, tokenizer)
    if len(ids) == 1:
        return ids, None
    pieces = ", ".join(f"{quoted(token_str(tokenizer, i))} ({int(i)})" for i in ids)  # escaped once, as in tables
    how = "the mean of its tokens" if use_mean else "its first token"
    return ids, f"{quoted(escape_text(text))} is {len(ids)} tokens [{pieces}]; using {how}"


def context_length(config) -> int | None:
    """The model's context window from its config, or None if unknown."""
    for n in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        v = getattr(config, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
