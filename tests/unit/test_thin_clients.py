"""The CLI, the report and the explorer are clients of ``vocablens.Model`` (issue 37, DESIGN.md layer
4½): none of ``cli/``, ``serve/`` or ``report/`` turns text into ids by itself or chains the workflows
the handle owns.

Oracle: the source, read as text and as a syntax tree. Text becomes ids only through the model's
``encode`` / ``encode_batch`` / ``token_ids`` / ``pieces`` (``models/loaded_model.py``); a client that calls
a tokenizer, ``encode_prompt``, ``single_token_id`` or asks for ``return_tensors`` is encoding on its
own. A chained workflow shows as a client importing the steps the handle runs in order (surgery's
edit -> verify -> indicator -> save; the lens's batched readout; scoring)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"
CLIENTS = sorted([*(SRC / "cli").rglob("*.py"), *(SRC / "serve").rglob("*.py"), *(SRC / "report").rglob("*.py")])

#: text -> ids outside the handle: a tokenizer called, or the encoding helpers the handle wraps
ENCODING = [
    (re.compile(r"return_tensors\s*="), "return_tensors="),
    (re.compile(r"\b(tok|tokenizer)\("), "a tokenizer called on text"),
    (re.compile(r"\b(tok|tokenizer)\.(encode|batch_encode_plus|encode_plus|apply_chat_template)\s*\("),
     "a tokenizer's encode"),
    (re.compile(r"\b(encode_prompt|encode_text|single_token_id)\b"), "an encoding helper of models.tokens"),
]

#: steps of a workflow the handle chains (vocablens.handle): a client importing one is chaining it itself
CHAINED = {"expand_vocab", "verify_expansion", "trim_vocab", "verify_trim", "accept_trim", "new_row_indicators",
           "save_model_dir", "corpus_token_ids", "tokenization_mismatches", "lens_batches", "logit_lens_batch",
           "score_ids", "pack_tokens"}


def _code_lines(path: Path):
    """(line number, line) of the code, docstrings and comments left out."""
    text = path.read_text(encoding="utf-8")
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
                and isinstance(node.value.value, str):
            doc_lines |= set(range(node.lineno, node.end_lineno + 1))
    for i, line in enumerate(text.splitlines(), start=1):
        if i not in doc_lines:
            yield i, line.split("#", 1)[0]


def test_the_clients_exist():
    names = {p.relative_to(SRC).as_posix() for p in CLIENTS}
    assert {"cli/core.py", "cli/surgery.py", "serve/adapters.py", "report/runner.py"} <= names


@pytest.mark.parametrize("path", CLIENTS, ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_client_encodes_text(path):
    found = [f"{path.relative_to(SRC)}:{i}: {what}: {line.strip()}" for i, line in _code_lines(path)
             for rx, what in ENCODING if rx.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", CLIENTS, ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_client_chains_a_workflow_of_the_handle(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [f"{path.relative_to(SRC)}:{n.lineno} imports {a.name}" for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) for a in n.names if a.name in CHAINED]
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The patterns find the encoding this module forbids (the way cli/steer.py encoded probes before)."""
    p = tmp_path / "x.py"
    p.write_text('def f(tok, t):\n    """tok(t) in a docstring is fine"""\n'
                 '    return tok(t, return_tensors="pt").input_ids  # a comment: tok(t)\n', encoding="utf-8")
    hits = [(i, what) for i, line in _code_lines(p) for rx, what in ENCODING if rx.search(line)]
    assert hits == [(3, "return_tensors="), (3, "a tokenizer called on text")]
