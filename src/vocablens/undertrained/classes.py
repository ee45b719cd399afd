"""Tokenizer analysis: what kind of token each vocabulary entry is (Land & Bartolo 2024, §3.1).

Every token id below the tokenizer's size gets exactly one class, tested in this order:

* ``special`` — declared by the tokenizer (BOS/EOS, chat markers, added special tokens) or named like
  a reserved slot (``<|reserved_special_token_7|>``, ``<unused12>``, ``[unused3]``);
* ``single_byte`` — the token stands for exactly one byte (GPT-2's 256 base characters, SentencePiece's
  ``<0xNN>`` byte fallback, a one-character ASCII word);
* ``partial_utf8`` — its bytes are not valid UTF-8 (a fragment of a multi-byte character);
* ``unreachable`` — decoding it and encoding the text again does not give the token back (tried on
  the text alone and after a newline, so a SentencePiece piece without ``▁`` is not counted);
* ``normal`` — everything else.

Rows at or beyond the tokenizer's size (padding) are not tokens: ``padding`` marks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.models.tokens import special_ids, token_bytes

#: class names, indexed by :attr:`TokenClasses.cls`
CLASSES = ("normal", "special", "single_byte", "partial_utf8", "unreachable", "padding")
NORMAL, SPECIAL, SINGLE_BYTE, PARTIAL_UTF8, UNREACHABLE, PADDING = range(6)
#: the text put in front of a token in the second round-trip try
_ANCHOR = "\n"


@dataclass(frozen=True, eq=False)
class TokenClasses:
    """The tokenizer analysis of one vocabulary.

    Attributes:
        cls: int8 [V], index into :data:`CLASSES` per row.
        round_trips: bool [V], True where encode(decode(token)) gives the token back (specials and
            padding: False; single bytes: whatever the test gives).
        kind: the tokenizer's decoding kind (``bytelevel``, ``sentencepiece`` or ``plain``).
        n_tokens: tokens the tokenizer has (rows below it are classified, the rest are padding).
    """

    cls: torch.Tensor
    round_trips: torch.Tensor
    kind: str
    n_tokens: int

    def counts(self) -> dict[str, int]:
        """Rows per class, every class present (zeros included)."""
        c = torch.bincount(self.cls.long(), minlength=len(CLASSES))
        return {name: int(c[i]) for i, name in enumerate(CLASSES)}

    def ids(self, name: str) -> torch.Tensor:
        """Row ids [k] int64 of class ``name``."""
        return (self.cls == CLASSES.index(name)).nonzero().flatten()

    def name(self, token_id: int) -> str:
        return CLASSES[int(self.cls[int(token_id)])]


def _encode_all(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of every text, without special tokens: one ``encode_batch`` of the fast tokenizer's
    backend (what ``tokenizer(texts)`` runs, without building a BatchEncoding of 49k rows), else the
    tokenizer's own call, else one text at a time (a slow tokenizer that refuses some text)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None and hasattr(backend, "encode_batch"):
        try:
            enc = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets (tokenizers >= 0.20)
            return [e.ids for e in enc(texts, add_special_tokens=False)]
        except Exception:
            pass
    try:
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    except Exception:
        got = []
        for t in texts:
            try:
                got.append(list(tokenizer.encode(t, add_special_tokens=False)))
            except Exception:
                got.append([])
        return got


def _all_bytes(tokenizer, pieces: list, specials: set[int], kind: str) -> list[bytes | None]:
    """:func:`~vocablens.models.tokens.token_bytes` of ids 0..n-1 from their pieces (one
    ``convert_ids_to_tokens`` of all): the same bytes, without a tokenizer call per token (a batched
    decode for the ``plain`` kind)."""
    from vocablens.models.tokens import BYTE_PIECE, byte_decoder

    out: list[bytes | None] = [None] * len(pieces)
    plain: list[int] = []
    dec = byte_decoder() if kind == "bytelevel" else None
    for i, raw in enumerate(pieces):
        if raw is None:
            continue
        if i in specials:
            out[i] = raw.encode("utf-8")
        elif kind == "bytelevel":
            out[i] = bytes(dec[c] for c in raw) if all(c in dec for c in raw) else raw.encode("utf-8")
        elif kind == "sentencepiece":
            m = BYTE_PIECE.fullmatch(raw)
            out[i] = bytes([int(m.group(1), 16)]) if m else raw.replace("▁", " ").encode("utf-8")
        else:
            plain.append(i)
    if plain:
        try:
            texts = tokenizer.batch_decode([[i] for i in plain], skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
            for i, t in zip(plain, texts):
                out[i] = t.encode("utf-8", "surrogatepass")
        except Exception:  # one at a time, as token_bytes does
            for i in plain:
                out[i] = token_bytes(tokenizer, i)
    return out


def classify_tokens(tokenizer, vocab_size: int | None = None) -> TokenClasses:
    """Classify every row of a vocabulary (see the module docstring for the classes and their order).

    Args:
        tokenizer: a transformers tokenizer (fast or slow; byte-level BPE, SentencePiece with byte
            fallback, WordLevel ...).
        vocab_size: V, rows of the model's matrices (default ``len(tokenizer)``); rows at or beyond
            the tokenizer's size are ``padding``.

    Returns:
        :class:`TokenClasses`. Cost: one ``convert_ids_to_tokens`` of all ids and one batched encode
        of V short texts (then of the few that did not come back).
    """
    from vocablens.models.tokens import vocab_kind

    n_tok = len(tokenizer)
    V = n_tok if vocab_size is None else int(vocab_size)
    kind = vocab_kind(tokenizer)
    cls, texts = _classes_by_bytes(tokenizer, min(V, n_tok), V, kind)
    ids = [i for i, t in texts.items() if t]
    back = _round_trips(tokenizer, texts, ids, kind)
    trips = [False] * V
    for i in ids:
        ok = i in back
        trips[i] = ok
        if not ok and cls[i] == NORMAL:
            cls[i] = UNREACHABLE
    for i, t in texts.items():  # an empty text (a token that decodes to nothing) cannot come back
        if t == "" and cls[i] == NORMAL:
            cls[i] = UNREACHABLE
    return TokenClasses(cls=torch.tensor(cls, dtype=torch.int8), round_trips=torch.tensor(trips, dtype=torch.bool),
                        kind=kind, n_tokens=n_tok)


def _classes_by_bytes(tokenizer, n: int, V: int, kind: str) -> tuple[list[int], dict[int, str | None]]:
    """Each row's class from its bytes alone (special, unreachable, single byte, partial UTF-8 or normal;
    rows n..V-1 padding), and the text of each token that has bytes (None: not valid UTF-8)."""
    from vocablens.argmax.model import RESERVED_NAME  # one pattern for "reserved" in the project

    cls = [PADDING] * V  # plain lists while classifying (a tensor write per token is one torch call each, V of them)
    specials = special_ids(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    all_bytes = _all_bytes(tokenizer, pieces, specials, kind)
    texts: dict[int, str | None] = {}
    for i in range(n):
        if i in specials or (isinstance(pieces[i], str) and RESERVED_NAME.match(pieces[i])):
            cls[i] = SPECIAL
            continue
        b = all_bytes[i]
        if b is None:
            cls[i] = UNREACHABLE
            continue
        try:
            texts[i] = b.decode("utf-8")
        except UnicodeDecodeError:
            texts[i] = None
        if len(b) == 1:
            cls[i] = SINGLE_BYTE
        elif texts[i] is None:
            cls[i] = PARTIAL_UTF8
        else:
            cls[i] = NORMAL
    return cls, texts


def _round_trips(tokenizer, texts: dict[int, str | None], ids: list[int], kind: str) -> set[int]:
    """The ids of ``ids`` whose text encodes back to that one token: alone, after an anchor text, or
    (SentencePiece) without its leading space."""
    # each try runs only on the tokens the tries before it did not bring back (the same verdicts)
    plain = _encode_all(tokenizer, [texts[i] for i in ids])
    back = {i for i, p in zip(ids, plain) if list(p) == [i]}
    rest = [i for i in ids if i not in back]
    anchor = _encode_all(tokenizer, [_ANCHOR])[0]
    k = len(anchor)
    for i, a in zip(rest, _encode_all(tokenizer, [_ANCHOR + texts[i] for i in rest])):
        if list(a[:k]) == anchor and list(a[k:]) == [i]:
            back.add(i)
    # SentencePiece: "▁the" stands for " the", yet a text's first word gets its "▁" from the
    # pre-tokenizer, so the text without its leading space is tried too
    spaced = [i for i in ids if i not in back and kind == "sentencepiece" and texts[i].startswith(" ")
              and len(texts[i]) > 1]
    for i, u in zip(spaced, _encode_all(tokenizer, [texts[i][1:] for i in spaced])):
        if list(u) == [i]:
            back.add(i)
    return back


__all__ = ["CLASSES", "TokenClasses", "classify_tokens"]
