"""mkdocs hook: the docstrings' Sphinx roles shown as plain code.

The docstrings cross-reference in Sphinx's style (``:func:`~vocablens.ops.kl_readout```), which
mkdocstrings renders as the role's name followed by code. After rendering, each such pair becomes the
code alone, with ``~`` meaning the last dotted part, as Sphinx shows it. Links are not made: many
targets are modules this site does not document, and a dangling cross-reference would fail the
strict build.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|const):<code>(~?)([^<]*)</code>")


def plain_roles(html: str) -> str:
    """``html`` with every ``:role:<code>target</code>`` turned into ``<code>target</code>``."""
    return _ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)


def on_page_content(html, page, config, files):
    return plain_roles(html)
