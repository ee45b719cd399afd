"""The head-only load (``load_mode(..., "head")``, what ``argmax`` reads): its tensors can be written
without crashing the process, and its final norm is the family's own transformers module, so its
readout equals the whole model's logits in every family, RMSNorm, Gemma's (1 + w) and LayerNorm alike."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_lazy import _write_tokenizer
from tiny_models import make_tiny

# gemma: (1 + w) RMSNorm; gemma3_text: + softcap; gpt2/opt/falcon: LayerNorm with bias; cohere: LayerNorm
# without bias; olmo2, granite (logit scale), cohere, gemma, gpt2 ...: families the old RMSNorm list missed
FAMILIES = ["llama", "gemma", "gemma3_text", "gpt2", "opt", "olmo2", "cohere", "granite", "falcon"]


def _save(family: str, d: Path):
    model = make_tiny(family)
    model.save_pretrained(d, safe_serialization=True)
    _write_tokenizer(d, model.config.vocab_size)
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    return request.param, _save(request.param, d), d


def test_head_only_readout_equals_the_models_logits(saved):
    from vocablens.models.files.final_norm import FamilyNorm
    from vocablens.models.files.loader import load_mode
    from vocablens.models.files.matrices_only import MatricesOnly

    family, model, d = saved
    lm = load_mode(str(d), "head")
    assert isinstance(lm.model, MatricesOnly), family        # read without building the model
    norm = lm.borders.final_norm
    assert isinstance(norm, FamilyNorm)
    ids = torch.tensor([[3, 17, 42, 5, 90, 11]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        own = out.logits[0]
        # the last block's output, before the final norm: transformers' last hidden state is after it
        full = load_mode(str(d), "full").borders
        resid, logits = full.residual_stream(ids)
        assert torch.allclose(logits[0].float(), own, atol=1e-5, rtol=1e-5)
        got = lm.borders.unembedding(resid[full.n_layers][0])
    # the family's own class does the norm: the one the whole model holds
    assert type(norm.family_module()) is type(full.final_norm), family
    assert got.shape == own.shape
    assert torch.allclose(got, own, atol=1e-5, rtol=1e-5), (family, float((got - own).abs().max()))


def test_a_head_only_norm_reads_the_family_default_eps(tmp_path):
    """No ``rms_norm_eps`` in the config: the family's class takes its default, as the whole model does
    (the old copy of RMSNorm refused such a config)."""
    from vocablens.models.files.loader import load_mode

    _save("olmo2", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rms_norm_eps"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    head, full = load_mode(str(tmp_path), "head").borders, load_mode(str(tmp_path), "full").borders
    x = torch.randn(4, head.d_model, generator=torch.Generator().manual_seed(0)) * 0.01  # eps shows at small norms
    assert torch.equal(head.final_norm(x), full.final_norm(x))



def test_norm_bounds_reuse_the_family_modules_form_without_building_it(tmp_path, monkeypatch):
    """argmax's final-norm bounds on a head-only load keep the form the family's module gave
    (``stored="readwrite"``); a later load reads it back without building that module (so without
    importing the family's modeling code), and every bound equals the borders load's, whose norm is
    the model's own module."""
    from vocablens.argmax.model import argmax_for_borders
    from vocablens.argmax.stored import norm_key
    from vocablens.models.files.loader import load_mode

    family = "gpt2"                                           # a LayerNorm with bias: centred, a shift
    monkeypatch.setenv("VOCABLENS_ARGMAX_CACHE", str(tmp_path / "store"))
    d = tmp_path / family
    _save(family, d)
    ref = argmax_for_borders(load_mode(str(d), "borders").borders, norm_tokens=2, stored="readwrite")
    assert not list((tmp_path / "store").glob("norm-*"))      # the model's own module: nothing to keep
    first = load_mode(str(d), "head").borders
    a = argmax_for_borders(first, norm_tokens=2, stored="readwrite")
    assert first.final_norm.built and len(list((tmp_path / "store").glob("norm-*.safetensors"))) == 1
    again = load_mode(str(d), "head").borders
    b = argmax_for_borders(again, norm_tokens=2, stored="read")
    assert not again.final_norm.built                         # read back: the family's module never built
    assert ref.reach.model.centred and bool(ref.reach.model.shift.any())
    for r in (a, b):
        assert r.norm_note == ref.norm_note and torch.equal(r.result.verdict, ref.result.verdict)
        for f in ("gain", "shift"):
            assert torch.equal(getattr(r.reach.model, f), getattr(ref.reach.model, f)), f
        for f in ("tokens", "p_lower", "p_upper", "margin_lower", "margin_upper", "argmaxable", "u"):
            assert torch.equal(getattr(r.reach, f), getattr(ref.reach, f)), f
    # what decides the module (the config: here its epsilon) or a parameter's bits changed: another key
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "layer_norm_epsilon": cfg["layer_norm_epsilon"] * 2}))
    changed = load_mode(str(d), "head").borders.final_norm
    assert norm_key(changed) != norm_key(again.final_norm)
    with torch.no_grad():
        changed.weight[0] = torch.nextafter(changed.weight[0], changed.weight[0] + 1)
    assert norm_key(changed) != norm_key(load_mode(str(d), "head").borders.final_norm)
    assert norm_key(load_mode(str(d), "borders").borders.final_norm) is None

_WRITER = r"""
import json, sys, torch
from vocablens.models.files.loader import load_mode
out = {}
for mode in ("head", "matrices", "borders", "streaming", "full"):
    lm = load_mode(sys.argv[1], mode, max_memory="30kB" if mode == "streaming" else None)
    errors, written = [], 0
    seen = set()
    for name, t in [*lm.model.named_parameters(), *lm.model.named_buffers()]:
        if t.is_meta or id(t) in seen or not t.is_floating_point():
            continue
        seen.add(id(t))
        try:
            with torch.no_grad():
                t.add_(1.0)
            written += 1
        except Exception as e:  # a clear Python error is allowed; a crash is not
            errors.append(f"{name}: {type(e).__name__}: {e}")
    out[mode] = {"written": written, "errors": errors, "W_U_00": float(lm.borders.unembedding.weight[0, 0])}
print(json.dumps(out))
"""


def test_writing_into_every_loaded_tensor_never_crashes_the_process(tmp_path):
    """Each load mode's tensors, written in place in a child process: the child must end normally
    (a write into a read-only mapping was SIGSEGV, killing it), each write either works (a
    copy-on-write page) or is a one-line Python error, and the checkpoint file is left unchanged."""
    model = _save("llama", tmp_path)
    f = tmp_path / "model.safetensors"
    before = hashlib.sha256(f.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2] / "src"),
                                                                     os.environ.get("PYTHONPATH", "")] if p)}
    r = subprocess.run([sys.executable, "-c", _WRITER, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, f"the child died (code {r.returncode}): {r.stderr[-2000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    W = model.lm_head.weight.detach()
    for mode, got in res.items():
        assert all("\n" not in e for e in got["errors"]), mode
        assert got["written"] >= 2 and not got["errors"], (mode, got["errors"])   # the head and the embedding
        assert got["W_U_00"] == pytest.approx(float(W[0, 0]) + 1.0, abs=1e-6), mode  # the write took, in memory
    assert hashlib.sha256(f.read_bytes()).hexdigest() == before                   # never in the file
