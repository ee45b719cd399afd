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

APP = Path(__file__).resolve().parent.parent / "src" / "vocablens" / "serve" / "static" / "app.js"
NODE = shutil.which("node")

CASES = [b"\\n", b"\\", b"\\\\", b"\\\\n", b'a"b', b"'", b'\\"', b"\n", b" \\t", b"\\x41", b"\t\r",
         b" \xc2\xa0x", b" \xe2\x80\x8b\xe2\x80\x8b", b"\\u00a0", b"\\u200b", b"C:\\new\\table", b"\x01"]


@pytest.mark.skipif(NODE is None, reason="node is not installed (apt-get install -y nodejs)")
def test_the_page_shows_tokens_as_the_tables_do():
    src = APP.read_text(encoding="utf-8")
    js = src[src.index("const VIS ="):src.index("function short")]  # VIS, VIS_RE and vis()
    texts = [show_bytes(b) for b in CASES]
    run = js + "process.stdout.write(JSON.stringify(JSON.parse(process.argv[1]).map(vis)))"
    got = json.loads(subprocess.run([NODE, "-e", run, json.dumps(texts)], capture_output=True, text=True,
                                    check=True).stdout)
    assert got == [visible(t) for t in texts]
    assert got[0] == "\\\\n" and got[7] == "⏎"  # a backslash and an n, then a newline
