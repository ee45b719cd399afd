"""Every ``--json`` has one schema whatever the size of its input (issue 23, item 5).

Each command with ``--json`` (the list below is checked against ``vocablens --help`` and each
subcommand's help) runs twice, with the smallest input it takes (one token, one position, one model,
one vector, ...) and with a larger one; the key sets must be equal at every level. Lists compare the
union of their elements' keys (an empty list fits any list), and null fits anything (a nullable field).
Failed before: ``lens --positions all --json`` on one position had flat layer entries and no
``positions``; ``anatomy --json`` was one object for one model and ``{"models": [...]}`` for several;
``steer --json`` left out ``suppress`` from ``mass_*`` without ``--suppress``; ``bottleneck --json``'s
variance shares lost their top-k keys past N.

Tiny random models (tests/tiny_dirs.py) keep this fast; the real model only for the reported lens bug.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

LEAF = "leaf"


def shape(x):
    """The schema of a JSON value: dict -> {key: schema}; list -> [merged schema of its elements] (or
    ``[]`` when empty); null -> None; anything else -> ``"leaf"``."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        merged = None
        for v in x:
            merged = merge(merged, shape(v))
        return [] if merged is None else [merged]
    return None if x is None else LEAF


def merge(a, b):
    """Union of two schemas (None and [] give way to the other)."""
    if a is None or a == []:
        return b
    if b is None or b == []:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge(a.get(k), b.get(k)) if k in a and k in b else a.get(k, b.get(k)) for k in a | b}
    if isinstance(a, list) and isinstance(b, list):
        return [merge(a[0], b[0])]
    return a


def differences(a, b, path: str = "$") -> list[str]:
    """Where two schemas differ: a key on one side only, or a dict/list/leaf mismatch (null and an
    empty list fit anything)."""
    if a is None or b is None or a == [] or b == []:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in the {'small' if k in a else 'large'} input's JSON" for k in sorted(a.keys() ^ b.keys())]
        for k in sorted(a.keys() & b.keys()):
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        return differences(a[0], b[0], path + "[]")
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} in one, {type(b).__name__} in the other"]
    return []


def test_the_comparison_itself_finds_the_old_lens_shape():
    """The oracle can fail: the one-position lens JSON of before (flat layer entries) differs from
    the many-position one; equal shapes, empty lists and nulls pass."""
    many = {"layers": [{"layer": 0, "positions": [{"position": 0, "entropy": 1.0}]}]}
    flat = {"layers": [{"layer": 0, "position": 0, "entropy": 1.0}]}
    assert differences(shape(flat), shape(many)) == [
        "$.layers[].entropy: only in the small input's JSON", "$.layers[].position: only in the small input's JSON",
        "$.layers[].positions: only in the large input's JSON"]
    assert differences(shape({"a": [], "b": None, "c": [{"x": 1}]}), shape({"a": [{"k": 1}], "b": {"z": 2}, "c": [{"x": 2}]})) == []
    assert differences(shape({"a": {"x": 1}}), shape({"a": [1]})) == ["$.a: dict in one, list in the other"]


# ----------------------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("json-shapes")
    tok = tiny_tokenizer()
    a, b = save_tiny(root / "a", tok), save_tiny(root / "b", tok, seed=1)
    corpus = root / "corpus.txt"
    corpus.write_text(("The value of x is a number. " * 40 + "\n") * 6)
    (root / "normal.txt").write_text("\n".join(f"The value {i} is a number" for i in range(6)))
    (root / "one.txt").write_text("odd text here")
    (root / "three.jsonl").write_text('{"text": "a b", "label": 0}\n{"text": "zz", "label": 1}\n'
                                      '{"text": "The value", "label": 0}\n')
    from vocablens.cli.common import run_app  # a tuned lens of A for lens eval and lens --kind both

    assert run_app(["lens", "train", "--corpus", str(corpus), "--out", str(root / "lens0"), "--max-tokens", "64",
                    "--steps", "1", *TRAIN, "-m", str(a), "--json"]) == 0
    assert run_app(["lens", "fit-jacobian", "--corpus", str(corpus), "--out", str(root / "lens0"), *JFIT,  # beside it
                    "--max-tokens", "16", "-m", str(a), "--json"]) == 0
    for i in (1, 2):  # two shards of one fit, for lens merge
        assert run_app(["lens", "fit-jacobian", "--corpus", str(corpus), "--out", str(root / f"shard{i}"), *JFIT,
                        "--max-tokens", "16", "--shard", f"{i}/2", "-m", str(a), "--json"]) == 0
    return {"A": str(a), "B": str(b), "corpus": str(corpus), "root": root}


LONG = "The value of x is a number"
TRAIN = ["--seq-len", "16", "--tokens-per-step", "32", "--val-fraction", "0.2"]
JFIT = ["--seq-len", "8", "--skip-first", "2", "--val-fraction", "0.2", "--dim-batch", "16"]

#: command -> (small input, large input); {A} {B} {corpus} {root} are filled in from the fixture.
#: The tiny tokenizer prepends <s>, so a one-word prompt is one token after it (" the", " is" are
#: single tokens of it); lens varies the positions read (one vs all).
CASES = {
    "anatomy": (["{A}"], ["{A}", "{B}"]),
    "neighbors": ([" the", "-m", "{A}"], [" the", " is", " a", "-m", "{A}"]),
    "project --token": (["--token", " the", "-m", "{A}"], ["--token", " the", "--token", " is", "-m", "{A}"]),
    "project --neuron": (["--block", "0", "--neuron", "1", "-m", "{A}"], ["--block", "0", "--neuron", "1,2,3", "-m", "{A}"]),
    "project --interpretable": (["--interpretable", "1", "-m", "{A}"], ["--interpretable", "3", "-m", "{A}"]),
    "project --head": (["--block", "0", "--head", "1", "-k", "1", "-m", "{A}"], ["--block", "1", "--head", "0", "-k", "4", "-m", "{A}"]),
    "explain": ([" the", "-m", "{A}"], [LONG, "-m", "{A}"]),
    "score": ([" the", "-m", "{A}"], [LONG, "-m", "{A}"]),
    "generate": ([" the", "-n", "1", "-m", "{A}"], [LONG, "-n", "4", "-m", "{A}"]),
    "lens": ([" the", "--positions", "all", "-m", "{A}"], [LONG, "--positions", "all", "-m", "{A}"]),
    "lens --file": (["--file", "{root}/one.txt", "-m", "{A}"], ["--file", "{root}/normal.txt", "--positions", "all", "-m", "{A}"]),
    "lens --file --kind both": (["--file", "{root}/one.txt", "--kind", "both", "--lens", "{root}/lens0", "-m", "{A}"],
                                ["--file", "{root}/normal.txt", "--kind", "both", "--lens", "{root}/lens0", "-m", "{A}"]),
    "lens --kind both": ([LONG, "--positions", "1", "--kind", "both", "--lens", "{root}/lens0", "-m", "{A}"],
                         [LONG, "--positions", "all", "--kind", "both", "--lens", "{root}/lens0", "-m", "{A}"]),
    "lens --kind logit,tuned,jacobian": (
        [LONG, "--positions", "1", "--kind", "logit,tuned,jacobian", "--lens", "{root}/lens0", "-m", "{A}"],
        [LONG, "--positions", "all", "--kind", "logit,tuned,jacobian", "--lens", "{root}/lens0", "-m", "{A}"]),
    "lens backward": ([" the", "--target", " is", "-m", "{A}"], [LONG, "--target", " is", "-k", "3", "-m", "{A}"]),
    "lens fit-jacobian": (["--corpus", "{corpus}", "--out", "{root}/j1", "--max-tokens", "8", *JFIT, "-m", "{A}"],
                          ["--corpus", "{corpus}", "--out", "{root}/j2", "--max-tokens", "24", *JFIT, "-m", "{A}"]),
    "lens decompose": ([" the", "--layer", "1", "-k", "1", "--lens", "{root}/lens0", "-m", "{A}"],
                       [LONG, "--layer", "1", "-k", "3", "--lens", "{root}/lens0", "-m", "{A}"]),
    "lens merge": (["{root}/shard1", "{root}/shard2", "--out", "{root}/merged1"],
                   ["{root}/shard1", "{root}/shard2", "--out", "{root}/merged2", "--save-dtype", "float32"]),
    "align": (["{A}", "{B}", "--blocks-a", "0", "--blocks-b", "0", "--top", "1"], ["{A}", "{B}", "--top", "5"]),
    "steer": (["--promote", " the", "--top-n", "1", "--new-tokens", "1", "--prompt", " the", "-m", "{A}"],
              ["--promote", " the", "--promote", " is", "--suppress", " a", "--new-tokens", "3", "--prompt", LONG, "-m", "{A}"]),
    "settle": (["--corpus", "{corpus}", "--max-tokens", "4", "--seq-len", "2", "--thresholds", "0.5", "-m", "{A}"],
               ["--corpus", "{corpus}", "--max-tokens", "64", "--seq-len", "16", "-m", "{A}"]),
    "bottleneck": (["--contexts", "80", "-m", "{A}"], ["-m", "{A}"]),
    "argmax": (["--budget", "0.001", "-m", "{A}"], ["-m", "{A}"]),
    "expand": (["--add", " vocablens", "--out", "{root}/e1", "--eval-text", "The value", "-m", "{A}"],
               ["--add", " vocablens", "--add", " foobar", "--out", "{root}/e2", "--eval-text", LONG * 3, "-m", "{A}"]),
    "trim": (["--corpus", "{corpus}", "--out", "{root}/t1", "--verify-texts", "1", "--verify-tokens", "2", "-m", "{A}"],
             ["--corpus", "{corpus}", "--out", "{root}/t2", "-m", "{A}"]),
    "trim --drop-undertrained": (["--corpus", "{corpus}", "--out", "{root}/t3", "--drop-undertrained",
                                  "--undertrained-candidates", "1", "-m", "{A}"],
                                 ["--corpus", "{corpus}", "--out", "{root}/t4", "--drop-undertrained",
                                  "--undertrained-candidates", "6", "-m", "{A}"]),
    "lens train": (["--corpus", "{corpus}", "--out", "{root}/lens1", "--max-tokens", "64", "--steps", "1", *TRAIN, "-m", "{A}"],
                   ["--corpus", "{corpus}", "--out", "{root}/lens2", "--max-tokens", "256", "--steps", "3", *TRAIN, "-m", "{A}"]),
    "lens eval": (["--corpus", "{corpus}", "--lens", "{root}/lens0", "--split", "all", "--seq-len", "16", "--max-tokens", "16", "-m", "{A}"],
                  ["--corpus", "{corpus}", "--lens", "{root}/lens0", "--split", "all", "--seq-len", "16", "--max-tokens", "200", "-m", "{A}"]),
    "lens eval --kind logit,tuned,jacobian": (
        ["--corpus", "{corpus}", "--lens", "{root}/lens0", "--kind", "logit,tuned,jacobian", "--split", "all",
         "--seq-len", "16", "--max-tokens", "16", "-m", "{A}"],
        ["--corpus", "{corpus}", "--lens", "{root}/lens0", "--kind", "logit,tuned,jacobian", "--split", "all",
         "--seq-len", "16", "--max-tokens", "200", "-m", "{A}"]),
    "lens anomaly": (["--normal", "{root}/normal.txt", "--test", "{root}/one.txt", "--kind", "logit", "-m", "{A}"],
                     ["--normal", "{root}/normal.txt", "--test", "{root}/three.jsonl", "--kind", "logit", "-m", "{A}"]),
    "undertrained": (["--candidates", "1", "-m", "{A}"], ["--candidates", "6", "-m", "{A}"]),
    "report": (["--prompt", " the", "--out", "{root}/r1.html", "--budget", "3", "-m", "{A}"],
               ["--prompt", LONG, "--out", "{root}/r2.html", "--budget", "3", "-m", "{A}"]),
}


def _json_commands() -> set[str]:
    """Every command (and ``lens`` subcommand) whose help lists ``--json``, from the CLI itself."""
    from typer.main import get_command

    from vocablens.cli import app

    group = get_command(app)
    found = set()

    def walk(cmd, prefix):
        if hasattr(cmd, "list_commands"):  # a group: what its `--help` lists under Commands
            ctx = type(cmd).context_class(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*prefix, name])
        if any("--json" in p.opts for p in cmd.params):
            found.add(" ".join(prefix).replace(" show", ""))

    walk(group, [])
    return found


def test_every_json_command_is_covered():
    """The cases cover every command whose help offers --json (a new one must be added above)."""
    covered = {c.split(" --")[0] for c in CASES}
    assert _json_commands() == covered


@pytest.mark.parametrize("case", list(CASES))
def test_one_schema_whatever_the_input_size(case, tiny, capsys):
    cmd = case.split(" --")[0].split()
    outs = []
    for args in CASES[case]:
        argv = [*cmd, *[re.sub(r"\{(\w+)\}", lambda m: str(tiny[m.group(1)]), a) for a in args], "--json"]
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, (argv, err[-600:])
        outs.append(json.loads(out))
    for o in outs:  # report's cut_short maps a section id to why it was cut: which ones depends on the
        if isinstance(o.get("cut_short"), dict):  # machine's load under --budget (data, not schema)
            o["cut_short"] = [[k, v] for k, v in o["cut_short"].items()]
    assert differences(shape(outs[0]), shape(outs[1])) == []


# -------------------------------------------------------------------------------- the real model
@pytest.mark.parametrize("argv", [["lens", "--positions", "all", "--kind", "both"], ["explain"]])
def test_real_model_one_token_prompt_has_the_schema_of_five(cli, argv):
    """The reported case: SmolLM2 (no BOS), ' Paris' is one token; ``lens --positions all --json``
    read it with flat layer entries and no ``positions`` (the explorer then failed on
    ``.positions[p]``)."""
    outs = []
    for prompt in (" Paris", "The capital of France is"):
        code, out, err = cli(argv[0], prompt, *argv[1:], "--json")
        assert code == 0, err
        outs.append(json.loads(out))
    assert len(outs[0]["tokens"] if "tokens" in outs[0] else outs[0]["logit"]["tokens"]) == 1
    assert differences(shape(outs[0]), shape(outs[1])) == []
    if argv[0] == "lens":
        one = outs[0]["logit"]["layers"][-1]
        assert one["layer"] == 30 and [p["position"] for p in one["positions"]] == [0]


def test_one_json_conversion_for_cli_and_explorer(capsys):
    """``--json`` (cli.common.emit_json) and the explorer (serve.adapters.clean) convert through the one
    function in render/json.py: NaN/inf -> null, tensors and numpy scalars -> numbers, tuples -> lists,
    keys -> strings, non-ASCII kept; the text is strict JSON (no NaN token) with one trailing newline."""
    import math

    import numpy as np
    import torch

    from vocablens.cli.common import emit_json
    from vocablens.render.json import json_ready
    from vocablens.serve.adapters import clean

    obj = {1: (float("nan"), torch.tensor([1.5, -2.0])), "n": torch.tensor(3), "x": np.float32(0.25),
           "inf": [-math.inf, math.inf], "é": "ü", "none": None}
    expected = {"1": [None, [1.5, -2.0]], "n": 3, "x": 0.25, "inf": [None, None], "é": "ü", "none": None}
    assert json_ready(obj) == expected
    assert clean(obj) == expected
    emit_json(obj)
    text = capsys.readouterr().out
    assert text == json.dumps(expected, indent=2, ensure_ascii=False) + "\n"

    def no_constants(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    assert json.loads(text, parse_constant=no_constants) == expected
