"""Loading: the default model, directories, .gguf files, hub ids, provenance and errors."""

import json

import pytest
import torch

import vocablens
from vocablens.errors import CorruptModelFile, ModelNotFound, VocabLensError
from vocablens.models import default_gguf_path, gguf_provenance, load, resolve_spec


def test_default_model_provenance_read_from_file(smollm2):
    prov = smollm2.provenance
    assert prov.name == "SmolLM2-135M-Instruct"
    assert prov.quantization == "Q4_1 GGUF"
    assert prov.dequantized and prov.dtype == "float32"
    # read from the file itself: the embedding is stored Q8_0, the blocks Q4_1
    assert prov.tensor_types["embedding"] == "Q8_0"
    assert prov.tensor_types["blocks"] == "Q4_1"
    assert prov.describe().startswith("SmolLM2-135M-Instruct, Q4_1 GGUF, dequantized")
    assert prov.source == str(default_gguf_path())


def test_default_model_borders(smollm2):
    b = smollm2.borders
    assert (b.family, b.vocab_size, b.d_model, b.n_layers) == ("llama", 49152, 576, 30)
    # SmolLM2-135M ties its head (its config: tie_word_embeddings true; its GGUF stores no output.weight):
    # the head we read is the one module transformers' model uses for both
    m = smollm2.model
    assert b.tied and b.unembedding.weight is m.get_output_embeddings().weight is m.get_input_embeddings().weight
    assert b.tokenizer_vocab_size == 49152 and b.real_vocab_size == 49152
    assert b.W_E.dtype == torch.float32
    assert sum(p.numel() for p in smollm2.model.parameters()) == 134_515_008


def test_default_model_predicts_paris(smollm2):
    model, tok, b, _ = smollm2
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        resid, logits = b.residual_stream(ids)
    assert tok.decode(logits[0, -1].argmax()) == " Paris"
    assert (b.unembedding(resid[-1]) - logits).abs().max() <= 1e-4


def test_unknown_specs_are_clear_errors(tmp_path):
    with pytest.raises(ModelNotFound, match="no such"):
        resolve_spec(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFound, match="no such GGUF"):
        resolve_spec(str(tmp_path / "x.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="without config.json"):
        resolve_spec(str(tmp_path / "empty"))
    # a hub id that is not in the (offline) cache: one line saying how to make it available
    with pytest.raises(ModelNotFound) as ei:
        load("nobody-here/not-a-model-xyz")
    msg = str(ei.value)
    assert "\n" not in msg and "hf download nobody-here/not-a-model-xyz" in msg


def test_corrupt_gguf_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 37)
    with pytest.raises(CorruptModelFile):
        gguf_provenance(bad, str(bad))
    with pytest.raises(VocabLensError):
        load(str(bad))


@pytest.mark.slow  # copies and parses the real default model's GGUF file
def test_truncated_copy_of_default_gguf(tmp_path):
    src = default_gguf_path()
    bad = tmp_path / "trunc.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(CorruptModelFile):
        load(str(bad))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2):
    """A tiny Llama with the real tokenizer and 64 padding rows beyond it, saved as an HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2.tokenizer
    V = len(tok) + 64
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    d = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_load_directory_with_padding_rows(tiny_dir):
    model, tok, b, prov = vocablens.load(str(tiny_dir))
    assert prov.format == "safetensors" and not prov.dequantized
    assert not b.tied and b.vocab_size == len(tok) + 64
    assert b.real_vocab_size == len(tok)
    mask = b.real_token_mask()
    assert mask.sum() == len(tok) and not mask[len(tok):].any()
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["vocab_size"] == b.vocab_size


def test_gguf_cache_round_trip(tmp_path, monkeypatch, smollm2):
    """The dequantized GGUF cache gives the same weights, tokenizer and provenance as the file."""
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    first = load("smollm2")  # from the GGUF file, writes the cache
    entries = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(entries) == 1 and (entries[0] / "model.safetensors").is_file()
    second = load("smollm2")  # from the cache
    assert second.provenance.loaded_from == str(entries[0])
    for lm in (first, second):
        assert lm.provenance.describe() == smollm2.provenance.describe()
        m = lm.model
        assert lm.borders.tied and lm.borders.unembedding.weight is m.get_output_embeddings().weight is m.get_input_embeddings().weight
        sd = lm.model.state_dict()
        for name, ref in smollm2.model.state_dict().items():
            assert torch.equal(sd[name], ref), name
    text = "Hello world!\n  def f(x): return x**2  # ünïcödé 中文"
    assert second.tokenizer(text).input_ids == smollm2.tokenizer(text).input_ids
    assert second.tokenizer.chat_template == smollm2.tokenizer.chat_template


def test_cache_off(monkeypatch):
    from vocablens.models.files.gguf_cache import cache_root

    monkeypatch.setenv("VOCABLENS_CACHE", "off")
    assert cache_root() is None
