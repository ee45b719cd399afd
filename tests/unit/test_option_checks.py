"""One check per argument: the library's messages name Python parameters (`` `k` ``), the CLI its options (``-k``).

Oracle: the source, parsed (``ast``): every string inside a ``raise X(...)`` and every string a message
builder (``*_message``, ``*_refusal``) returns, in every package but ``cli/`` and ``serve/`` (the CLI
and the explorer name their own options); and the CLI run on the same bad value, whose one line must be
the library's with the option in the parameter's place.
"""

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
from vocablens.generate.early_exit import check_exit_options
from vocablens.lens.jacobian_merge import merge_lens_files, parse_shard
from vocablens.lens.published import resolve_lens_source
from vocablens.models.vision import read_image
from vocablens.ops.sampling import check_sampling_args
from vocablens.report.runner import check_prompt

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"
HANDLE = SRC / "handle"
#: the library: every module but the CLI's and the explorer's (they may name their options)
LIBRARY = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] not in ("cli", "serve")]
#: a CLI option in a message: --top-k, --max-new-tokens, or a one-letter -k (not a range such as 0..-1)
FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*|-[a-zA-Z](?![\w-]))")
#: a quoted span; one holding a space is a command line for the user to run (`vocablens argmax --json`),
#: whose options are the command's
QUOTED = re.compile(r"`[^`]*`")
#: functions that build a message a caller raises
BUILDER = re.compile(r"_(message|refusal)$")


def _strings(node):
    return [(sub.lineno, sub.value) for sub in ast.walk(node) if isinstance(sub, ast.Constant) and isinstance(sub.value, str)]


def _raised_strings(path: Path):
    """(line, text) of every string constant inside ``raise X(...)`` in ``path``, and inside what a
    message builder (a function named ``*_message`` or ``*_refusal``) returns."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            yield from ((node.lineno, text) for _, text in _strings(node.exc))
        elif isinstance(node, ast.FunctionDef) and BUILDER.search(node.name):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    yield from _strings(ret.value)


def _names_a_flag(text: str) -> bool:
    return bool(FLAG.search(QUOTED.sub(lambda m: "" if " " in m.group(0) else m.group(0), text)))


def test_the_scan_finds_a_flag_where_there_is_one():
    assert _names_a_flag("-k must be at least 1") and _names_a_flag("give --promote TOKEN")
    assert not _names_a_flag("`k` must be at least 1") and not _names_a_flag("blocks 0..-1 of a non-finite")
    assert not _names_a_flag("expected the JSON of `vocablens argmax --json`")
    assert _names_a_flag("`vocablens argmax` writes it with --json")
    msgs = dict(_raised_strings(SRC / "models" / "tensor_parallel.py"))  # a builder's returns are scanned
    assert any(text.startswith("`tp` and `device_map`") for text in msgs.values())


def test_no_message_raised_in_the_library_names_a_cli_flag():
    found = [f"{p.relative_to(SRC)}:{line}: {text!r}" for p in LIBRARY
             for line, text in _raised_strings(p) if _names_a_flag(text)]
    assert len(LIBRARY) > 200 and HANDLE / "checks.py" in LIBRARY and SRC / "lens" / "hub.py" in LIBRARY
    assert found == []


def _messages(path: Path):
    """(line, message) of every ``raise X("...")`` / ``raise X(f"...")`` in ``path``, each value an
    f-string puts in written ``{}`` (``f"got {k}"`` and ``f"got {self.k!r}"`` are one message)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            first = node.exc.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value
            elif isinstance(first, ast.JoinedStr):
                yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in first.values)


def _same_rule(message: str) -> str:
    """A message with the names of its arguments in one spelling (``--top-k``, ``-k``, `` `top_k` `` -> ``top_k``)."""
    message = message.replace("`", "")
    return re.sub(r"(?<![\w-])--?([a-zA-Z][a-zA-Z0-9-]*)", lambda m: m.group(1).replace("-", "_"), message)


def test_no_message_is_written_both_in_the_cli_and_in_the_library():
    """A rule the CLI checks before the load and the library on entry is one function: no message is
    raised in both (word for word, nor with the option written for the parameter)."""
    cli = {_same_rule(text): f"cli/{p.name}:{line}" for p in sorted((SRC / "cli").glob("*.py"))
           for line, text in _messages(p)}
    both = [f"{cli[_same_rule(text)]} and {p.relative_to(SRC)}:{line}: {text}" for p in LIBRARY
            for line, text in _messages(p) if _same_rule(text) in cli]
    assert len(cli) > 40 and _same_rule("--top-k must be >= 0") == _same_rule("`top_k` must be >= 0")
    assert both == []


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
    # rules below the handle: the analyses, ops, models and the report check their own arguments
    (lambda: parse_shard("2"), ["lens", "fit-jacobian", "--shard", "2"],
     "`shard` takes I/N (e.g. 2/8); got '2'", "--shard takes I/N (e.g. 2/8); got '2'"),
    (lambda: merge_lens_files([], "nowhere", save_dtype="int8"), ["lens", "merge", "a", "--out", "o", "--save-dtype", "int8"],
     "`save_dtype` must be float16, bfloat16 or float32; got 'int8'",
     "--save-dtype must be float16, bfloat16 or float32; got 'int8'"),
    (lambda: check_sampling_args(temperature=-1.0), ["generate", "hi", "-t", "-1"],
     "`temperature` must be >= 0 (0 = greedy); got -1.0", "--temperature must be >= 0 (0 = greedy); got -1.0"),
    (lambda: check_sampling_args(top_p=0.0), ["generate", "hi", "--top-p", "0"],
     "`top_p` must be in (0, 1]; got 0.0", "--top-p must be in (0, 1]; got 0.0"),
    (lambda: check_exit_options("fast", 0.9, "full"), ["generate", "hi", "--early-exit", "fast"],
     "`lens` must be 'logit' or 'tuned'; got 'fast'", "--early-exit must be 'logit' or 'tuned'; got 'fast'"),
    (lambda: check_exit_options("logit", 1.5, "full"), ["generate", "hi", "--threshold", "1.5"],
     "`threshold` must be in (0, 1]; got 1.5", "--threshold must be in (0, 1]; got 1.5"),
    (lambda: check_exit_options("logit", 0.9, "some"), ["generate", "hi", "--exit-test", "some"],
     "`test` must be 'full' or 'candidates'; got 'some'", "--exit-test must be 'full' or 'candidates'; got 'some'"),
    (lambda: check_prompt(" "), ["report", "--prompt", " "],
     "empty prompt: give some text with `prompt`", "empty prompt: give some text with --prompt"),
    (lambda: read_image("/nonexistent/x.png"), ["lens", "hi", "--image", "/nonexistent/x.png"],
     "`images`: no such file '/nonexistent/x.png'", "--image: no such file '/nonexistent/x.png'"),
    (lambda: resolve_lens_source("owner/repo@", "tuned"), ["lens", "hi", "--kind", "tuned", "--lens", "owner/repo@"],
     "`path` owner/repo@: an empty revision after '@'", "--lens owner/repo@: an empty revision after '@'"),
])
def test_a_python_caller_sees_the_parameter_the_cli_user_the_option(rule, argv, python, cli, capsys, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)  # `lens merge --out o` would write there
    with pytest.raises(BadInput) as e:
        rule()
    assert str(e.value) == python
    assert _cli_error(capsys, argv) == f"error: {cli}"  # before any model loads: the rule runs first


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("checks") / "m", tiny_tokenizer()))


@pytest.fixture(scope="module")
def m(tiny_dir):
    import vocablens

    return vocablens.load(tiny_dir)


def test_the_model_methods_name_their_parameters(m):
    for call, want in ((lambda: m.neighbors(["a"], k=0), "`k` must be at least 1; got 0"),
                       (lambda: m.score("some text", top_k=-1), "`top_k` must be >= 0; got -1"),
                       (lambda: m.argmax(bias="maybe"), "`bias` must be auto, on or off; got 'maybe'"),
                       (lambda: m.generate("hi", max_new_tokens=0), "`max_new_tokens` must be at least 1; got 0")):
        with pytest.raises(BadInput) as e:
            call()
        assert str(e.value) == want


def test_a_rule_that_needs_the_model_names_the_parameter_and_the_cli_the_option(m, tiny_dir, capsys):
    """k past the vocabulary is known once the model is loaded: the analysis says `k`, the CLI -k."""
    V, eligible = m.borders.real_vocab_size, int(m.borders.real_token_mask(exclude_untrained=True).sum())
    for call, argv, want in (
            (lambda: m.lens("hi", k=10**6), ["lens", "hi", "-k", str(10**6)],
             f"`k` must be an integer between 1 and V={V}; got 1000000"),
            (lambda: m.neighbors(["a"], k=10**6), ["neighbors", "a", "-k", str(10**6)],
             f"`k` must be between 1 and {eligible - 1} (the eligible rows); got 1000000"),  # less "a" itself
            (lambda: m.project(k=10**6), ["project", "-k", str(10**6)],
             f"`k` must be an integer between 1 and the vocabulary size {V}; got 1000000")):
        with pytest.raises(BadInput) as e:
            call()
        assert str(e.value) == want
        assert _cli_error(capsys, [*argv, "-m", tiny_dir]).splitlines()[-1] == "error: " + want.replace("`k`", "-k")


def test_a_tensor_parallel_load_outside_torchrun_names_tp(tiny_dir, capsys, monkeypatch):
    import vocablens

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(BadInput) as e:
        vocablens.load(tiny_dir, tp=True)
    assert str(e.value).startswith("`tp` splits one model over the processes torchrun starts: run it as `torchrun")
    assert _cli_error(capsys, ["lens", "hi", "-m", tiny_dir, "--tp"]) == "error: " + str(e.value).replace("`tp` ", "--tp ", 1)


def test_a_corpus_on_standard_input_names_corpus(tiny_dir, capsys, monkeypatch):
    import io
    import sys

    from vocablens.corpus import load_documents

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab\x80cd")))
    with pytest.raises(BadInput) as e:
        load_documents("-")
    assert str(e.value).startswith("`corpus` - (standard input): cannot read it as text: byte 0x80 at byte offset 2")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab\x80cd")))
    assert _cli_error(capsys, ["settle", "--corpus", "-", "-m", tiny_dir]) == \
        "error: " + str(e.value).replace("`corpus`", "--corpus")


def test_notes_name_the_parameter_to_python_and_the_option_on_the_command_line(tmp_path, capsys):
    """The library's notes as its messages: a float16 checkpoint run in float32 on the CPU says "`dtype`
    float16 keeps it" in Python and "--dtype float16 keeps it" on stderr and in ``--json``; special-token
    text says `special_text` in Python and ``--special-text`` to ``score``."""
    import json
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    import vocablens
    from vocablens.errors import VocabLensNote

    d = save_tiny(tmp_path / "m", tiny_tokenizer())
    AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16).save_pretrained(d, safe_serialization=True)
    m = vocablens.load(str(d))
    assert any(n.endswith("`dtype` float16 keeps it") for n in m.provenance.notes), m.provenance.notes
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m.score("<s> the")
    said = [str(w.message) for w in seen if issubclass(w.category, VocabLensNote)]
    assert any("(`special_text` plain reads them as ordinary text)" in s for s in said), said

    capsys.readouterr()
    assert run_app(["score", "<s> the", "-m", str(d), "--json"]) == 0
    out, err = capsys.readouterr()
    assert any(n.endswith("--dtype float16 keeps it") for n in json.loads(out)["model"]["notes"])
    assert "(--special-text plain reads them as ordinary text)" in err  # --json loads quietly: no load notes
    assert run_app(["score", "<s> the", "-m", str(d)]) == 0
    err = capsys.readouterr().err
    assert "--dtype float16 keeps it" in err and "`dtype`" not in err  # (the special-text note: once per process)
