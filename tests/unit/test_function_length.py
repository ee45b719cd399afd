"""No new function in ``src/vocablens`` longer than :data:`CEILING` lines (issue 38, item 7).

A function's length is ``end_lineno - lineno + 1`` of its ``ast`` node: from the ``def`` line to its
last line, docstring included, decorators not. Nested functions and methods count on their own (their
lines count in the enclosing function too). The functions over the ceiling when this test was written
are listed in :data:`OVER_CEILING`; the set over the ceiling must stay a subset of that list, so it
can only shrink: split a listed function and delete its entry, never add one.

Oracle: the source itself, parsed (``ast``); no module is imported. :func:`test_lengths_of_planted_source`
checks the counting on source whose lengths are known by construction.

Run as a script for the closing note's figures (nothing but the standard library)::

    python tests/unit/test_function_length.py             # functions over the ceiling, longest first
    python tests/unit/test_function_length.py --packages  # lines per package
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"

#: the most lines a function may have unless it is listed in :data:`OVER_CEILING`
CEILING = 80

#: ``path:qualified name`` (path relative to src/vocablens) of each function over the ceiling, with
#: its length when listed (for the reader; only membership is checked). It may only lose entries.
OVER_CEILING: dict[str, int] = {}


def function_lengths(source: str, path: str = "") -> dict[str, int]:
    """``{path:qualified name: lines}`` of every function and method in ``source`` (nested ones as
    ``outer.inner``; a name defined twice in one scope keeps the longer)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                key = f"{path}:{name}"
                out[key] = max(out.get(key, 0), child.end_lineno - child.lineno + 1)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def src_function_lengths() -> dict[str, int]:
    """:func:`function_lengths` over every module of ``src/vocablens``."""
    out: dict[str, int] = {}
    for p in sorted(SRC.rglob("*.py")):
        out.update(function_lengths(p.read_text(encoding="utf-8"), p.relative_to(SRC).as_posix()))
    return out


def package_lines() -> dict[str, int]:
    """Lines of source per package of ``src/vocablens`` (``.`` for the modules at its root)."""
    out: dict[str, int] = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = p.relative_to(SRC).parts
        pkg = parts[0] if len(parts) > 1 else "."
        out[pkg] = out.get(pkg, 0) + len(p.read_text(encoding="utf-8").splitlines())
    return out


def test_lengths_of_planted_source():
    """Lengths known by construction: a function of 1 + n body lines, a method, a nested function,
    a decorator (not counted) and a docstring (counted)."""
    body = "".join(f"    x{i} = {i}\n" for i in range(CEILING))
    src = (f"def long():\n{body}\n"
           "class C:\n    @staticmethod\n    def m():\n        '''Doc\n        string.'''\n        return 1\n\n"
           "def outer():\n    def inner():\n        pass\n    return inner\n")
    got = function_lengths(src, "m.py")
    assert got == {"m.py:long": CEILING + 1, "m.py:C.m": 4, "m.py:outer": 4, "m.py:outer.inner": 2}


def test_no_new_function_over_the_ceiling():
    over = {k: n for k, n in src_function_lengths().items() if n > CEILING}
    new = {k: n for k, n in over.items() if k not in OVER_CEILING}
    assert not new, (f"functions over {CEILING} lines that are not in OVER_CEILING: {new}; split them into "
                     "named steps (a function over the ceiling is never added to the list)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--packages"]:
        lines = package_lines()
        for pkg, n in sorted(lines.items(), key=lambda kv: -kv[1]):
            print(f"{n:7d}  {pkg}")
        print(f"{sum(lines.values()):7d}  total")
    else:
        over = sorted(((n, k) for k, n in src_function_lengths().items() if n > CEILING), reverse=True)
        for n, k in over:
            print(f"{n:5d}  {k}")
        print(f"{len(over)} functions over {CEILING} lines")
