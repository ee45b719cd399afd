"""The module import graph of ``src/vocablens``: no cycles, every import points down the layers, and
no loop between the analysis packages of layer 3 (``lens -> parallel -> generate -> lens`` was one:
each module edge pointed down or sideways, so the module check could not see it).

Oracle: the source itself, parsed (``ast``): every ``import``/``from ... import`` of a ``vocablens``
module anywhere in a file, function-level imports included (a lazy import still ties two modules
together), is an edge from the importing module to the module it names (``from pkg import mod``:
to ``pkg.mod``; ``from mod import name``: to ``mod``). No module is imported, so the check is the
same whatever is installed.

Layers (DESIGN.md; imports point down or stay in their layer):

====  ==========================================================================================
 6    the package facade ``vocablens`` (``__init__``: lazy names only) and ``vocablens.__main__``
 5    ``cli``
 4.5  ``serve`` (the explorer's server): it calls the handle's workflows and render's JSON builders
 4.25 ``handle``: ``vocablens.Model``, text -> ids and the workflows; imports analyses, render
      and report, never cli or serve (which call it)
 4    ``render``
 3.5  ``report``, the report's runner (its plan, its sections under a budget): its sections call the
      workflows of the :class:`vocablens.Model` they are handed (never importing the handle), never
      render; render formats its result and never imports it
 3    analyses: ``accounting``, ``geometry``, ``lens``, ``vocab_space``, ``argmax``, ``undertrained``,
      ``surgery``, ``generate``, ``parallel`` (every package not named here)
 2    ``ops``
 1    ``models``
 0    ``errors``, ``units``, ``logit_transform``, ``files``, ``version``, ``corpus``: the only
      modules at the package root (:func:`test_root_holds_layer_0_only`)
====  ==========================================================================================
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "vocablens"

LAYER_0 = {"errors", "units", "logit_transform", "files", "version", "corpus"}
NAMED = {"models": 1, "ops": 2, "render": 4, "report": 3.5, "handle": 4.25, "serve": 4.5, "cli": 5, "__main__": 6}


def modules(root: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """dotted module name -> (file, is a package ``__init__``), for every ``.py`` under ``root/vocablens``."""
    out = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """module -> the vocablens modules it imports (anywhere in the file)."""
    mods = modules(root)

    def known(name: str) -> str | None:  # the longest prefix of ``name`` that is a module
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for m, (path, is_pkg) in mods.items():
        here = m if is_pkg else m.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                out |= {t for a in node.names if (t := known(a.name)) and a.name.split(".")[0] == PACKAGE}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if src.split(".")[0] != PACKAGE:
                    continue
                for a in node.names:
                    t = f"{src}.{a.name}" if f"{src}.{a.name}" in mods else known(src)
                    if t:
                        out.add(t)
        out.discard(m)
        graph[m] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> float:
    """The layer of a vocablens module (the module docstring's table)."""
    parts = module.split(".")
    if len(parts) == 1:
        return 6  # the package facade
    top = parts[1]
    if top in LAYER_0:
        return 0
    return NAMED.get(top, 3)


def test_the_parser_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from vocablens.c import x  # function level\n")
    (pkg / "c.py").write_text("import vocablens.sub.b\nfrom .sub import b\n")
    g = import_graph(tmp_path)
    assert g["vocablens.sub"] == {"vocablens.sub.b"}
    assert g["vocablens.sub.b"] == {"vocablens.c"}
    assert g["vocablens.c"] == {"vocablens.sub.b"}
    assert cycles(g) == [["vocablens.c", "vocablens.sub.b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycle_in_vocablens(graph):
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers(graph):
    up = sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
                for a, outs in graph.items() for b in outs if layer(b) > layer(a))
    assert not up, "\n".join(up)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """analysis package -> the other analysis packages (layer 3) its modules import."""
    def pkg(m: str) -> str | None:
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and layer(m) == 3 else None

    out: dict[str, set[str]] = {}
    for a, outs in graph.items():
        if (pa := pkg(a)) is not None:
            out.setdefault(pa, set()).update(pb for b in outs if (pb := pkg(b)) not in (None, pa))
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_a_planted_loop_between_two_analysis_packages_is_seen():
    """Each module edge below points sideways within layer 3 and no module cycle exists, yet the
    packages ``lens`` and ``parallel`` import each other: the package check must find it."""
    g = {"vocablens.lens.evaluate": {"vocablens.parallel.processes", "vocablens.ops.kl"},
         "vocablens.parallel.processes": {"vocablens.lens.tuned"},
         "vocablens.lens.tuned": {"vocablens.models.borders"},
         "vocablens.ops.kl": set(), "vocablens.models.borders": set(), "vocablens.cli.core": {"vocablens.lens.evaluate"}}
    assert cycles(g) == []
    assert package_graph(g) == {"vocablens.lens": {"vocablens.parallel"}, "vocablens.parallel": {"vocablens.lens"}}
    assert cycles(package_graph(g)) == [["vocablens.lens", "vocablens.parallel"]]
    g["vocablens.parallel.processes"] = {"vocablens.ops.kl"}                 # the loop cut: no cycle
    assert cycles(package_graph(g)) == []


def test_no_loop_between_analysis_packages(graph):
    pg = package_graph(graph)
    assert "vocablens.argmax" in pg and "vocablens.lens" in pg
    found = cycles(pg)
    assert not found, "package loops: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer():
    mods = modules()
    assert "vocablens.models.borders" in mods and "vocablens.cli.common" in mods
    assert layer("vocablens.models.blocks.view") == 1 and layer("vocablens.errors") == 0
    assert layer("vocablens.vocab_space.steer") == 3 and layer("vocablens.serve.app") == 4.5 and layer("vocablens.cli") == 5


def private_imports(root: Path = SRC) -> list[str]:
    """``module:line imports name from other``: names with a leading underscore taken from another module."""
    found = []
    for m, (path, _) in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == PACKAGE):
                found += [f"{m}:{node.lineno} imports {a.name} from {node.module}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_names_imported_across_modules_are_public():
    assert not private_imports(), "\n".join(private_imports())


def test_root_holds_layer_0_only():
    """A module's path says its layer (issue 23 §6): at the package root only layer 0 and the facade;
    every analysis, runner and interface is a package."""
    root = {p.stem for p in (SRC / PACKAGE).glob("*.py")}
    assert root - {"__init__", "__main__"} == LAYER_0, sorted(root - {"__init__", "__main__"} - LAYER_0)
