"""The CLI's two consoles (stdout: tables and results; stderr: progress, notes, errors) and the
rule that keeps user text literal in them: prompts, paths, model names and tokens never act as rich
markup, whatever brackets or backslashes they hold -- not even our own style tags (``[bold]``,
``[red]x[/red]``): both consoles read no markup at all, and our own styles are ``style=`` arguments
and :class:`rich.text.Text` spans, never tags inside a string.
"""

from __future__ import annotations

import os
import re

from rich.console import Console, ConsoleDimensions
from rich.text import Text

#: the console styles vocablens's own strings use; any other bracket is text
STYLES = frozenset({"dim", "bold", "italic", "red", "green", "yellow", "cyan", "bold red", "bold yellow",
                    "bold cyan"})
# a tag as rich reads one (rich.markup.RE_TAGS), with the backslashes before it
_TAG = re.compile(r"(\\*)(\[([a-z#/@][^\[]*?)\])")


def literal_markup(text: str) -> str:
    """Markup in which only vocablens's own style tags (:data:`STYLES`, each closed by name) stay
    tags: every other bracket, a closing tag that closes nothing open, an opening tag never closed,
    a bare ``[/]`` and a backslash before a tag print as the characters they are. So a prompt, a path, a token or a model name (``[/x]``, ``[/bold]``,
    ``C:\\dir\\``) interpolated into a styled line prints literally instead of raising
    ``rich.errors.MarkupError`` or vanishing into a style."""
    found = list(_TAG.finditer(text))
    keep = [False] * len(found)
    stack: list[int] = []
    for i, m in enumerate(found):
        name = m.group(3).strip()
        if name in STYLES:
            stack.append(i)
        elif name.startswith("/") and stack:
            closing = name[1:].strip()
            if closing == found[stack[-1]].group(3).strip():  # a bare [/] is text: we always name the tag
                keep[stack.pop()] = keep[i] = True
    parts, at = [], 0
    for i, m in enumerate(found):
        parts += [text[at:m.start()], m.group(1) * 2, "" if keep[i] else "\\", m.group(2)]
        at = m.end()
    parts.append(text[at:])
    return "".join(parts)


class LiteralConsole(Console):
    """A rich console whose strings are read through :func:`literal_markup` (tables, titles and lines
    alike), with emoji codes (``:smile:``) left as text: user text prints as it is, everywhere."""

    def render_str(self, text: str, *args, markup: bool | None = None, **kw) -> Text:
        if markup is not False and (markup or self._markup) and "[" in text:
            text = literal_markup(text)
        return super().render_str(text, *args, markup=markup, **kw)


class _StdoutConsole(LiteralConsole):
    """stdout's console: piped output keeps wide tables (:data:`PIPED_WIDTH` columns where rich would
    fall back to 80); a terminal's width or ``COLUMNS`` still wins. Decided at each print, not once at
    import: a process that imported this module while ``COLUMNS`` was set and later printed without
    it got 80-column tables (tests run in one process in another order did)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._width = None                  # rich fixed COLUMNS's value at init: read it at each print

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is None and not os.environ.get("COLUMNS"):
            try:
                tty = self.file.isatty()
            except (AttributeError, ValueError):
                tty = False
            if not tty:
                return ConsoleDimensions(PIPED_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)


#: stdout's width when it is not a terminal and ``COLUMNS`` is unset
PIPED_WIDTH = 120

#: stdout: tables and results; stderr: progress, notes and errors (stdout stays pure JSON with --json).
# No markup: every string (a table cell, a title, a line) prints as it is, so a token such as
# '[red]x[/red]' is itself; a caller that asks for markup=True still gets literal_markup's protection.
out = _StdoutConsole(highlight=False, soft_wrap=False, emoji=False, markup=False)
err = LiteralConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False, markup=False)


def print_error(message: str) -> None:
    """The CLI's one error line on stderr: ``error: MESSAGE``, the message printed as it is."""
    err.print(Text.assemble(("error:", "bold red"), " ", str(message)), soft_wrap=True, highlight=False)


def print_note(message: str) -> None:
    """One dim ``note: MESSAGE`` line on stderr, the message printed as it is."""
    err.print(Text(f"note: {message}", style="dim"), soft_wrap=True, highlight=False)
