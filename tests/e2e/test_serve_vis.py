"""The explorer's ``vis`` (serve/static/app.js) against :func:`vocablens.render.tokens.visible`, in node.

A token of a backslash and an n (token_str: the three characters ``\\\\n``) showed as a backslash and
⏎ on the page: ``vis`` replaced every ``\\n`` pair instead of reading token_str's escapes left to right.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vocablens.models.tokens import show_bytes
from vocablens.render.tokens import visible

APP = Path(__file__).resolve().parents[2] / "src" / "vocablens" / "serve" / "static" / "app.js"
NODE = shutil.which("node")
from browser import CHROMIUM

CASES = [b"\\n", b"\\", b"\\\\", b"\\\\n", b'a"b', b"'", b'\\"', b"\n", b" \\t", b"\\x41", b"\t\r",
         b" \xc2\xa0x", b" \xe2\x80\x8b\xe2\x80\x8b", b"\\u00a0", b"\\u200b", b"C:\\new\\table", b"\x01"]


def _vis_in_node(js: str, texts: list[str]) -> list[str]:
    run = js + "process.stdout.write(JSON.stringify(JSON.parse(process.argv[1]).map(vis)))"
    return json.loads(subprocess.run([NODE, "-e", run, json.dumps(texts)], capture_output=True, text=True,
                                     check=True).stdout)


def _vis_in_chromium(js: str, texts: list[str]) -> list[str]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = b.new_page()
            return page.evaluate("([js, texts]) => new Function('texts', js + '; return texts.map(vis);')(texts)",
                                 [js, texts])
        finally:
            b.close()


def test_the_page_shows_tokens_as_the_tables_do():
    """In node when it is installed, else in the headless Chromium the browser tests use (CI has it)."""
    if NODE is None and not CHROMIUM:
        pytest.fail("neither node nor Chromium: install one (apt-get install -y --no-install-recommends chromium)")
    src = APP.read_text(encoding="utf-8")
    js = src[src.index("const VIS ="):src.index("function short")]  # VIS, VIS_RE and vis()
    texts = [show_bytes(b) for b in CASES]
    runs = ([_vis_in_node(js, texts)] if NODE else []) + ([_vis_in_chromium(js, texts)] if CHROMIUM else [])
    for got in runs:
        assert got == [visible(t) for t in texts]
        assert got[0] == "\\\\n" and got[7] == "⏎"  # a backslash and an n, then a newline
