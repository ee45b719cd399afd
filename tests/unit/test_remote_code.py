"""A model's own code runs only with --trust-remote-code (issue 44 fault 1).

A model directory whose ``config.json`` names an unknown ``model_type`` and an ``auto_map`` to a
local ``configuration_*.py``: without the flag, ``anatomy``, ``neighbors``, ``lens`` and ``project``
showed transformers' "Do you wish to run the custom code? [y/N]" prompt, and ``echo y |`` imported the
file. Now: one line naming the flag, exit 2, no prompt, and the file is never imported (it writes a
marker file when it is)."""

from __future__ import annotations

import ast
import io
import json
import sys
from pathlib import Path

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

CODE = """import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("{name} ran")
from transformers import PretrainedConfig


class VlCustomConfig(PretrainedConfig):
    model_type = "vlcustom"
"""


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    """A tiny llama's weights and tokenizer under a config that names its own code."""
    d = tmp_path_factory.mktemp("custom") / "m"
    save_tiny(d, tiny_tokenizer())
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "vlcustom"
    cfg["architectures"] = ["VlCustomForCausalLM"]
    cfg["auto_map"] = {"AutoConfig": "configuration_vlcustom.VlCustomConfig",
                       "AutoModelForCausalLM": "modeling_vlcustom.VlCustomForCausalLM"}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "configuration_vlcustom.py").write_text(CODE.format(name="configuration"))
    (d / "modeling_vlcustom.py").write_text(CODE.format(name="modeling"))
    return d


@pytest.mark.parametrize("argv", [
    ["anatomy", "{m}"],
    ["anatomy", "{m}", "--load"],
    ["neighbors", "-m", "{m}", "the"],
    ["lens", "The class", "-m", "{m}"],
    ["project", "-m", "{m}"],
    ["project", "-m", "{m}", "--block", "0"],
    ["score", "The class", "-m", "{m}"],
    ["generate", "The class", "-m", "{m}", "-n", "2"],
    ["argmax", "-m", "{m}"],
], ids=lambda a: "-".join(x for x in a if not x.startswith("{") and " " not in x))
def test_no_prompt_and_the_code_is_never_imported(argv, custom, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 8))   # `echo y | vocablens ...`
    code, out, err = run_cli(capsys, *[a.replace("{m}", str(custom)) for a in argv])
    assert "Do you wish" not in out + err and "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and out == "", (code, out, err)
    assert "configuration_vlcustom.py" in errors[0] and "--trust-remote-code" in errors[0], errors[0]
    assert not (custom / "IMPORTED").exists(), "the model's own code ran"
    assert sys.stdin.read() == "y\n" * 8, "something read the terminal"


def test_load_config_refuses_and_a_known_model_type_needs_no_code(custom, tmp_path):
    from vocablens.errors import BadInput
    from vocablens.models.files.config import load_config
    from vocablens.models.files.remote_code import needs_remote_code

    with pytest.raises(BadInput, match="`trust_remote_code`"):  # the Python argument (the CLI says --trust-remote-code)
        load_config(custom)
    assert needs_remote_code(custom) == "configuration_vlcustom.py"
    # a known model_type with an auto_map loads with transformers' own class: nothing to refuse
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {
        "AutoConfig": "configuration_x.XConfig"}}))
    assert needs_remote_code(tmp_path) is None
    assert load_config(tmp_path).model_type == "llama"
    assert not (custom / "IMPORTED").exists()


def test_every_auto_class_call_names_trust_remote_code():
    """Left unset, transformers asks on the terminal; every Auto*.from_pretrained / from_config call in
    src/ passes ``trust_remote_code`` (the user's flag, or False)."""
    src = Path(__file__).resolve().parents[2] / "src" / "vocablens"
    missing = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("from_pretrained", "from_config")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.startswith("Auto")):
                continue
            named = {k.arg for k in node.keywords}
            if "trust_remote_code" not in named and None not in named:  # None: **kw, checked by the test above
                missing.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not missing, missing
    assert len(list(src.rglob("*.py"))) > 50
