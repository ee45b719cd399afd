"""The tokenizer analysis as first written (one token_bytes call and one BatchEncoding per token list):
kept as the reference that the faster :func:`vocablens.undertrained.classes.classify_tokens` must equal."""
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


def _reserved_name(piece) -> bool:
    from vocablens.argmax.model import RESERVED_NAME  # one pattern for "reserved" in the project

    return isinstance(piece, str) and bool(RESERVED_NAME.match(piece))


def _encode_all(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of every text, without special tokens (one batched call on a fast tokenizer)."""
    if not texts:
        return []
    try:
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    except Exception:  # a slow tokenizer that refuses some text: one at a time
        got = []
        for t in texts:
            try:
                got.append(list(tokenizer.encode(t, add_special_tokens=False)))
            except Exception:
                got.append([])
        return got


def classify_tokens_v1(tokenizer, vocab_size: int | None = None) -> TokenClasses:
    """Classify every row of a vocabulary (see the module docstring for the classes and their order).

    Args:
        tokenizer: a transformers tokenizer (fast or slow; byte-level BPE, SentencePiece with byte
            fallback, WordLevel ...).
        vocab_size: V, rows of the model's matrices (default ``len(tokenizer)``); rows at or beyond
            the tokenizer's size are ``padding``.

    Returns:
        :class:`TokenClasses`. Cost: one decode per token and two batched encodes of V short texts
        (about a second for 49,152 tokens).
    """
    from vocablens.models.tokens import vocab_kind

    n_tok = len(tokenizer)
    V = n_tok if vocab_size is None else int(vocab_size)
    n = min(V, n_tok)
    cls = torch.full((V,), PADDING, dtype=torch.int8)
    trips = torch.zeros(V, dtype=torch.bool)
    kind = vocab_kind(tokenizer)
    specials = special_ids(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    texts: dict[int, str] = {}
    for i in range(n):
        if i in specials or _reserved_name(pieces[i]):
            cls[i] = SPECIAL
            continue
        b = token_bytes(tokenizer, i)
        if b is None:
            cls[i] = UNREACHABLE
            continue
        try:
            texts[i] = b.decode("utf-8")
        except UnicodeDecodeError:
            texts[i] = None  # type: ignore[assignment]
        if len(b) == 1:
            cls[i] = SINGLE_BYTE
        elif texts[i] is None:
            cls[i] = PARTIAL_UTF8
        else:
            cls[i] = NORMAL
    ids = [i for i, t in texts.items() if t]
    plain = _encode_all(tokenizer, [texts[i] for i in ids])
    anchor = _encode_all(tokenizer, [_ANCHOR])[0]
    anchored = _encode_all(tokenizer, [_ANCHOR + texts[i] for i in ids])
    # SentencePiece: "▁the" stands for " the", yet a text's first word gets its "▁" from the
    # pre-tokenizer, so the text without its leading space is tried too
    spaced = [i for i in ids if kind == "sentencepiece" and texts[i].startswith(" ") and len(texts[i]) > 1]
    unspaced = dict(zip(spaced, _encode_all(tokenizer, [texts[i][1:] for i in spaced])))
    k = len(anchor)
    for i, p, a in zip(ids, plain, anchored):
        ok = (list(p) == [i] or (list(a[:k]) == anchor and list(a[k:]) == [i])
              or list(unspaced.get(i, ())) == [i])
        trips[i] = ok
        if not ok and int(cls[i]) == NORMAL:
            cls[i] = UNREACHABLE
    for i, t in texts.items():  # an empty text (a token that decodes to nothing) cannot come back
        if t == "" and int(cls[i]) == NORMAL:
            cls[i] = UNREACHABLE
    return TokenClasses(cls=cls, round_trips=trips, kind=kind, n_tokens=n_tok)


