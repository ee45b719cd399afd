"""One check per argument: the handle's messages name Python parameters (`` `k` ``), the CLI its options (``-k``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from tiny_dirs import save_tiny, tiny_tokenizer

import vocablens.cli  # noqa: F401  (registers the commands)
from vocablens.cli.common import run_app
from vocablens.errors import BadInput
from vocablens.handle import checks
from vocablens.handle.lenses.evaluation import check_scoring_options

HANDLE = Path(__file__).resolve().parents[2] / "src" / "vocablens" / "handle"
#: a CLI option in a message: --top-k, --max-new-tokens, or a one-letter -k (not a range such as 0..-1)
FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*|-[a-zA-Z](?![\w-]))")


def _raised_strings(path: Path):
    """(line, text) of every string constant inside ``raise X(...)`` in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    yield node.lineno, sub.value


def test_the_scan_finds_a_flag_where_there_is_one():
    assert FLAG.search("-k must be at least 1") and FLAG.search("give --promote TOKEN")
    assert not FLAG.search("`k` must be at least 1") and not FLAG.search("blocks 0..-1 of a non-finite")


def test_no_message_raised_in_the_handle_names_a_cli_flag():
    found = [f"{p.name}:{line}: {text!r}" for p in sorted(HANDLE.glob("*.py"))
             for line, text in _raised_strings(p) if FLAG.search(text)]
    assert HANDLE.is_dir() and len(list(HANDLE.glob("*.py"))) > 10
    assert found == []


def _cli_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = run_app(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    return err.strip()


@pytest.mark.parametrize("rule, argv, python, cli", [
    (lambda: checks.at_least("k", 0), ["neighbors", " king", "-k", "0"],
     "`k` must be at least 1; got 0", "-k must be at least 1; got 0"),
    (lambda: checks.at_least_ge("top_k", -1, 0), ["score", "some text", "--top-k", "-1"],
     "`top_k` must be >= 0; got -1", "--top-k must be >= 0; got -1"),
    (lambda: checks.one_of("bias", "maybe", ("auto", "on", "off")), ["argmax", "--bias", "maybe"],
     "`bias` must be auto, on or off; got 'maybe'", "--bias must be auto, on or off; got 'maybe'"),
    (lambda: checks.at_least("max_new_tokens", 0), ["generate", "hi", "--max-new-tokens", "0"],
     "`max_new_tokens` must be at least 1; got 0", "--max-new-tokens must be at least 1; got 0"),
    (lambda: check_scoring_options(1, 128, None, False), ["lens", "eval", "--max-tokens", "1"],
     "`max_tokens` and `seq_len` must be at least 2", "--max-tokens and --seq-len must be at least 2"),
    (lambda: checks.steer_options((), (), "", "", 0), ["steer"],
     "give `promote` TOKEN and/or `suppress` TOKEN", "give --promote TOKEN and/or --suppress TOKEN"),
])
def test_a_python_caller_sees_the_parameter_the_cli_user_the_option(rule, argv, python, cli, capsys):
    with pytest.raises(BadInput) as e:
        rule()
    assert str(e.value) == python
    assert _cli_error(capsys, argv) == f"error: {cli}"  # before any model loads: the rule runs first


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    return vocablens.load(str(save_tiny(tmp_path_factory.mktemp("checks") / "m", tiny_tokenizer())))


def test_the_model_methods_name_their_parameters(m):
    for call, want in ((lambda: m.neighbors(["a"], k=0), "`k` must be at least 1; got 0"),
                       (lambda: m.score("some text", top_k=-1), "`top_k` must be >= 0; got -1"),
                       (lambda: m.argmax(bias="maybe"), "`bias` must be auto, on or off; got 'maybe'"),
                       (lambda: m.generate("hi", max_new_tokens=0), "`max_new_tokens` must be at least 1; got 0")):
        with pytest.raises(BadInput) as e:
            call()
        assert str(e.value) == want
