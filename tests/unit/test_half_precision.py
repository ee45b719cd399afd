"""A float16 checkpoint whose residual stream passes 65,504 (issue 44 fault 2): ``score`` printed
"total log-prob nan nats" and ``lens`` NaN on every layer, exit 0. Now a float16 checkpoint runs in
float32 on the CPU (a note in the provenance says so) and gives the float32 model's figures; with
``--dtype float16`` the first non-finite layer is one line, exit 2; no figure is ever NaN."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

TEXT = "The class statement defines"


@pytest.fixture(scope="module")
def half(tmp_path_factory):
    """(float16 dir, float32 reference model on the float16 weights, token ids [1, T])."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("half")
    tok = tiny_tokenizer()
    save_tiny(root / "f32", tok)
    m = AutoModelForCausalLM.from_pretrained(root / "f32", dtype=torch.float32)
    with torch.no_grad():  # block 1's FFN writes ~8e4 into the stream: past float16's 65,504
        mlp = m.model.layers[1].mlp
        mlp.gate_proj.weight.mul_(45.0)
        mlp.up_proj.weight.mul_(45.0)
        mlp.down_proj.weight.mul_(3000.0)
    m.half().save_pretrained(root / "f16")
    tok.save_pretrained(root / "f16")
    ref = AutoModelForCausalLM.from_pretrained(root / "f16", dtype=torch.float32).eval()
    ids = torch.tensor([tok(TEXT).input_ids])
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    block1 = []
    h = ref.model.layers[1].register_forward_hook(lambda _m, _a, o: block1.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        ref(ids)
    h.remove()
    assert float(block1[0].abs().max()) > 65_504  # the stream does pass float16's range
    assert torch.isfinite(out.logits).all()
    return root / "f16", ref, ids


def _floats(x):
    if isinstance(x, float):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _floats(v)
    elif isinstance(x, list):
        for v in x:
            yield from _floats(v)


def test_score_runs_float16_in_float32_and_equals_the_float32_model(half, capsys):
    d, ref, ids = half
    code, out, err = run_cli(capsys, "score", TEXT, "-m", d, "--json")
    assert code == 0, err
    got = json.loads(out)
    with torch.no_grad():
        lp = torch.log_softmax(ref(ids).logits[0].double(), -1)  # [T, V]
    want = float(lp[:-1].gather(1, ids[0, 1:, None]).sum())
    assert got["total_logprob"] == pytest.approx(want, rel=1e-5)
    assert all(math.isfinite(v) for v in _floats(got))
    assert got["model"]["dtype"] == "float32" and "float16" in got["model"]["notes"][-1]


def test_lens_figures_are_finite_and_the_last_layer_is_the_model(half, capsys):
    d, ref, ids = half
    code, out, err = run_cli(capsys, "lens", TEXT, "-m", d, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert all(math.isfinite(v) for v in _floats(got))
    assert got["model_max_abs_diff"] < 1e-4


@pytest.mark.parametrize("argv", [
    ["score", TEXT, "-m", "{m}", "--dtype", "float16"],
    ["--dtype", "float16", "lens", TEXT, "-m", "{m}"],
    ["lens", TEXT, "-m", "{m}", "--dtype=auto", "--json"],
], ids=["score", "lens-before", "lens-auto-json"])
def test_float16_on_the_cpu_is_one_line_naming_the_layer(argv, half, capsys):
    d, _, _ = half
    code, out, err = run_cli(capsys, *[a.replace("{m}", str(d)) for a in argv])
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and out == "", (code, out, err)
    assert "layer 2 of the residual stream (block 1's output)" in errors[0] and "65,504" in errors[0], errors[0]
    assert "nan" not in (out + err).lower().replace("or nan", "")


def test_the_library_load_and_the_dtype_option(half):
    from vocablens.cli.global_options import take_dtype
    from vocablens.errors import BadInput, NonFiniteActivations
    from vocablens.models import load

    d, _, ids = half
    lm = load(d)
    assert lm.borders.W_E.dtype == torch.float32 and lm.provenance.dtype == "float32" and lm.provenance.notes
    lm16 = load(d, dtype="auto")
    assert lm16.borders.W_E.dtype == torch.float16 and lm16.provenance.notes == ()
    with pytest.raises(NonFiniteActivations, match="layer 2"):
        lm16.borders.residual_stream(ids)
    assert take_dtype(["--dtype", "bf16", "score", "x"]) == (["score", "x"], "bf16")
    assert take_dtype(["score", "x", "--dtype=float16"]) == (["score", "x"], "float16")
    # anatomy's own --dtype (the logits') stays with it; the weights' goes before its name
    assert take_dtype(["--dtype", "float16", "anatomy", "--dtype", "bfloat16"]) == (
        ["anatomy", "--dtype", "bfloat16"], "float16")
    with pytest.raises(BadInput, match="--dtype"):
        take_dtype(["score", "x", "--dtype", "f8"])
