"""Checkpoints quantized by transformers' quantizers (issue 49 C), quantized here, in the test, by the
quantizers that run on the CPU: torchao int8 weight-only (saved by transformers and loaded back, the
LM head quantized too) and optimum-quanto int8 (not serializable by transformers: quantized on load,
checked in memory). bitsandbytes 4-bit runs on CUDA only (its test below needs a GPU).

Oracles, each independent of vocablens: the quantized model's own logits (transformers' forward on
the quantized weights, through the quantizer's kernels); the bytes of the tensors in the saved file
(``safetensors``) and the float checkpoint's tensor count; the quantizer's own ``dequantize()``; and a
float twin of the checkpoint (its weights dequantized by torchao, saved as float32), on which
``neighbors`` and ``argmax`` must give the same answers as on the quantized checkpoint.
"""

from __future__ import annotations

import json

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer


def _file_bytes_and_numel(d) -> tuple[int, int]:
    """(bytes, elements) of every tensor in ``d/model.safetensors``, read with safetensors."""
    from safetensors import safe_open

    nbytes = numel = 0
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            nbytes += t.numel() * t.element_size()
            numel += t.numel()
    return nbytes, numel


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """``fp``: a tiny float32 llama; ``ao``: it quantized by torchao (int8 weight-only, LM head too),
    saved by transformers; ``twin``: the ``ao`` weights dequantized by torchao, saved as float32."""
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoConfig, AutoModelForCausalLM, TorchAoConfig

    root = tmp_path_factory.mktemp("quantized")
    tok = tiny_tokenizer()
    fp = save_tiny(root / "fp", tok)
    q = TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=True, untie_embedding_weights=False)
    qm = AutoModelForCausalLM.from_pretrained(fp, quantization_config=q, dtype=torch.float32)
    assert type(qm.lm_head.weight).__name__ == "Int8Tensor"  # the head itself is stored quantized
    qm.save_pretrained(root / "ao", safe_serialization=True)
    tok.save_pretrained(root / "ao")
    twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(fp), dtype=torch.float32)
    twin.load_state_dict({n: p.detach().dequantize().clone() for n, p in qm.named_parameters()})
    twin.save_pretrained(root / "twin", safe_serialization=True)
    tok.save_pretrained(root / "twin")
    return {"fp": fp, "ao": root / "ao", "twin": root / "twin", "tok": tok}


@pytest.fixture(scope="module")
def ao(dirs):
    import vocablens

    return vocablens.load(dirs["ao"])


def test_torchao_checkpoint_loads_and_passes_the_readout_check(ao):
    assert type(ao.model.lm_head.weight).__name__ == "Int8Tensor"  # the model runs on its quantized weights
    p = ao.provenance
    assert p.readout.startswith("checked:"), p.readout
    assert p.quantization == "torchao Int8WeightOnlyConfig" and p.dequantized
    assert p.tensor_types == {"embedding": "float32", "lm_head": "Int8Tensor", "blocks": "Int8Tensor"}
    assert "dequantized" in p.describe()


def test_matrices_read_dequantized_by_the_quantizer(ao):
    assert type(ao.borders.unembedding.weight) is torch.Tensor
    assert torch.equal(ao.borders.unembedding.weight, ao.model.lm_head.weight.dequantize())
    from vocablens.models.blocks.view import linear_weight

    down = ao.model.model.layers[1].mlp.down_proj
    assert torch.equal(linear_weight(down), down.weight.dequantize())


def test_score_and_lens_equal_the_quantized_models_own_logits(ao, dirs):
    from transformers import AutoModelForCausalLM

    ids = dirs["tok"]("the cat sat on the mat, and then it slept", return_tensors="pt").input_ids[0]
    ref_model = AutoModelForCausalLM.from_pretrained(dirs["ao"])  # transformers alone, same quantized file
    with torch.no_grad():
        ref = ref_model(ids[None]).logits[0].double().log_softmax(-1)
    want = ref[:-1].gather(1, ids[1:, None])[:, 0]
    got = ao.score(ids).value.logprobs.double()
    assert (got - want).abs().max() < 1e-4
    from vocablens.lens.logit import logit_lens

    assert logit_lens(ao.borders, ids).model_max_abs_diff < 1e-5  # layer L against the model's own forward


def test_anatomy_counts_stored_bytes_and_logical_parameters(ao, dirs, capsys):
    code, out, _ = run_cli(capsys, "anatomy", "--load", "-m", dirs["ao"], "--json")
    assert code == 0
    a = json.loads(out)["models"][0]
    stored, _ = _file_bytes_and_numel(dirs["ao"])  # int8 values, float32 scales, int8 zero points
    _, logical = _file_bytes_and_numel(dirs["fp"])  # the float checkpoint: one element per parameter
    assert a["stored_bytes"] == stored and a["params_total"] == logical
    assert a["stored_as"] == "torchao Int8WeightOnlyConfig"
    assert stored < 4 * logical / 2  # int8 storage: far below float32's bytes


@pytest.mark.parametrize("argv", [("neighbors", "the", "cat", "-k", "5"), ("argmax", "--no-norm"),
                                  ("undertrained", "--no-verify")])
def test_matrix_analyses_equal_the_dequantized_float_twin(dirs, capsys, monkeypatch, argv):
    monkeypatch.setenv("VOCABLENS_ARGMAX_CACHE", "off")  # each answer computed afresh, none stored for the other
    code, out_q, err = run_cli(capsys, *argv, "-m", dirs["ao"], "--json")
    assert code == 0, err
    if argv[0] == "neighbors":  # a read of the matrices alone loads a quantized checkpoint whole, and says so
        assert "is quantized (torchao Int8WeightOnlyConfig)" in err
    code, out_f, _ = run_cli(capsys, *argv, "-m", dirs["twin"], "--json")
    assert code == 0
    q, f = json.loads(out_q), json.loads(out_f)
    prov = q.pop("model", None) or q.pop("provenance")
    f.pop("model", None) or f.pop("provenance")
    assert prov["dequantized"] and prov["tensor_types"]["lm_head"] == "Int8Tensor"
    assert _answers(q) == _answers(f)


def _answers(d):
    """``d`` without its wall times (they differ between runs; the answers must not)."""
    if isinstance(d, dict):
        return {k: _answers(v) for k, v in d.items() if not k.startswith("timing") and k not in ("elapsed_s", "seconds")}
    return [_answers(v) for v in d] if isinstance(d, list) else d


def test_edits_of_quantized_weights_are_refused_in_one_line(dirs, capsys, tmp_path):
    code, _, err = run_cli(capsys, "expand", "--add", " zzqxw", "-o", tmp_path / "x", "-m", dirs["ao"])
    assert code == 2
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        "error: expand writes the model's weights, which are stored quantized (torchao Int8WeightOnlyConfig): "
        "edit a float checkpoint instead"]
    assert not (tmp_path / "x").exists()


def test_quanto_int8_in_memory(dirs):
    """optimum-quanto quantizes a float checkpoint on load (transformers cannot save it): the borders,
    the readout check, the lens and anatomy's bytes, on the quantized model in memory."""
    from transformers import AutoModelForCausalLM, QuantoConfig

    from vocablens.accounting.anatomy import anatomy
    from vocablens.lens.logit import logit_lens
    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    qm = AutoModelForCausalLM.from_pretrained(dirs["fp"], quantization_config=QuantoConfig(weights="int8"))
    qm.eval()
    w = qm.model.layers[0].mlp.up_proj.weight
    assert type(w).__name__ == "WeightQBytesTensor"
    b, check = find_readout(Borders.from_model(qm, tokenizer=dirs["tok"]))
    assert check.max_dp <= check.tolerance
    ids = dirs["tok"]("one two three four", return_tensors="pt").input_ids[0]
    assert logit_lens(b, ids).model_max_abs_diff < 1e-5
    want = 0
    for p in qm.parameters():  # quanto's own parts: int8 values and float scales
        parts = (p._data, p._scale) if type(p).__name__ == "WeightQBytesTensor" else (p,)
        want += sum(t.numel() * t.element_size() for t in parts)
    for name, t in qm.named_buffers():  # QLinear's activation scales, saved with the weights
        if name.endswith(("input_scale", "output_scale")):
            want += t.numel() * t.element_size()
    a = anatomy(b)
    assert a.stored_bytes == want and a.params_total == _file_bytes_and_numel(dirs["fp"])[1]


def test_a_quantization_that_cannot_load_here_is_one_line(dirs, capsys, tmp_path):
    """bitsandbytes without its package (CI installs none) or CUDA: transformers refuses; vocablens
    says so in one line, naming the quantization."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("bitsandbytes") is not None and torch.cuda.is_available():
        pytest.skip("bitsandbytes and CUDA are both here: the checkpoint loads (test_bitsandbytes_4bit_on_cuda)")
    d = tmp_path / "bnb"
    shutil.copytree(dirs["fp"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    (d / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_cli(capsys, "score", "the cat", "-m", d)
    assert code == 2 and out == "" and "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "quantized with bitsandbytes 4-bit nf4" in errors[0], err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bitsandbytes 4-bit runs on CUDA; no GPU here")
def test_bitsandbytes_4bit_on_cuda(dirs, tmp_path):
    """A GPU check: a tiny llama quantized by bitsandbytes (nf4) and saved loads on CUDA, passes the
    readout check, reads W_U as bitsandbytes dequantizes it, and anatomy counts the file's bytes."""
    import bitsandbytes.functional as bnbf
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import vocablens

    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                           llm_int8_skip_modules=[])
    qm = AutoModelForCausalLM.from_pretrained(dirs["fp"], quantization_config=q, device_map="cuda")
    qm.save_pretrained(tmp_path / "bnb", safe_serialization=True)
    dirs["tok"].save_pretrained(tmp_path / "bnb")
    m = vocablens.load(tmp_path / "bnb", device="cuda")
    assert m.provenance.readout.startswith("checked:") and m.provenance.quantization == "bitsandbytes 4-bit nf4"
    down = m.model.model.layers[0].mlp.down_proj.weight
    from vocablens.models.blocks.view import linear_weight

    assert torch.equal(linear_weight(m.model.model.layers[0].mlp.down_proj), bnbf.dequantize_4bit(down.data, down.quant_state))
    a = m.anatomy().value
    assert a.params_total == _file_bytes_and_numel(dirs["fp"])[1]
    assert a.stored_bytes <= _file_bytes_and_numel(tmp_path / "bnb")[0]  # the file adds bnb's packed state blobs
