"""Tokenizer helpers: readable token strings, single-token lookup, prompt encoding with checks."""

from __future__ import annotations

import torch

from vocablens.errors import BadInput, PromptTooLong, TokenNotInVocabulary

_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(s: str) -> str:
    out = []
    for ch in s:
        if ch in _CONTROL:
            out.append(_CONTROL[ch])
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def token_str(tokenizer, token_id: int) -> str:
    """A readable form of one token: byte-level ``Ġ``/``Ċ`` and SentencePiece ``▁`` decoded to
    space/newline, control characters escaped (``\\n``), partial UTF-8 bytes shown as ``<0xE4>``."""
    token_id = int(token_id)
    try:
        text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception:
        text = None
    if text is None or "\ufffd" in text or text == "":
        raw = tokenizer.convert_ids_to_tokens(token_id)
        if raw is None:
            return f"<id {token_id}>"
        if text and "\ufffd" in text and len(raw) <= 2:
            # a lone byte of a multi-byte character (byte-level BPE)
            try:
                try:
                    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
                except ImportError:  # transformers 5.x moved it
                    from transformers.convert_slow_tokenizer import bytes_to_unicode

                inv = {v: k for k, v in bytes_to_unicode().items()}
                return "".join(f"<0x{inv[c]:02X}>" if c in inv else c for c in raw)
            except Exception:
                pass
        text = raw.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ")
    return _escape(text)


def quoted(text: str) -> str:
    """A readable token (from :func:`token_str`) in single quotes, without escaping it twice
    (``repr`` would turn the ``\\n`` that token_str wrote into ``\\\\n``)."""
    return f"'{text}'"


def token_strs(tokenizer, ids) -> list[str]:
    """:func:`token_str` for every id of a list or 1-D tensor."""
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    return [token_str(tokenizer, i) for i in ids]


def encode_prompt(tokenizer, prompt: str, max_len: int | None = None, chat: bool = False,
                  prefix: str = "") -> torch.Tensor:
    """Prompt text -> input ids [1, T] int64.

    Args:
        chat: wrap the prompt in the tokenizer's chat template as a user turn, open the assistant
            turn, and continue it with ``prefix``.
        max_len: the model's context length; longer prompts raise.

    Raises:
        BadInput: empty prompt, or ``chat`` without a chat template.
        PromptTooLong: more tokens than ``max_len``.
    """
    if prompt is None or not str(prompt).strip():
        raise BadInput("empty prompt: give some text")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise BadInput("--chat: this tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True) + (prefix or "")
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        ids = tokenizer((prompt + (prefix or "")), return_tensors="pt").input_ids
    if ids.numel() == 0:
        raise BadInput("the prompt encodes to no tokens")
    if max_len is not None and ids.shape[1] > max_len:
        raise PromptTooLong(f"prompt has {ids.shape[1]} tokens, more than the model's context of {max_len}")
    return ids


def single_token_id(tokenizer, text: str, vocab_size: int | None = None, use_mean: bool = False
                    ) -> tuple[list[int], str | None]:
    """Ids that spell ``text`` and a note when it is several tokens.

    Returns:
        ``(ids, note)``: ``ids`` is ``[id]`` for a single token, else all its tokens (callers use the
        first, or the mean with ``use_mean``); ``note`` says what happened, or None.

    Raises:
        TokenNotInVocabulary: the text encodes to no token.
    """
    if text is None or text == "":
        raise TokenNotInVocabulary("empty token string")
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if text in vocab:
        return [int(vocab[text])], None
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise TokenNotInVocabulary(f"{text!r} encodes to no token")
    if vocab_size is not None and any(i >= vocab_size for i in ids):
        raise TokenNotInVocabulary(f"{text!r} maps to ids beyond the matrix rows ({vocab_size})")
    if len(ids) == 1:
        return ids, None
    pieces = [token_str(tokenizer, i) for i in ids]
    how = "the mean of its tokens" if use_mean else "its first token"
    return ids, f"{text!r} is {len(ids)} tokens {pieces}; using {how}"


def context_length(config) -> int | None:
    """The model's context window from its config, or None if unknown."""
    for n in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        v = getattr(config, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
