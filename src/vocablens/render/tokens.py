"""Tokens as a reader sees them in figures and tables: whitespace made visible.

A token that is a space looks like an empty cell, and a leading space (the mark of a word-initial
token in byte-level BPE) vanishes in HTML; so every figure and table shows ``' '`` as ``␣``, a
newline as ``⏎``, a tab as ``⇥`` and a carriage return as ``⇤`` (other control characters as
``\\xNN``). Every symbol is one the fonts of a plain Linux browser draw (DejaVu, Chromium's
fallback): ``␍`` (U+240D) is in none of them and showed as an empty box. JSON keeps the plain
text of :func:`vocablens.models.tokens.token_str`.
"""

from __future__ import annotations

import re

from vocablens.models.tokens import escape_text, token_str

#: what each whitespace character of a token is shown as (escaped forms from ``token_str`` too)
VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "⇤", "\u00a0": "⍽"}
_ESCAPED = {"\\n": "⏎", "\\t": "⇥", "\\r": "⇤", "\\u00a0": "⍽"}
#: one escape of :func:`~vocablens.models.tokens.token_str`, read left to right (``\\\\n`` is a
#: backslash and an n, not a newline)
_ESCAPE = re.compile(r"\\(?:[\\ntr]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")
#: one line for the page, shown wherever the symbols appear
LEGEND = ("Whitespace in tokens is shown as ␣ (space), ⏎ (newline), ⇥ (tab), ⇤ (carriage return) and ⍽ "
          "(no-break space); other "
          "invisible characters as escapes such as \\u200b (zero-width space).")


def visible(text: str) -> str:
    """``' Paris'`` -> ``'␣Paris'``, ``'\\n'`` -> ``'⏎'``, ``' \\u200b'`` -> ``'␣\\u200b'``: the text of
    one token (from :func:`~vocablens.models.tokens.token_str`, or raw text) with its whitespace
    and every invisible character (format and control characters, separators, a combining mark
    standing alone) shown."""
    parts, at = [], 0
    for m in _ESCAPE.finditer(text):
        parts += [_raw(text[at:m.start()]), _ESCAPED.get(m.group(0), m.group(0))]
        at = m.end()
    parts.append(_raw(text[at:]))
    return "".join(parts)


def _raw(text: str) -> str:
    """Raw characters: whitespace as its symbol, every other invisible character escaped."""
    out, run = [], []
    for ch in text + "\0":  # the sentinel flushes the last run
        if ch in VISIBLE or ch == "\0":
            out.append(escape_text("".join(run)).replace("\\\\", "\\"))  # a raw backslash stays one
            run = []
            out.append(VISIBLE.get(ch, ""))
        else:
            run.append(ch)
    return "".join(out)


def shown(text: str) -> str:
    """A token in a list of tokens: quoted, whitespace visible (``' Paris'`` -> ``'␣Paris'``), so that
    punctuation tokens (``','``) stay apart from the list's separators."""
    return f"'{visible(text)}'"


def display_token(tokenizer, token_id: int) -> str:
    """One token for a figure or a table: :func:`~vocablens.models.tokens.token_str` with visible
    whitespace (``'␣Paris'``, ``'⏎'``)."""
    return visible(token_str(tokenizer, int(token_id)))


def display_tokens(tokenizer, ids) -> list[str]:
    """:func:`display_token` of every id of a list or 1-D tensor."""
    if hasattr(ids, "flatten"):
        ids = ids.flatten().tolist()
    return [display_token(tokenizer, i) for i in ids]


def special_note(tokenizer, ids) -> str | None:
    """One line explaining the tokenizer's special tokens among ``ids`` (e.g. ``<filename>`` in early
    layers of the logit lens), or None when there are none."""
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
    if hasattr(ids, "flatten"):
        ids = ids.flatten().tolist()
    found = sorted({int(i) for i in ids if int(i) in specials})
    if not found:
        return None
    names = ", ".join(token_str(tokenizer, i) for i in found[:6])
    return (f"{names}: special tokens of the tokenizer (document and role markers used in training, not "
            "text); the lens at early layers, before a prediction has formed, often ranks such tokens first.")


__all__ = ["VISIBLE", "LEGEND", "visible", "shown", "display_token", "display_tokens", "special_note"]
