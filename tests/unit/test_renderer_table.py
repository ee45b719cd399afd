"""The one renderer table (issue 52, part D): every kind of result :mod:`vocablens.handle.results` hands
back has exactly one :class:`~vocablens.render.renderer.Renderer`, registered in the render module named
for the kind, and that module holds all its functions (JSON, printed table, figure, rows) beside each
other; every command ends through :func:`vocablens.cli.common.show`.

Failed before: argmax was rendered from four files (its registry entry and JSON in ``render/shown.py``,
``argmax_to_dict`` in ``render/argmax.py``, its table in ``render/printed.py``, its rows in
``render/frames.py``), the registry was spread over three files with two tuple shapes, and seven
commands wrote ``emit_json(to_json(...))`` beside ``show``.

Oracle: the source itself, parsed (``ast``): the ``kind=`` of every ``Result`` subclass in
handle/results.py, every ``Renderer(...)`` written under src/vocablens/render, the text of cli/; and
the table as imported, its functions' ``__module__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"


def _result_kinds() -> set[str]:
    """The ``kind=`` of every class in handle/results.py."""
    tree = ast.parse((SRC / "handle" / "results.py").read_text(encoding="utf-8"))
    return {k.value.value for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            for k in node.keywords if k.arg == "kind"}


def _renderers_written() -> dict[str, list[str]]:
    """kind -> the render modules (dotted, under ``vocablens.render``) where a ``Renderer(kind, ...)`` is written."""
    out: dict[str, list[str]] = {}
    for path in sorted((SRC / "render").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Renderer" and node.args:
                mod = ".".join(("vocablens", *path.relative_to(SRC).with_suffix("").parts))
                out.setdefault(node.args[0].value, []).append(mod)
    return out


def test_every_result_kind_has_exactly_one_renderer_written_in_the_module_named_for_it():
    kinds, written = _result_kinds(), _renderers_written()
    assert len(kinds) == 26  # the kinds handed back today; a new one needs its module
    assert set(written) == kinds
    for kind, mods in written.items():
        assert len(mods) == 1, (kind, mods)
        assert mods[0].rsplit(".", 1)[1] == kind, (kind, mods)


def test_the_table_holds_each_kinds_own_functions():
    import importlib

    from vocablens.render.renderer import Renderer
    from vocablens.render.shown import RENDERERS

    written = _renderers_written()
    assert set(RENDERERS) == _result_kinds()
    for kind, entry in RENDERERS.items():
        assert isinstance(entry, Renderer) and entry.kind == kind
        module = written[kind][0]
        assert importlib.import_module(module).RENDERER is entry
        funcs = [f for f in (entry.to_json, entry.table, entry.figure, entry.frame) if f is not None]
        assert {f.__module__ for f in funcs} == {module}, kind


def test_every_command_ends_through_show():
    """No command renders a result itself: ``to_json(``/``print_result(`` appear in cli/ only inside
    ``common.show``."""
    for path in sorted((SRC / "cli").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name != "common.py":
            assert "to_json(" not in text and "print_result(" not in text, path.name
            continue
        tree = ast.parse(text)
        show = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "show")
        body = ast.get_source_segment(text, show)
        assert text.count("emit_json(to_json(") == body.count("emit_json(to_json(") == 1
        assert text.count("print_result(") == body.count("print_result(")


def test_no_command_writes_its_own_json():
    """Failed before: ``anatomy`` of several models wrote ``emit_json(anatomy_json(...))``, ``report`` its
    ``report_to_dict`` and ``lens merge`` its record, each itself. Each ends through ``show`` now, with a
    result of its kind (``anatomy`` holding the models, ``report``, ``lens_merge``): ``emit_json(``
    is written in cli/ inside ``common`` only."""
    own = {p.name for p in sorted((SRC / "cli").glob("*.py"))
           if p.name != "common.py" and "emit_json(" in p.read_text(encoding="utf-8")}
    assert own == set()


def _settle():
    import torch

    from vocablens.handle.results import Settle
    from vocablens.vocab_space.settle import SettleResult

    res = SettleResult(kind="logit", n_positions=2, n_layers=2, settle_layer=torch.tensor([1, 2]),
                       histogram=torch.tensor([0, 1, 1]), settled_fraction=torch.tensor([0.0, 0.5, 1.0]),
                       top1_agreement=torch.tensor([0.0, 0.5, 1.0]), exits=[], block_flops=10.0, head_flops=4.0)
    return Settle(res, None, None, options={"corpus": "c", "plot": None})


def test_show_merges_options_into_the_json_and_keeps_notes_off_stdout(capsys):
    """``show(options=...)`` renders the result with the options merged (``settle --plot``'s path in its
    JSON); notes go to stderr after the table, never with ``--json``; ``printed`` replaces the table."""
    import json

    from vocablens.cli.common import show

    res = _settle()
    show(res, True, options={"plot": "x.html"}, notes=["wrote x.html"])
    got = capsys.readouterr()
    d = json.loads(got.out)
    assert (d["corpus"], d["plot"], d["histogram"], d["n_layers"]) == ("c", "x.html", [0, 1, 1], 2)
    assert got.err == "" and res.options["plot"] is None  # the caller's result is left as it was
    show(res, False, notes=["wrote x.html"])
    got = capsys.readouterr()
    assert got.out.strip() and got.err.strip() == "wrote x.html"
    show(res, False, printed=lambda: print("the tail"), notes=["a note"])
    got = capsys.readouterr()
    assert (got.out, got.err.strip()) == ("the tail\n", "a note")


def test_render_modules_stay_under_400_lines():
    """Each kind's renderers sit beside its tables and figures without a module growing past the rule."""
    long = {str(p.relative_to(SRC)): n for p in (SRC / "render").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) >= 400}
    assert not long, long
