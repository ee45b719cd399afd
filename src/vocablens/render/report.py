"""The self-contained HTML report: sections in, one HTML file out (plotly.js inlined once).

The page needs no network to open: plotly.js is embedded, there are no external fonts, images or
scripts. It is written to a temporary file beside the target and renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from vocablens.files import atomic_write, publish_mode  # noqa: F401  (publish_mode: old import path)
from vocablens.render.html import Section, esc

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2433;background:#fafbfc}
header{background:#1d2433;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px 0;font-size:22px}
header p{margin:2px 0;font-size:13px;color:#c9d1e0}
nav{padding:10px 32px;background:#eef1f6;font-size:13px}
nav a{margin-right:14px;color:#2457c5;text-decoration:none}
main{padding:8px 32px 40px 32px;max-width:1280px}
section{background:#fff;border:1px solid #e3e7ee;border-radius:8px;padding:16px 20px;margin:18px 0}
section h2{margin-top:0;font-size:18px}
table.data{border-collapse:collapse;font-size:13px;margin:8px 0}
table.data th,table.data td{border:1px solid #dde2ea;padding:4px 8px;text-align:right}
table.data th{background:#f3f5f9}
table.data td:first-child,table.data th:first-child{text-align:left}
.note{color:#5b6478;font-size:13px}
code,.tok{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;background:#f3f5f9;padding:0 3px;border-radius:3px}
.figure{margin:8px 0}
.cards{display:flex;flex-wrap:wrap;gap:6px 22px;align-items:flex-start}
.card h3{margin:8px 0 2px 0;font-size:15px}
"""


def render_report(title: str, subtitle_lines: list[str], sections: list[Section]) -> str:
    """The whole report as one HTML string: header, navigation, sections, inlined plotly.js."""
    from plotly.offline import get_plotlyjs

    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{s.html}</section>' for s in sections
    )
    sub = "".join(f"<p>{esc(x)}</p>" for x in subtitle_lines)
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
        f"<header><h1>{esc(title)}</h1>{sub}</header><nav>{nav}</nav><main>{body}</main></body></html>"
    )


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write the report's HTML to ``path`` through :func:`vocablens.files.atomic_write`.

    Raises:
        WriteFailed: the directory is missing, read-only or full (the target is untouched).
    """
    return atomic_write(path, text)


def stamp() -> str:
    """UTC time for the report header."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
