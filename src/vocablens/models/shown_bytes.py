"""Bytes as readable text, the one display rule for token strings: complete UTF-8 characters as
themselves, control, invisible and backslash characters escaped, stray bytes as ``<0xNN>``;
:func:`shown_to_bytes` inverts :func:`show_bytes`. Knows no tokenizer (that is
:mod:`vocablens.models.tokens`)."""

from __future__ import annotations

import re
import unicodedata

_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
_UNESCAPE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


#: Unicode categories always shown as escapes: format characters (zero-width space U+200B, joiners,
#: BOM, soft hyphen), line and paragraph separators (see :func:`invisible` for the others)
_INVISIBLE = frozenset({"Cf", "Zl", "Zp"})


def invisible(ch: str, after_base: bool = True) -> bool:
    """Whether one character prints as nothing or as a blank a reader cannot tell from a space:
    categories Cc, Cf, Zl, Zp, Zs other than " ", and a combining mark (Mn, Mc, Me) standing alone
    (``after_base=False``: first in the token or after a space or an escaped character)."""
    cat = unicodedata.category(ch)
    return (cat == "Cc" or cat in _INVISIBLE or (cat == "Zs" and ch != " ")
            or (cat[0] == "M" and not after_base))


def escape_char(ch: str) -> str:
    """One character as an escape: ``\\n``/``\\t``/``\\r``/``\\\\``, ``\\xNN`` (other C0 controls
    and DEL), ``\\uNNNN`` or ``\\UNNNNNNNN`` (the rest)."""
    if ch in _CONTROL:
        return _CONTROL[ch]
    o = ord(ch)
    if o < 0x20 or o == 0x7F:  # one byte each; C1 controls (U+0080..U+009F) are two in UTF-8: \\u0085
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def escape_text(s: str) -> str:
    out, base = [], False
    for ch in s:
        if ch in _CONTROL or invisible(ch, base):
            out.append(escape_char(ch))
            base = False
        else:
            out.append(ch)
            if unicodedata.category(ch)[0] != "M":
                base = ch != " "
    return "".join(out)


def show_bytes(b: bytes) -> str:
    """Bytes as readable text: complete UTF-8 characters as themselves, except that control
    characters, the backslash and every invisible character (:func:`invisible`) are escaped
    (``\\n``, ``\\t``, ``\\x1b``, ``\\\\``, ``\\u200b``); every byte that is not part of a complete
    character is ``<0xNN>``. :func:`shown_to_bytes` inverts it."""
    chars, i = [], 0  # complete characters and <0xNN> stray bytes
    while i < len(b):
        for n in (1, 2, 3, 4):
            try:
                ch = b[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(ch) == 1:
                break
        else:
            chars.append(f"<0x{b[i]:02X}>")
            i += 1
            continue
        chars.append(ch)
        i += n
    return _escape_runs(chars)


def _escape_runs(parts: list[str]) -> str:
    """Characters escaped by :func:`escape_text` run by run (a combining mark after a base character
    stays), ``<0xNN>`` parts kept as they are (a mark after one stands alone)."""
    out, run = [], []
    for p in parts + ["<end>"]:
        if len(p) == 1:
            run.append(p)
            continue
        out.append(escape_text("".join(run)))
        run = []
        if p != "<end>":
            out.append(p)
    return "".join(out)


def shown_to_bytes(s: str) -> bytes:
    """The inverse of :func:`show_bytes`: ``<0xNN>`` and the escapes back to bytes."""
    out, i = bytearray(), 0
    while i < len(s):
        m = BYTE_PIECE.match(s, i)
        if m:
            out.append(int(m.group(1), 16))
            i = m.end()
        elif s[i] == "\\" and i + 1 < len(s) and s[i + 1] in _UNESCAPE:
            out += _UNESCAPE[s[i + 1]].encode()
            i += 2
        elif s[i] == "\\" and s[i + 1:i + 2] == "x":
            out.append(int(s[i + 2:i + 4], 16))
            i += 4
        elif s[i] == "\\" and s[i + 1:i + 2] in ("u", "U"):
            n = 4 if s[i + 1] == "u" else 8
            out += chr(int(s[i + 2:i + 2 + n], 16)).encode("utf-8")
            i += 2 + n
        else:
            out += s[i].encode("utf-8")
            i += 1
    return bytes(out)
