"""Small formatting helpers shared by the vocabulary-space renderers."""

from __future__ import annotations

from vocablens.models.tokens import quoted, token_str


def toks(tokenizer, ids) -> list[str]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [token_str(tokenizer, i) if tokenizer is not None else str(int(i)) for i in ids]


def rnd(x: float, n: int = 4) -> float:
    return round(float(x), n)


def join(toks: list[str], n: int = 8) -> str:
    return " ".join(quoted(t) for t in toks[:n])
