"""The readout found by structure and checked on every whole load (issue 42, A and B).

Faults found: a final norm named outside a fixed list (BioGPT's ``biogpt.layer_norm``) was never
applied, and a logit multiplier whose config field means the opposite of another family's
(HyperCLOVA X multiplies by ``logits_scaling``, Granite divides) was applied upside down; vocablens
then printed figures off by hundreds of nats. Each is a tiny model here, saved as a user would."""

from __future__ import annotations

import json

import pytest
import torch

from tiny_dirs import run_cli, tiny_tokenizer
from vocablens.errors import UnsupportedArchitecture


def _tiny(model_type: str, V: int, **extra):
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    cfg = CONFIG_MAPPING[model_type]()
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, head_dim=16, vocab_size=V, max_position_embeddings=128,
                 bos_token_id=0, eos_token_id=1, pad_token_id=2)
    d = cfg.to_dict()
    for k, v in {**sizes, **extra}.items():
        if k in d or k in extra:
            setattr(cfg, k, v)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1 and a sharp head, so a missed norm or scale shows
        for n, p in m.named_parameters():
            if "norm" in n and p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
        m.get_output_embeddings().weight.mul_(20.0)
    return m


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("readout")
    out = {}
    for name, mt, extra in [("biogpt", "biogpt", {}), ("hyperclovax", "hyperclovax", {"logits_scaling": 3.0}),
                            ("llama", "llama", {})]:
        m = _tiny(mt, len(tok), **extra)
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))


def _own_logprobs(model, ids):
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids[None]).logits[0].double(), -1)
    return float(lp[torch.arange(len(ids) - 1), ids[1:]].sum())


@pytest.mark.parametrize("name", ["biogpt", "hyperclovax"])
def test_score_equals_the_models_own_logprobs(capsys, saved, tok, name):
    """``vocablens score`` == the model's own log-probabilities (was off by hundreds of nats)."""
    from transformers import AutoModelForCausalLM

    text = "The class statement defines a new type."
    code, out, err = run_cli(capsys, "score", text, "-m", saved[name], "--json", "--top-k", "0")
    assert code == 0, err
    got = json.loads(out)
    ids = torch.tensor(tok(text).input_ids)
    ref = _own_logprobs(AutoModelForCausalLM.from_pretrained(saved[name]).eval(), ids)
    assert got["total_logprob"] == pytest.approx(ref, abs=1e-3)
    assert got["model"]["readout"].startswith("checked: max |Δp| = ")


def test_norm_outside_the_name_list_is_found(saved):
    import vocablens
    from vocablens.models.borders import Borders

    lm = vocablens.load(str(saved["biogpt"]))
    assert Borders.from_model(lm.model).final_norm is None  # the names alone miss it
    assert lm.borders.final_norm is lm.model.biogpt.layer_norm
    assert lm.borders.unembedding.final_norm is lm.model.biogpt.layer_norm


def test_multiplier_read_off_the_model(saved):
    import vocablens

    lm = vocablens.load(str(saved["hyperclovax"]))
    assert lm.borders.logit_scale == pytest.approx(3.0, rel=1e-6)  # config: logits_scaling = 3, multiplied


def test_borders_only_load_uses_the_stored_check_or_says_unchecked(saved):
    import vocablens
    from vocablens.models.files.loader import load_mode

    first = load_mode(str(saved["llama"]), "borders").provenance.readout
    assert first.startswith("unchecked: loaded without the blocks")
    whole = vocablens.load(str(saved["llama"])).provenance.readout
    assert whole.startswith("checked: max |Δp| = ")
    assert load_mode(str(saved["llama"]), "borders").provenance.readout == whole  # the stored check's line
    hx = load_mode(str(saved["hyperclovax"]), "matrices")  # names give 1/3; the whole load stored 3
    assert hx.provenance.readout.startswith("unchecked")
    vocablens.load(str(saved["hyperclovax"]))
    assert load_mode(str(saved["hyperclovax"]), "borders").borders.logit_scale == pytest.approx(3.0, rel=1e-6)


def _patch_logits(monkeypatch, fn):
    from transformers.models.llama import modeling_llama

    orig = modeling_llama.LlamaForCausalLM.forward

    def forward(self, *a, **k):
        out = orig(self, *a, **k)
        out.logits = fn(out.logits)
        return out

    monkeypatch.setattr(modeling_llama.LlamaForCausalLM, "forward", forward)


def test_unexplained_map_refused_one_line_exit_2(capsys, monkeypatch, saved):
    """A map after the head that is not a constant multiple: the load fails, nothing is printed."""
    _patch_logits(monkeypatch, lambda z: z + torch.linspace(0, 8, z.shape[-1]))
    code, out, err = run_cli(capsys, "score", "The class", "-m", saved["llama"])
    assert code == 2 and out == "" and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error:") and "max |Δp| = " in line
    assert "a norm or map before the head that vocablens does not apply" in line


def test_constant_ratio_under_a_softcap_named_as_a_multiplier(monkeypatch):
    """A multiplier the readout does not know, behind a softcap (no ratio to read off the logits)."""
    from tiny_models import make_tiny
    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    m = make_tiny("gemma2")
    m.config.final_logit_softcapping = 1000.0  # a cap far above the logits: their ratio stays constant
    b2 = Borders.from_model(m).replace(logit_scale=0.5)  # half the multiplier the model applies (1.0)
    with pytest.raises(UnsupportedArchitecture, match="are 2 x vocablens's: a logit multiplier the config sets"):
        find_readout(b2)
