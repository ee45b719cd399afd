"""Anatomy: exact parameter counts from the catalogue, the loaded default model and tiny families."""

import json
from dataclasses import replace

import pytest
from torch import nn

from tiny_models import FAMILIES, make_tiny, writes_through
from vocablens.accounting.anatomy import anatomy, anatomy_of, count_parameters, logits_memory, lookup_bytes
from vocablens.models.files.catalogue import catalogue, catalogue_entry
from vocablens.models.files.config import meta_model, resolve_config
from vocablens.cli.common import run_app
from vocablens.errors import BadInput, ModelNotFound
from vocablens.models import Borders


# ---------------------------------------------------------------------------------------- catalogue
def test_qwen3_0_6b_exact():
    a = anatomy_of("Qwen/Qwen3-0.6B")
    assert a.params_total == 596_049_920
    assert a.params_embedding == 155_582_464
    assert round(a.embedding_share, 3) == 0.261
    assert a.tied and a.params_unembedding == 0
    assert a.params_non_embedding == 440_467_456  # model card: 0.44B non-embedding
    assert (a.vocab_size, a.d_model, a.tokenizer_vocab_size) == (151_936, 1024, 151_669)


def test_qwen3_8b_exact():
    a = anatomy_of("qwen3-8b")  # alias
    assert a.name == "Qwen/Qwen3-8B"
    assert a.params_total == 8_190_735_360
    assert a.params_embedding == a.params_unembedding == 622_329_856
    assert a.params_non_embedding == 6_946_075_648
    assert not a.tied


def test_llama3_70b_gpt2_smollm2_exact():
    assert anatomy_of("meta-llama/Meta-Llama-3-70B").params_total == 70_553_706_496
    g = anatomy_of("gpt2")
    assert g.params_total == 124_439_808
    assert g.params_position == 1024 * 768  # wpe, excluded from non-embedding
    assert g.params_non_embedding == 85_056_000
    s = anatomy_of("HuggingFaceTB/SmolLM2-135M")
    assert s.params_total == 134_515_008 and s.tied


# All totals from published model cards / papers (research note §4.2; Pythia paper: 18,915,328 non-embedding).
CATALOGUE_TOTALS = {
    "Qwen/Qwen3-0.6B": 596_049_920, "Qwen/Qwen3-1.7B": 1_720_574_976, "Qwen/Qwen3-4B": 4_022_468_096,
    "Qwen/Qwen3-8B": 8_190_735_360, "Qwen/Qwen3-14B": 14_768_307_200, "Qwen/Qwen2.5-7B": 7_615_616_512,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248, "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "google/gemma-3-270m": 268_098_176, "google/gemma-3-1b-pt": 999_885_952, "gpt2": 124_439_808,
    "EleutherAI/pythia-70m": 70_426_624, "HuggingFaceTB/SmolLM2-135M": 134_515_008,
    "HuggingFaceTB/SmolLM2-360M": 361_821_120, "HuggingFaceTB/SmolLM2-1.7B": 1_711_376_384,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
}


def test_whole_catalogue_totals_and_tying():
    assert set(catalogue()) == set(CATALOGUE_TOTALS)
    tied = {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "google/gemma-3-270m", "google/gemma-3-1b-pt",
            "gpt2", "HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-1.7B"}
    for hub, total in CATALOGUE_TOTALS.items():
        a = anatomy_of(hub)
        assert a.params_total == total, hub
        assert a.tied == (hub in tied), hub
        assert a.params_total == a.params_embedding + a.params_unembedding + a.params_position + a.params_non_embedding
    assert anatomy_of("pythia-70m").params_non_embedding == 18_915_328
    assert anatomy_of("gemma-3-270m").params_non_embedding == 100_326_016


def test_aliases_case_insensitive():
    assert catalogue_entry("QWEN3-0.6B").hub_id == "Qwen/Qwen3-0.6B"
    assert catalogue_entry("llama-3-70b").hub_id == "meta-llama/Meta-Llama-3-70B"
    assert catalogue_entry("no-such-model") is None


def test_seed_numbers():
    q = anatomy_of("Qwen/Qwen2.5-7B")
    assert q.params_embedding + q.params_unembedding == 1_089_994_752
    assert q.params_total == 7_615_616_512 and round(q.vocab_share, 3) == 0.143
    q06 = anatomy_of("qwen3-0.6b", context=4096, logits_dtype="float32")
    assert q06.flops_head == 2 * 1024 * 151_936  # ~311 M per position
    assert q06.logits.bytes_all_positions == 4096 * 151_936 * 4 == 2_489_319_424  # 2.49 GB
    assert q06.logits.bytes_per_position == 607_744  # 593.5 KiB, "594 KB"
    assert round(q06.head_share_no_attention, 2) == 0.26  # "about a quarter of the per-token computation"
    # prefill of 1000 tokens, head on the last position only: 99.9% saved
    assert logits_memory(151_936, 1, 1000).saving == pytest.approx(0.999)
    q8 = anatomy_of("qwen3-8b")
    assert q8.matrix_bytes["bf16"] == 1_244_659_712  # "1.24 GB"
    assert round(q8.flops_head / 1e9, 2) == 1.24
    assert 15e9 < q8.flops_forward < 17e9  # "around 16 GFLOP"
    assert 0.07 < q8.head_share < 0.085  # "close to 8%"
    # Llama-3-70B: embedding and head together about 3%
    assert round(anatomy_of("llama-3-70b").vocab_share, 2) == 0.03


def test_bytes_and_flops_formulas():
    a = anatomy_of("smollm2-135m", batch=8, context=2048, logits_dtype="bfloat16")
    n = 49_152 * 576
    assert a.matrix_bytes == {"fp32": 4 * n, "bf16": 2 * n, "fp8": n, "int4": n // 2}
    assert a.model_bytes["bf16"] == 2 * 134_515_008
    assert a.d_attn == 9 * 64
    assert a.flops_attention == 2 * 30 * 2048 * 576  # Kaplan et al. 2020, Table 1
    assert a.flops_forward == 2 * a.params_non_embedding + 2 * n + a.flops_attention
    lg = a.logits
    assert (lg.batch, lg.context, lg.dtype) == (8, 2048, "bfloat16")
    assert lg.bytes_all_positions == 8 * 2048 * 49_152 * 2
    assert lg.bytes_last_position == 8 * 49_152 * 2
    assert lg.bytes_saved == lg.bytes_all_positions - lg.bytes_last_position
    assert lg.saving == pytest.approx(1 - 1 / 2048)


def test_lookup_bytes_vs_head():
    # 64 rows of a bf16 d=1024 matrix: 128 KiB, while the head reads the whole ~300 MB matrix
    assert lookup_bytes(64, 1024, "bf16") == 131_072
    assert anatomy_of("qwen3-0.6b").matrix_bytes["bf16"] == 311_164_928
    with pytest.raises(BadInput):
        lookup_bytes(1, 8, "int3")


@pytest.mark.parametrize("bad", [dict(batch=0), dict(context=0), dict(dtype="int3")])
def test_logits_memory_rejects_bad_input(bad):
    kw = dict(vocab_size=10, batch=1, context=4, dtype="float32")
    kw.update(bad)
    with pytest.raises(BadInput):
        logits_memory(**kw)


# ---------------------------------------------------------------------------------------- loaded model
def test_loaded_default_model(smollm2):
    a = anatomy(smollm2.borders, name="smollm2")
    assert a.params_total == 134_515_008
    assert a.tied and a.params_unembedding == 0
    assert count_parameters(smollm2.model) == 134_515_008
    assert a.tokenizer_vocab_size == 49_152


def test_default_model_from_gguf_config_equals_loaded(smollm2):
    cfg_a = anatomy_of("smollm2")  # config read from the GGUF header, meta device
    loaded = anatomy(smollm2.borders, name="smollm2")
    assert cfg_a.source == "gguf"
    for f in ("params_total", "params_embedding", "params_unembedding", "params_non_embedding", "tied",
              "vocab_size", "d_model", "tokenizer_vocab_size", "flops_forward"):
        assert getattr(cfg_a, f) == getattr(loaded, f), f


def test_gguf_config_from_its_cache_entry_equals_the_header(tmp_path, monkeypatch):
    """Once a GGUF file's float32 cache entry exists, its config is read from the entry's
    config.json (milliseconds, not seconds of header parsing), and it gives the same config and
    anatomy as the header; a damaged entry falls back to the header."""
    import json

    import vocablens
    import vocablens.models.files.config as C
    from tiny_dirs import save_tiny_gguf, tiny_tokenizer
    from vocablens.models.files.config import load_config

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    gguf = save_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer())
    C._gguf_config.cache_clear()
    header = anatomy_of(str(gguf))
    vocablens.load(str(gguf))                    # the first load writes the cache entry
    entries = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(entries) == 1 and (entries[0] / "config.json").is_file()
    calls = []
    monkeypatch.setattr(C, "load_config", lambda *a, **k: calls.append(a) or load_config(*a, **k))
    C._gguf_config.cache_clear()
    cached = anatomy_of(str(gguf))
    assert calls == []                           # the header was not parsed
    assert cached.source == header.source == "gguf"
    for f in ("params_total", "params_embedding", "params_unembedding", "params_non_embedding", "tied",
              "vocab_size", "d_model", "tokenizer_vocab_size", "flops_forward", "n_layers"):
        assert getattr(cached, f) == getattr(header, f), f
    assert load_config(str(gguf)).to_diff_dict() == C._gguf_config(str(gguf), 0, 0).to_diff_dict()
    (entries[0] / "config.json").write_text(json.dumps({"model_type": "no-such-type"}))
    C._gguf_config.cache_clear()
    assert anatomy_of(str(gguf)).params_total == header.params_total and len(calls) == 1
    C._gguf_config.cache_clear()


# ---------------------------------------------------------------------------------------- tiny families
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_family_counts(family):
    model = make_tiny(family)
    b = Borders.from_model(model)
    a = anatomy(b)
    # oracles: transformers' own count (a tied head is one Parameter there) and its modules' shapes
    assert a.params_total == model.num_parameters()
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert a.params_embedding == emb.weight.numel() == model.config.vocab_size * emb.weight.shape[1]
    head_extra = 0 if writes_through(emb.weight, head.weight) else head.weight.numel()
    head_extra += head.bias.numel() if getattr(head, "bias", None) is not None else 0
    assert a.params_unembedding == head_extra
    assert a.params_non_embedding == a.params_total - a.params_embedding - a.params_unembedding - a.params_position
    # The meta-device build (no storage) gives the same counts as the materialised model.
    m = anatomy(Borders.from_model(meta_model(model.config)))
    for f in ("params_total", "params_embedding", "params_unembedding", "params_position",
              "params_non_embedding", "tied"):
        assert getattr(m, f) == getattr(a, f), (family, f)


def test_gpt2_and_opt_learned_positions_excluded():
    g = make_tiny("gpt2")
    a = anatomy(Borders.from_model(g))
    assert a.params_position == g.transformer.wpe.weight.numel() == 128 * 64
    o = make_tiny("opt")
    ao = anatomy(Borders.from_model(o))
    assert ao.params_position == o.model.decoder.embed_positions.weight.numel() > 0
    llama = anatomy(Borders.from_model(make_tiny("llama")))
    assert llama.params_position == 0


def test_tied_vs_untied_differ_by_one_matrix():
    t = anatomy(Borders.from_model(make_tiny("llama_tied")))
    u = anatomy(Borders.from_model(make_tiny("llama")))
    assert t.tied and not u.tied
    assert u.params_total - t.params_total == 96 * 64
    assert t.params_non_embedding == u.params_non_embedding


def test_head_tied_by_storage_counted_once():
    model = make_tiny("llama")
    # A head that shares the embedding's memory through a separate Parameter object.
    model.lm_head.weight = nn.Parameter(model.model.embed_tokens.weight.data)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    b = Borders.from_model(model)
    assert b.tied
    a = anatomy(b)
    assert a.params_unembedding == 0
    # transformers counts the two Parameter objects apart; the memory holds the head once
    assert writes_through(model.model.embed_tokens.weight, model.lm_head.weight)
    once = model.num_parameters() - model.lm_head.weight.numel()
    assert a.params_total == count_parameters(model) == once


def test_meta_untied_head_is_not_tied():
    # regression: every meta tensor has data_ptr() == 0, which made untied meta heads look tied
    b = Borders.from_model(meta_model(make_tiny("llama").config))
    assert b.W_E.is_meta and not b.tied


def test_padding_note_and_tokenizer_override():
    b = Borders.from_model(make_tiny("llama_tied"))
    a = anatomy(replace(b, tokenizer_vocab_size=80))
    assert a.tokenizer_vocab_size == 80
    assert any("16 rows beyond" in n for n in a.notes)


def test_moe_note():
    a = anatomy(Borders.from_model(make_tiny("mixtral")))
    assert any("mixture of experts" in n for n in a.notes)


# ---------------------------------------------------------------------------------------- config specs
def test_config_json_and_directory(tmp_path):
    cfg = make_tiny("gpt2").config
    d = tmp_path / "m"
    d.mkdir()
    cfg.to_json_file(d / "config.json")
    from_file = anatomy_of(d / "config.json")
    from_dir = anatomy_of(d)
    direct = anatomy(Borders.from_model(make_tiny("gpt2")))
    assert from_file.params_total == from_dir.params_total == direct.params_total
    assert from_file.source == "config"


def test_unknown_spec_is_model_not_found():
    with pytest.raises(ModelNotFound, match="catalogue"):
        resolve_config("./no/such/dir")


# ---------------------------------------------------------------------------------------- CLI
def test_cli_json_one_model(capsys):
    assert run_app(["anatomy", "qwen3-0.6b", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["models"]  # one model: still a list of one
    # Qwen3-0.6B's config.json: vocab_size 151936, hidden_size 1024, tie_word_embeddings true
    assert (d["vocab_size"], d["d_model"], d["tied"]) == (151_936, 1024, True)
    assert d["params_total"] == 596_049_920 and d["params_embedding"] == 151_936 * 1024
    assert d["params_unembedding"] == 0 and d["params_non_embedding"] == 596_049_920 - 151_936 * 1024
    assert d["embedding_share"] == pytest.approx(151_936 * 1024 / 596_049_920, abs=1e-4)
    assert d["logits"]["bytes_all_positions"] == 2_489_319_424


def test_cli_side_by_side(capsys):
    assert run_app(["anatomy", "qwen3-0.6b", "qwen3-8b", "gpt2", "--context", "1000", "--dtype", "bf16",
                    "--batch", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in d["models"]] == ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "gpt2"]
    assert d["models"][1]["params_non_embedding"] == 6_946_075_648
    assert d["models"][0]["logits"]["bytes_all_positions"] == 2 * 1000 * 151_936 * 2
    assert run_app(["anatomy", "qwen3-0.6b", "qwen3-8b"]) == 0
    text = capsys.readouterr().out
    assert "NON-EMBEDDING" in text and "6,946,075,648" in text and "440,467,456" in text


def test_cli_load_counts_loaded_weights(smollm2, monkeypatch, capsys):
    import vocablens.cli.anatomy as ca

    monkeypatch.setattr(ca, "load_model", lambda *a, **k: smollm2)
    assert run_app(["anatomy", "--load", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["models"]
    assert d["params_total"] == 134_515_008 and d["tied"] is True and d["source"] == "loaded model"


def test_cli_load_alias_loads_hub_id(smollm2, monkeypatch, capsys):
    import vocablens.cli.anatomy as ca

    asked = []
    monkeypatch.setattr(ca, "load_model", lambda spec, **k: asked.append(spec) or smollm2)
    assert run_app(["anatomy", "qwen3-0.6b", "--load", "--json"]) == 0
    assert asked == ["Qwen/Qwen3-0.6B"]
    capsys.readouterr()


@pytest.mark.slow  # reads the default model's GGUF file (its header: seconds)
def test_cli_default_model(capsys):
    assert run_app(["anatomy", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["models"]
    assert d["params_total"] == 134_515_008 and d["tied"] is True and d["source"] == "gguf"


@pytest.mark.parametrize("argv", [
    ["anatomy", "qwen3-0.6b", "--context", "0"],
    ["anatomy", "qwen3-0.6b", "--batch", "-1"],
    ["anatomy", "qwen3-0.6b", "--dtype", "int3"],
    ["anatomy", "./no/such/model"],
])
def test_cli_bad_input_exit_2(argv, capsys):
    assert run_app(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error:") and "Traceback" not in err


# ---------------------------------------------------------------------------------------- helpers
def test_attention_shape_and_flops():
    """heads x head_dim from the config (head_dim may differ from d/heads: Qwen3), kv heads for GQA."""
    from types import SimpleNamespace

    from vocablens.models.flops import attention_flops, attention_shape, head_flops

    qwen3 = SimpleNamespace(num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    s = attention_shape(qwen3, 1024)
    assert (s.heads, s.kv_heads, s.head_dim, s.d_attn) == (16, 8, 128, 2048)
    gpt2 = SimpleNamespace(n_head=12)
    assert attention_shape(gpt2, 768).d_attn == 768 and attention_shape(gpt2, 768).kv_heads == 12
    assert attention_shape(SimpleNamespace(), 64).d_attn == 64
    assert attention_flops(28, 4096, 2048) == 2 * 28 * 4096 * 2048
    assert attention_flops(28, 4096, 2048, per_matmul=True) == 2 * attention_flops(28, 4096, 2048)
    assert head_flops(151_936, 1024) == 311_164_928
    a = anatomy_of("qwen3-0.6b", context=4096)
    assert a.d_attn == 2048 and a.flops_attention == attention_flops(28, 4096, 2048)


def test_one_dtype_table():
    import torch

    from vocablens.models.files.dtypes import canonical_dtype, dtype_bytes, torch_dtype

    assert [canonical_dtype(x) for x in ("bf16", "torch.float16", "FP32", torch.float64)] == [
        "bfloat16", "float16", "float32", "float64"]
    assert [dtype_bytes(x) for x in ("bf16", "float32", "half", "fp64")] == [2, 4, 2, 8]
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype(None) is None
    with pytest.raises(BadInput, match="unknown logits dtype 'int8'"):
        canonical_dtype("int8", "logits dtype")


def test_parse_int_list():
    from vocablens.cli.common import parse_int_list

    assert parse_int_list("0, 10,20,", "--layers") == [0, 10, 20]
    assert parse_int_list("", "--layers") == [] and parse_int_list(None, "--layers") == []
    with pytest.raises(BadInput, match="--layers takes comma-separated integers; got '1,x'"):
        parse_int_list("1,x", "--layers")


def test_missing_gguf_file_says_no_such_file(capsys):
    """`anatomy nope.gguf` said "'nope.gguf' is not a config file, model directory, .gguf file ..."."""
    assert run_app(["anatomy", "nope.gguf"]) == 2
    assert "error: no such GGUF file: nope.gguf" in capsys.readouterr().err


def test_one_anatomy_result_holds_several_models():
    """The ``anatomy`` command given several models ends through ``show`` with one ``anatomy`` result
    holding them (its value a tuple): its JSON is ``{"models": [...]}`` in the order given, its frame a
    row per model, and one model's result reads the same as before (a list of one)."""
    from vocablens.handle.results import Anatomy as AnatomyResult

    q, g = anatomy_of("qwen3-0.6b"), anatomy_of("gpt2")
    both = AnatomyResult((q, g), None, None)
    assert [m["params_total"] for m in both.to_json()["models"]] == [q.params_total, g.params_total]
    assert AnatomyResult(q, None, None).to_json() == {"models": [json.loads(json.dumps(q.to_dict()))]}
    pytest.importorskip("pandas")
    frame = both.to_pandas()
    assert len(frame) == 2 and list(frame["params_total"]) == [q.params_total, g.params_total]
