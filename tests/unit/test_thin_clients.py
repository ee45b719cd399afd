"""The CLI, the report and the explorer are clients of ``vocablens.Model`` (issue 37, DESIGN.md layer
4½): none of ``cli/``, ``serve/`` or ``report/`` turns text into ids by itself or chains the workflows
the handle owns.

Oracle: the source, read as text and as a syntax tree. Text becomes ids only through the model's
``encode`` / ``encode_batch`` / ``pieces`` (``models/files/loaded_model.py``) and ``token_id`` (the handle); a client that calls
a tokenizer, ``encode_prompt``, ``single_token_id`` or asks for ``return_tensors`` is encoding on its
own. A chained workflow shows as a client importing the steps the handle runs in order (surgery's
edit -> verify -> indicator -> save; the lens's batched readout; scoring).

The rule on analyses (:func:`test_clients_import_no_computation_from_the_analyses`): from the analysis
packages (layer 3) and ``ops``, a client imports only what computes nothing -- exceptions, dataclasses
(settings, rules, results as types) and constants. A function, a whole module or any other class (a
lens, a parallel model) imported from them is a step the client runs itself, and belongs in a
:class:`vocablens.Model` method. The exceptions are named below, each with its reason
(:data:`ALLOWED`), and so are the steps not moved yet (:data:`NOT_MOVED`); both lists are exact: a
new import fails the test, and so does moving one without striking it off."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
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


#: the analysis packages (DESIGN.md layer 3) and ops: what a client may not run itself
ANALYSES = {"accounting", "geometry", "lens", "vocab_space", "argmax", "undertrained", "surgery", "generate",
            "parallel", "ops"}

#: functions a client may import from them, with the reason (none reads the model or chains a workflow)
ALLOWED = {
    # torchrun: the CLI owns the process (DESIGN.md: process-wide settings in one place)
    "vocablens.parallel.processes.init_from_env": "joins the torchrun process group",
    "vocablens.parallel.processes.common_seed": "one seed for every torchrun rank",
    "vocablens.ops.vocab_parallel.comm.share": "this rank's share of the rows under torchrun",
    # options and files checked before a model loads (one line, exit 2, no load first)
    "vocablens.ops.sampling.check_sampling_args": "checks --temperature/--top-k/--top-p before the load",
    "vocablens.generate.early_exit.check_exit_options": "checks --early-exit/--threshold/--exit-test before the load",
    "vocablens.lens.jacobian_merge.parse_shard": "checks fit-jacobian's --shard I/N before the load",
    "vocablens.accounting.anatomy.logits_memory": "checks --batch/--context/--dtype before the load",
    "vocablens.surgery.io.check_out": "refuses an --out that exists before the load",
    "vocablens.lens.positions.parse_positions": "refuses --positions before the load (the parser Model.lens uses)",
    "vocablens.surgery.io.chunk_texts": "reads --corpus texts before the load",
    "vocablens.surgery.io.heldout_texts": "reads the held-out texts before the load",
    # the report's budget: time estimates, no result of the model
    "vocablens.argmax.expected_scan_seconds": "the report's ETA for the scan",
    "vocablens.argmax.estimate.scan_fraction": "the report's progress fraction of a scan stage",
    "vocablens.argmax.estimate.scan_seconds": "the report's time quote for `vocablens argmax`",
    # no model is loaded: the configuration alone is counted
    "vocablens.accounting.anatomy.anatomy_of": "`anatomy` without --load counts from a config",
}

#: steps still run by a client: to move into vocablens.Model (strike one off when it moves)
NOT_MOVED: dict[str, set[str]] = {}


def _computes(obj) -> bool:
    """A function, a module, or a class that is neither an exception nor a dataclass (a lens, a model)."""
    if inspect.isclass(obj):
        return not (issubclass(obj, BaseException) or dataclasses.is_dataclass(obj))
    return inspect.ismodule(obj) or callable(obj)


def analysis_imports(path: Path) -> set[str]:
    """The names ``path`` imports from the analysis packages that compute (:func:`_computes`), dotted."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.split(".")[:2][-1] in ANALYSES
                      and a.name.startswith("vocablens.")}
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vocablens.") \
                and n.module.split(".")[1] in ANALYSES:
            mod = importlib.import_module(n.module)
            for a in n.names:
                obj = getattr(mod, a.name) if hasattr(mod, a.name) else importlib.import_module(f"{n.module}.{a.name}")
                if _computes(obj):
                    found.add(f"{n.module}.{a.name}")
    return found


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


@pytest.mark.parametrize("path", CLIENTS, ids=lambda p: p.relative_to(SRC).as_posix())
def test_clients_import_no_computation_from_the_analyses(path):
    """The module docstring's rule: what a client imports from an analysis package computes nothing, or
    is allowed with its reason, or is a step named as not moved yet (the list exact both ways)."""
    name = path.relative_to(SRC).as_posix()
    found = analysis_imports(path) - set(ALLOWED)
    assert found == NOT_MOVED.get(name, set()), (
        f"{name}: new: {sorted(found - NOT_MOVED.get(name, set()))}; "
        f"moved (strike them off NOT_MOVED): {sorted(NOT_MOVED.get(name, set()) - found)}")


def test_the_clients_named_by_the_issue_are_thin():
    """Issue 37 §3: the explorer's adapters, the report's runner and these commands run no analysis
    themselves (the lens, trajectory, project, argmax endpoints; argmax, bottleneck, align, anomaly; lens
    train and lens eval, over one lens or several; lens fit-jacobian, lens backward; the report's
    under-trained section)."""
    for name in ("serve/adapters.py", "serve/app.py", "serve/state.py", "report/runner.py", "cli/argmax.py",
                 "cli/align.py", "cli/anomaly.py", "cli/undertrained.py", "cli/core.py", "cli/surgery.py",
                 "cli/tuned.py", "cli/lenses.py", "cli/jacobian.py", "report/sections.py"):
        assert analysis_imports(SRC / name) - set(ALLOWED) == set(), name
    assert not set(NOT_MOVED) & {"serve/adapters.py", "cli/argmax.py", "cli/align.py", "cli/anomaly.py",
                                 "cli/lenses.py", "cli/jacobian.py", "report/sections.py"}


def test_every_step_has_moved_into_the_handle():
    """Issue 37 §3 done: no client runs a step of its own any more. A step that must stay in a client
    for a while is named in :data:`NOT_MOVED` with this test changed to say why."""
    assert NOT_MOVED == {}


def test_the_rule_sees_what_it_forbids(tmp_path):
    """A planted client: a function and a module from an analysis package are found; a dataclass, an
    exception and a constant are not; names from the handle and render are not looked at."""
    p = tmp_path / "c.py"
    p.write_text("def f():\n"
                 "    from vocablens.lens.logit import lens_batches, LensResult, BATCH_TOKENS\n"
                 "    from vocablens.errors import BadInput\n"
                 "    from vocablens.lens.tuned import TunedLens\n"
                 "    import vocablens.vocab_space.search\n"
                 "    from vocablens import vocab_space\n"
                 "    from vocablens.handle import Model\n", encoding="utf-8")
    assert analysis_imports(p) == {"vocablens.lens.logit.lens_batches", "vocablens.lens.tuned.TunedLens",
                                   "vocablens.vocab_space.search"}
    assert not _computes(__import__("vocablens.lens.logit", fromlist=["LensResult"]).LensResult)
