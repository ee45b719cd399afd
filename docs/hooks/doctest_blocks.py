"""mkdocs hook: the tour's bare ``>>>`` examples shown as Python console blocks.

``docs/tour.md`` is a doctest file (``tests/integration/test_tour.py`` runs it as written), so its
examples stand outside code fences; markdown would read ``>>>`` as nested block quotes. At build
time each run of example lines (a ``>>>`` line up to the next blank line: its ``...`` lines and its
output) is wrapped in a ``pycon`` fence. The file itself is not changed.
"""

from __future__ import annotations


def fence_doctests(markdown: str) -> str:
    """``markdown`` with every bare doctest block fenced; text inside existing fences is left alone."""
    out: list[str] = []
    in_fence = in_example = False
    for line in markdown.splitlines():
        if in_example and not line.strip():
            out.append("```")
            in_example = False
        if not in_example and line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and not in_example and line.startswith(">>>"):
            out.append("```pycon")
            in_example = True
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown, page, config, files):
    return fence_doctests(markdown) if ">>>" in markdown else markdown
