"""Vocabulary surgery: expand and trim on tiny random models (tied qwen2, untied llama, untied phi
with a head bias) with a tiny byte-level BPE tokenizer trained here, and on the real default model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vocablens.errors import BadInput, OutputExists, UnsupportedTokenizer
from vocablens.surgery import (
    corpus_token_ids, expand_vocab, init_rows, plan_bpe_trim, trim_vocab, verify_expansion, verify_trim,
)
from vocablens.surgery.io import save_model_dir
from vocablens.surgery.trim import tokenization_mismatches

ZW = "\u200b"  # the tiny tokenizer's normalizer deletes it: a string of it tokenizes to nothing


def _corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:30]]


@pytest.fixture(scope="module")
def tiny_tok():
    """A byte-level BPE (vocab 400) trained on a slice of pydoc topics, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.Replace(ZW, "")
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(_corpus(), tr)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<pad>")


def _tiny(family: str, rows: int, seed: int = 0):
    from tiny_models import _config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = _config(family)
    cfg.vocab_size = rows
    cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id = 0, 1, None
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # trained-looking scale: peaky logits
        m.get_output_embeddings().weight.mul_(20.0)
    m.eval().requires_grad_(False)
    return m


TEXT = "The class statement defines a new type; the object is an instance of that type."


def _rows(m):
    return m.get_input_embeddings().weight, m.get_output_embeddings().weight


# ----------------------------------------------------------------------------------------- expand
def test_tied_stays_tied_and_rows_are_subtoken_means(tiny_tok):
    m = _tiny("llama_tied", len(tiny_tok))
    E0 = m.get_input_embeddings().weight.clone()
    ex = expand_vocab(m, tiny_tok, [" objectstatement", " instance"], init="subtoken-mean")
    E, U = _rows(ex.model)
    assert U is E and U.data_ptr() == E.data_ptr()  # same storage afterwards
    assert E.shape[0] == len(tiny_tok) + 2 == ex.model.config.vocab_size == len(ex.tokenizer)
    assert torch.equal(E[: len(tiny_tok)], E0)  # old rows bit-identical
    assert torch.equal(m.get_input_embeddings().weight, E0) and m.get_input_embeddings().weight.shape[0] == len(tiny_tok)
    assert len(tiny_tok) == 400  # input tokenizer untouched
    for nt in ex.result.new_tokens:
        assert list(nt.old_ids) == tiny_tok(nt.token, add_special_tokens=False).input_ids and nt.old_ids
        torch.testing.assert_close(E[nt.id], E0[list(nt.old_ids)].float().mean(0), rtol=0, atol=1e-7)
    assert ex.tokenizer(" instance", add_special_tokens=False).input_ids == [ex.result.new_tokens[1].id]


def test_untied_both_ends_mean_excludes_untrained_rows(tiny_tok):
    m = _tiny("llama", len(tiny_tok))
    with torch.no_grad():  # rows 300..309 never trained: zero in both matrices
        m.get_input_embeddings().weight[300:310] = 0
        m.get_output_embeddings().weight[300:310] = 0
    E0, U0 = (w.clone() for w in _rows(m))
    ex = expand_vocab(m, tiny_tok, [" objectstatement"], init="mean")
    E, U = _rows(ex.model)
    assert E is not U and not ex.result.tied
    keep = torch.ones(400, dtype=torch.bool)
    keep[300:310] = False
    keep_E = keep.clone()
    keep_E[1] = False  # the pad row (padding_idx=1) of the embedding is all zeros: never trained
    assert ex.result.trained_rows_embedding == 389 and ex.result.trained_rows_head == 390
    torch.testing.assert_close(E[400], E0[keep_E].mean(0), rtol=0, atol=1e-7)
    torch.testing.assert_close(U[400], U0[keep].mean(0), rtol=0, atol=1e-7)
    assert not torch.allclose(E[400], U[400])  # each end its own mean
    # subtoken-mean separately for both ends
    ex2 = expand_vocab(m, tiny_tok, [" objectstatement"])
    ids = list(ex2.result.new_tokens[0].old_ids)
    E2, U2 = _rows(ex2.model)
    torch.testing.assert_close(E2[400], E0[ids].mean(0), rtol=0, atol=1e-7)
    torch.testing.assert_close(U2[400], U0[ids].mean(0), rtol=0, atol=1e-7)


def test_init_rows_methods_float32_and_fallback():
    W = torch.randn(10, 4, dtype=torch.bfloat16)
    trained = torch.ones(10, dtype=torch.bool)
    gm = W.float().mean(0)
    sub = W[[2, 5]].float().mean(0)
    rows, fb = init_rows(W, [[2, 5], []], "interpolate", trained, interpolation=0.25)
    assert rows.dtype == torch.bfloat16 and fb == [False, True]
    assert torch.equal(rows[0], (0.75 * gm + 0.25 * sub).to(torch.bfloat16))
    assert torch.equal(rows[1], gm.to(torch.bfloat16))
    z, _ = init_rows(W, [[1]], "zeros", trained)
    assert torch.equal(z, torch.zeros(1, 4, dtype=torch.bfloat16))
    with pytest.raises(BadInput):
        init_rows(W, [[1]], "median", trained)


def test_zero_piece_string_falls_back_to_global_mean(tiny_tok):
    assert tiny_tok(ZW * 2, add_special_tokens=False).input_ids == []
    m = _tiny("llama_tied", len(tiny_tok))
    ex = expand_vocab(m, tiny_tok, [ZW * 2])
    nt = ex.result.new_tokens[0]
    assert nt.fallback and nt.init == "mean" and nt.old_ids == ()
    assert any("tokenizes to nothing" in n for n in ex.result.notes)
    W = m.get_input_embeddings().weight
    assert torch.equal(W[1], torch.zeros(64))  # the pad row: never trained, not in the mean
    torch.testing.assert_close(_rows(ex.model)[0][nt.id], torch.cat([W[:1], W[2:]]).mean(0), rtol=0, atol=1e-6)


def test_existing_duplicate_and_empty_tokens_change_nothing(tiny_tok):
    m = _tiny("llama_tied", len(tiny_tok))
    existing = tiny_tok.convert_ids_to_tokens(300)  # a raw vocabulary string
    one_token = tiny_tok.decode([300])
    for bad in ([existing], [one_token], [" instance", " instance"], [""], [], ["<pad>"]):
        with pytest.raises(BadInput):
            expand_vocab(m, tiny_tok, bad)
    with pytest.raises(BadInput, match="already token 300"):
        expand_vocab(m, tiny_tok, [one_token])
    assert len(tiny_tok) == 400 and m.get_input_embeddings().weight.shape[0] == 400


def test_head_bias_keeps_the_new_logit_at_the_subtoken_mean(tiny_tok):
    """Phi has a head bias: the new token's logit must be the mean of its subtokens' logits."""
    m = _tiny("phi", len(tiny_tok))
    with torch.no_grad():
        m.get_output_embeddings().bias.normal_(0, 1.0)
    ex = expand_vocab(m, tiny_tok, [" objectstatement"])
    nt = ex.result.new_tokens[0]
    assert ex.result.has_bias and ex.model.get_output_embeddings().bias.shape[0] == 401
    ids = torch.tensor([tiny_tok(TEXT).input_ids])
    logits = ex.model(input_ids=ids).logits[0]
    torch.testing.assert_close(logits[:, nt.id], logits[:, list(nt.old_ids)].mean(-1), rtol=0, atol=1e-4)


def test_new_tokens_do_not_take_the_mass_hewitt_bound(tiny_tok):
    """transformers #8472/#24372: zero init + negative logits -> new tokens take ~all the mass.
    Global-mean init keeps mass <= k/(V+k) and KL <= log(1+k/V) at every position."""
    m = _tiny("phi", len(tiny_tok))
    with torch.no_grad():
        m.get_output_embeddings().bias.sub_(30.0)  # every logit strongly negative
    toks = [" objectstatement", " qqzz of", "zzqx"]
    texts = [TEXT, _corpus()[3][:300]]
    zeros = expand_vocab(m, tiny_tok, toks, init="zeros")
    vz = verify_expansion(m, tiny_tok, zeros.model, zeros.tokenizer, zeros.result.new_ids, texts,
                          zeros.result.trained_rows_head, "x")
    assert vz.new_token_mass > 0.99  # the bug, reproduced
    mean = expand_vocab(m, tiny_tok, toks, init="mean")
    vm = verify_expansion(m, tiny_tok, mean.model, mean.tokenizer, mean.result.new_ids, texts,
                          mean.result.trained_rows_head, TEXT)
    k, V = 3, 400
    assert vm.mass_bound == pytest.approx(k / (V + k)) and vm.kl_bound == pytest.approx(math.log1p(k / V))
    assert vm.new_token_mass_max <= vm.mass_bound and vm.kl_old_new <= vm.kl_bound
    assert vm.old_logits_max_abs_diff == 0.0
    # same positions, same hidden states: KL(old||new) = -log(1 - mass) per position, so the mean KL
    # is at least -log(1 - mean mass) (Jensen), and perplexity changes by exactly exp(mean KL)
    assert vm.kl_old_new >= -math.log1p(-vm.new_token_mass) - 1e-7
    assert vm.new_tokens_in_text == 0 and vm.tokens_before == vm.tokens_after
    assert vm.perplexity_after / vm.perplexity_before == pytest.approx(math.exp(vm.kl_old_new), rel=1e-5)


def test_new_ids_in_padding_rows_are_initialised_nothing_shrinks(tiny_tok):
    """LlamaFactory PR #10547: rows=408, tokenizer 400, add 2 -> rows 400, 401 set, 402..407 untouched."""
    m = _tiny("llama", len(tiny_tok) + 8)
    with torch.no_grad():
        m.get_output_embeddings().weight[400:] = 50.0  # garbage padding rows that would win any softmax
    E0, U0 = (w.clone() for w in _rows(m))
    ex = expand_vocab(m, tiny_tok, [" objectstatement", " instance of"], init="mean")
    E, U = _rows(ex.model)
    assert E.shape[0] == 408 == ex.result.rows_after == ex.model.config.vocab_size
    assert all(t.in_padding_row for t in ex.result.new_tokens) and ex.result.new_ids == [400, 401]
    torch.testing.assert_close(U[400], U0[:400].mean(0), rtol=0, atol=1e-6)  # padding rows not in the mean
    assert torch.equal(U[402:], U0[402:]) and torch.equal(E[402:], E0[402:])
    v = verify_expansion(m, tiny_tok, ex.model, ex.tokenizer, ex.result.new_ids, [TEXT], 400, TEXT)
    assert v.new_token_mass_max <= v.mass_bound  # padding rows (402..407) masked out of the softmax


def test_reload_round_trip_with_plain_transformers(tiny_tok, tmp_path):
    """transformers #35141: an untied head must not be re-initialised on reload; tied stays tied."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for fam in ("llama_tied", "llama"):
        m = _tiny(fam, len(tiny_tok))
        ex = expand_vocab(m, tiny_tok, [" objectstatement", "<|tool|>"], special=False)
        out = save_model_dir(ex.model, ex.tokenizer, tmp_path / fam)
        m2 = AutoModelForCausalLM.from_pretrained(out)
        t2 = AutoTokenizer.from_pretrained(out)
        E, U = _rows(m2)
        assert (U is E) == (fam == "llama_tied") and m2.config.vocab_size == 402 == len(t2)
        assert torch.equal(E, _rows(ex.model)[0]) and torch.equal(U, _rows(ex.model)[1])
        ids = t2("x objectstatement <|tool|>", add_special_tokens=False).input_ids
        assert ids == ex.tokenizer("x objectstatement <|tool|>", add_special_tokens=False).input_ids
        assert 400 in ids and 401 in ids
        with pytest.raises(OutputExists):
            save_model_dir(ex.model, ex.tokenizer, out)


def test_special_tokens_are_special(tiny_tok):
    m = _tiny("llama_tied", len(tiny_tok))
    ex = expand_vocab(m, tiny_tok, ["<|tool|>"], special=True)
    ids = ex.tokenizer("a<|tool|>b", add_special_tokens=False).input_ids
    assert 400 in ids and ex.tokenizer.decode(ids, skip_special_tokens=True) == "ab"


# ----------------------------------------------------------------------------------------- trim
@pytest.mark.parametrize("family", ["llama_tied", "phi"])
def test_trim_identical_logprobs_and_round_trip(tiny_tok, family, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = _tiny(family, len(tiny_tok) + 4)
    corpus = [t[:400] for t in _corpus()[:8]]
    used = corpus_token_ids(tiny_tok, corpus)
    tr = trim_vocab(m, tiny_tok, used)
    r = tr.result
    assert r.rows_before == 404 and r.rows_after == len(tr.kept_old_ids) == len(tr.tokenizer) < 404
    assert set(used) <= set(tr.kept_old_ids) and {0, 1} <= set(tr.kept_old_ids)
    E, U = _rows(tr.model)
    assert (U is E) == (family == "llama_tied")
    matrices = 1 if family == "llama_tied" else 2
    bias = 1 if family == "phi" else 0
    assert r.params_saved == (404 - r.rows_after) * (64 * matrices + bias) and r.bytes_saved == 4 * r.params_saved
    assert torch.equal(E, m.get_input_embeddings().weight[tr.kept_old_ids])
    assert tokenization_mismatches(tiny_tok, tr.tokenizer, tr.kept_old_ids, corpus) == 0
    v = verify_trim(m, tiny_tok, tr.model, tr.tokenizer, tr.kept_old_ids, corpus[:3], max_tokens=64)
    assert v.tokenization_identical and v.logits_max_abs_diff <= 1e-5 and v.logprobs_max_abs_diff <= 1e-5
    assert 0 < v.dropped_mass < 1
    out = save_model_dir(tr.model, tr.tokenizer, tmp_path / "t", extra_json={"vocab_map.json": tr.kept_old_ids})
    m2, t2 = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert m2.config.vocab_size == r.rows_after and m2.config.eos_token_id == tr.old_to_new[0]
    v2 = verify_trim(m, tiny_tok, m2, t2, tr.kept_old_ids, corpus[3:5])
    assert v2.tokenization_identical and v2.logprobs_max_abs_diff <= 1e-5
    assert json.loads((out / "vocab_map.json").read_text()) == tr.kept_old_ids
    # every byte survives: any text still round-trips through the trimmed tokenizer
    s = "naïve 日本語 ∑ — zzq"
    assert t2.decode(t2(s, add_special_tokens=False).input_ids) == s


def test_plan_bpe_trim_keeps_merge_closure():
    j = {"model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                   "end_of_word_suffix": "", "byte_fallback": False,
                   "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "bc": 5, "<s>": 6},
                   "merges": [["a", "b"], ["b", "c"], ["ab", "c"]]},
         "added_tokens": [{"id": 6, "content": "<s>", "special": True}],
         "pre_tokenizer": None,
         "post_processor": {"type": "TemplateProcessing", "special_tokens": {"<s>": {"id": "<s>", "ids": [6], "tokens": ["<s>"]}}}}
    kept, new = plan_bpe_trim(j, [4])
    assert kept == [0, 1, 2, 3, 4, 6]  # abc needs ab (and a, b), c; bc is dropped
    assert new["model"]["vocab"] == {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "<s>": 5}
    assert new["model"]["merges"] == [["a", "b"], ["ab", "c"]]
    assert new["added_tokens"][0]["id"] == 5 and new["post_processor"]["special_tokens"]["<s>"]["ids"] == [5]


def test_trim_refuses_tokenizers_it_cannot_rewrite(tiny_tok, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    wl = Tokenizer(models.WordLevel({"<unk>": 0, **{w: i + 1 for i, w in enumerate("the a class type".split())}},
                                    unk_token="<unk>"))
    wl.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=wl, unk_token="<unk>")
    m = _tiny("llama_tied", len(tok))
    with pytest.raises(UnsupportedTokenizer, match="not BPE"):
        trim_vocab(m, tok, {1, 2})


# ----------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def tiny_dir(tiny_tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "llama"
    save_model_dir(_tiny("llama", len(tiny_tok)), tiny_tok, d)
    return d


def test_cli_expand_json_and_out_exists(tiny_dir, tmp_path, capsys):
    from vocablens.cli.common import run_app

    out = tmp_path / "exp"
    add_file = tmp_path / "tokens.txt"
    add_file.write_text(" instance of\r\n\n")  # kept verbatim: leading space, CRLF dropped
    args = ["expand", "--model", str(tiny_dir), "--add", " objectstatement", "--add-file", str(add_file),
            "--out", str(out), "--init", "mean", "--eval-text", TEXT * 2, "--eval-texts", "2", "--json"]
    assert run_app(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["expansion"]["rows_after"] == 402 and d["expansion"]["new_tokens"][1]["token"] == " instance of"
    assert d["verification"]["new_token_mass_max"] <= d["verification"]["mass_bound"]
    assert d["verification"]["sample"]["after"][-2:] == [" instance of", "."]
    assert (out / "model.safetensors").is_file() and (out / "vocablens_surgery.json").is_file()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert run_app(args) == 2  # --out exists: nothing written
    assert "exists" in capsys.readouterr().err and (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert run_app(args[:-1] + ["--force", "--json"]) == 0
    capsys.readouterr()
    assert run_app(["expand", "--model", str(tiny_dir), "--add", " x", "--add", " x", "--out", str(tmp_path / "dup"),
                    "--eval-text", TEXT]) == 2
    assert "twice" in capsys.readouterr().err and not (tmp_path / "dup").exists()


def test_cli_trim_table(tiny_dir, tmp_path, capsys):
    from vocablens.cli.common import run_app

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(t[:300] for t in _corpus()[:5]))
    out = tmp_path / "trimmed"
    assert run_app(["trim", "--model", str(tiny_dir), "--corpus", str(corpus), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vocabulary trim" in text and "identical" in text
    vm = json.loads((out / "vocab_map.json").read_text())
    assert vm["rows_before"] == 400 and len(vm["kept_old_ids"]) < 400
    assert run_app(["trim", "--model", str(tiny_dir), "--corpus", str(corpus), "--out", str(out), "--json"]) == 2


# ----------------------------------------------------------------------------------------- real model
def test_real_model_expand_and_trim(smollm2, tmp_path):
    """SmolLM2-135M (tied, V=49152): expansion leaves held-out perplexity unchanged to 1e-4; trim is exact."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = smollm2.model, smollm2.tokenizer
    held = "The with statement is used to wrap the execution of a block with methods defined by a context manager."
    ex = expand_vocab(model, tok, [" vocablens", " logit lens", " unembedding"], init="subtoken-mean")
    E, U = _rows(ex.model)
    assert U is E and E.shape[0] == 49155 == ex.model.config.vocab_size
    assert model.get_input_embeddings().weight.shape[0] == 49152  # the session fixture is untouched
    assert [p for p in ex.result.new_tokens[1].old_pieces] == [" log", "it", " lens"]
    torch.testing.assert_close(E[49153], E[[1993, 269, 7247]].mean(0), rtol=0, atol=1e-6)
    v = verify_expansion(model, tok, ex.model, ex.tokenizer, ex.result.new_ids, [held], 49152,
                         "The vocablens logit lens.")
    assert v.new_tokens_in_text == 0 and abs(v.perplexity_relative_change) < 1e-4
    assert v.old_logits_max_abs_diff == 0.0 and v.sample_after == ("The", " vocablens", " logit lens", ".")
    exm = expand_vocab(model, tok, [" vocablens", " logit lens", " unembedding"], init="mean")
    vm = verify_expansion(model, tok, exm.model, exm.tokenizer, exm.result.new_ids, [held], 49152, "x")
    assert vm.new_token_mass_max <= vm.mass_bound == pytest.approx(3 / 49155)
    assert vm.kl_old_new <= vm.kl_bound and abs(vm.perplexity_relative_change) < 1e-4
    # trim to the tokens of a real text, check exactness, reload with plain transformers
    docs = _corpus()[:2]
    tr = trim_vocab(model, tok, corpus_token_ids(tok, docs))
    assert tr.result.tied and tr.result.params_saved == (49152 - tr.result.rows_after) * 576
    out = save_model_dir(tr.model, tr.tokenizer, tmp_path / "trim")
    m2, t2 = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert _rows(m2)[0] is _rows(m2)[1] and len(t2) == tr.result.rows_after
    assert tokenization_mismatches(tok, t2, tr.kept_old_ids, docs) == 0
    vt = verify_trim(model, tok, m2, t2, tr.kept_old_ids, [docs[0]], max_tokens=48)
    assert vt.tokenization_identical and vt.logprobs_max_abs_diff <= 1e-5


def test_save_refuses_a_directory_autotokenizer_would_misread(tiny_tok, tmp_path):
    """transformers 5 picks the tokenizer class from config.model_type: a qwen2 directory reloads this
    byte-level BPE as Qwen2Tokenizer (its own normalizer and pre-tokenizer). Refuse, write nothing."""
    from vocablens.errors import CheckpointMismatch

    m = _tiny("qwen2", len(tiny_tok))
    ex = expand_vocab(m, tiny_tok, [" objectstatement"])
    with pytest.raises(CheckpointMismatch, match="Qwen2Tokenizer"):
        save_model_dir(ex.model, ex.tokenizer, tmp_path / "q", probe_texts=[_corpus()[4][:400]])
    assert list(tmp_path.iterdir()) == []


def test_adding_again_to_the_expanded_model_is_refused(tiny_tok):
    m = _tiny("llama_tied", len(tiny_tok))
    ex = expand_vocab(m, tiny_tok, [" objectstatement"])
    with pytest.raises(BadInput, match="already token 400"):
        expand_vocab(ex.model, ex.tokenizer, [" objectstatement"])
    ex2 = expand_vocab(ex.model, ex.tokenizer, [" qqzz"])  # a different token still goes in
    assert ex2.result.new_ids == [401] and _rows(ex2.model)[0].shape[0] == 402


def test_other_vocab_indexed_parameters_are_refused(tiny_tok):
    """transformers #45276 / #1730: a resize that misses a vocab-indexed tensor breaks the model."""
    from vocablens.errors import UnsupportedArchitecture

    m = _tiny("llama", len(tiny_tok))
    m.model.per_layer_embed = torch.nn.Parameter(torch.zeros(400, 8), requires_grad=False)
    with pytest.raises(UnsupportedArchitecture, match="per_layer_embed"):
        expand_vocab(m, tiny_tok, [" objectstatement"])
    with pytest.raises(UnsupportedArchitecture, match="per_layer_embed"):
        trim_vocab(m, tiny_tok, {5, 6})


def test_token_list_reads_ids_and_vocabulary_strings(tiny_tok):
    from vocablens.surgery.trim import read_token_list

    s = tiny_tok.convert_ids_to_tokens(300)
    assert read_token_list(["id:17", s, "", "  "], tiny_tok) == {17, 300}
    with pytest.raises(BadInput, match="line 1"):
        read_token_list(["not-a-token-\u2603\u2603"], tiny_tok)
    # a number is a token's text, as everywhere a token is named: an id only when written id:N
    five = tiny_tok.convert_tokens_to_ids("5")
    assert five != 5 and read_token_list(["5"], tiny_tok) == {five}
    with pytest.raises(BadInput, match=r"line 2: '17' is not a token of the vocabulary \(an id is written id:17\)"):
        read_token_list(["5", "17"], tiny_tok)


def test_failed_save_with_force_keeps_the_existing_directory(tiny_tok, tmp_path):
    """--force replaces ``out`` only once the new directory is complete and checked: a save that
    fails after writing the weights leaves the old directory exactly as it was, and no temporary."""
    from vocablens.errors import CheckpointMismatch

    out = tmp_path / "q"
    out.mkdir()
    (out / "config.json").write_text("old")
    m = _tiny("qwen2", len(tiny_tok))
    ex = expand_vocab(m, tiny_tok, [" objectstatement"])
    with pytest.raises(CheckpointMismatch):
        save_model_dir(ex.model, ex.tokenizer, out, force=True, probe_texts=[_corpus()[4][:400]])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]
    assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").read_text() == "old"


def test_trim_acceptance_rule():
    """A trim is kept only when tokenization is identical and log-probs agree within 1e-5 nats."""
    from dataclasses import replace

    from vocablens.errors import VocabLensError
    from vocablens.surgery import TRIM_LOGPROB_TOLERANCE, TrimVerification, accept_trim

    fields = {f: 0 for f in TrimVerification.__dataclass_fields__}
    ok = TrimVerification(**{**fields, "tokenization_identical": True, "logprobs_max_abs_diff": 3e-6})
    accept_trim(ok, 0)
    assert TRIM_LOGPROB_TOLERANCE == 1e-5
    for v, mismatches, what in ((ok, 1, "1 corpus documents"),
                                (replace(ok, tokenization_identical=False), 0, "0 corpus documents"),
                                (replace(ok, logprobs_max_abs_diff=2e-5), 0, "2.00e-05"),
                                (replace(ok, logprobs_max_abs_diff=float("nan")), 0, "nan")):
        with pytest.raises(VocabLensError, match=what):
            accept_trim(v, mismatches)


# ------------------------------------------- the verifications against a whole-matrix float64 oracle
def _f64_logprobs(model, ids, n_real):
    """The oracle: the model's [T, rows] logits, float64, padding at -inf, one whole log_softmax."""
    with torch.no_grad():
        lg = model(input_ids=torch.tensor([ids])).logits[0].double()
    lg[:, n_real:] = float("-inf")
    return torch.log_softmax(lg, -1)


def test_verify_expansion_equals_float64_whole_matrix(tiny_tok):
    """verify_expansion reads the logits block by block (ops.rows, float64): every figure equals the
    whole [T, V] float64 log-softmax's (padding rows masked) up to float64 rounding."""
    from vocablens.ops import rows as ops_rows

    m = _tiny("phi", len(tiny_tok) + 8, seed=3)
    toks = [" objectstatement", " qqzz of"]
    ex = expand_vocab(m, tiny_tok, toks, init="mean")
    texts = [TEXT, _corpus()[5][:300]]
    old_block = ops_rows.ROW_BLOCK_BYTES
    try:
        ops_rows.ROW_BLOCK_BYTES = 3 * 8 * 420  # blocks of 3 rows: many blocks per text
        v = verify_expansion(m, tiny_tok, ex.model, ex.tokenizer, ex.result.new_ids, texts, 400, TEXT)
    finally:
        ops_rows.ROW_BLOCK_BYTES = old_block
    n_old, n_new, nid = len(tiny_tok), len(ex.tokenizer), ex.result.new_ids
    mass, kl, nll_b, nll_a, cnt_b, cnt_a = [], [], 0.0, 0.0, 0, 0
    for t in texts:
        io = tiny_tok(t, add_special_tokens=False).input_ids[:256]
        inn = ex.tokenizer(t, add_special_tokens=False).input_ids[:256]
        lo = _f64_logprobs(m, io, n_old)[:, :n_old]
        ln = _f64_logprobs(ex.model, io, n_new)
        mass.append(ln[:, nid].exp().sum(-1))
        kl.append((lo.exp() * (lo - ln[:, :n_old])).sum(-1))
        nll_b -= float(lo[:-1].gather(1, torch.tensor(io[1:])[:, None]).sum())
        la = _f64_logprobs(ex.model, inn, n_new)
        nll_a -= float(la[:-1].gather(1, torch.tensor(inn[1:])[:, None]).sum())
        cnt_b, cnt_a = cnt_b + len(io) - 1, cnt_a + len(inn) - 1
    mass, kl = torch.cat(mass), torch.cat(kl)
    assert v.positions == mass.numel()
    assert v.new_token_mass == pytest.approx(float(mass.mean()), rel=1e-12, abs=1e-300)
    assert v.new_token_mass_max == pytest.approx(float(mass.max()), rel=1e-12, abs=1e-300)
    assert v.kl_old_new == pytest.approx(float(kl.mean()), rel=1e-9, abs=1e-15)
    assert v.perplexity_before == pytest.approx(math.exp(nll_b / cnt_b), rel=1e-12)
    assert v.perplexity_after == pytest.approx(math.exp(nll_a / cnt_a), rel=1e-12)
    assert v.kl_old_new > 0 and v.new_token_mass > 0


def test_verify_trim_equals_float64_whole_matrix(tiny_tok):
    """verify_trim through ops.rows: the conditioned log-prob difference, the dropped mass and both
    perplexities equal the whole [T, V] float64 computation's up to float64 rounding."""
    m = _tiny("phi", len(tiny_tok) + 4, seed=5)
    corpus = [t[:300] for t in _corpus()[:6]]
    tr = trim_vocab(m, tiny_tok, corpus_token_ids(tiny_tok, corpus))
    v = verify_trim(m, tiny_tok, tr.model, tr.tokenizer, tr.kept_old_ids, corpus[:3], max_tokens=64)
    kept = torch.tensor(tr.kept_old_ids)
    n_old, n_new = len(tiny_tok), len(tr.tokenizer)
    dp, dropped, nb, na, cnt = 0.0, [], 0.0, 0.0, 0
    for t in corpus[:3]:
        io = tiny_tok(t, add_special_tokens=False).input_ids[:64]
        inn = tr.tokenizer(t, add_special_tokens=False).input_ids[:64]
        lo = _f64_logprobs(m, io, n_old)
        ln = _f64_logprobs(tr.model, inn, n_new)[:, :n_new]
        with torch.no_grad():
            raw = m(input_ids=torch.tensor([io])).logits[0].double()[:, kept]
        dp = max(dp, float((ln - torch.log_softmax(raw, -1)).abs().max()))
        dropped.append(1.0 - lo[:, kept].exp().sum(-1))
        nb -= float(lo[:-1].gather(1, torch.tensor(io[1:])[:, None]).sum())
        na -= float(ln[:-1].gather(1, torch.tensor(inn[1:])[:, None]).sum())
        cnt += len(io) - 1
    assert v.tokenization_identical and v.positions == sum(d.numel() for d in dropped)
    assert abs(v.logprobs_max_abs_diff - dp) <= 1e-12 and v.logprobs_max_abs_diff <= 1e-5
    assert v.dropped_mass == pytest.approx(float(torch.cat(dropped).mean()), rel=1e-9)
    assert v.perplexity_before == pytest.approx(math.exp(nb / cnt), rel=1e-12)
    assert v.perplexity_after == pytest.approx(math.exp(na / cnt), rel=1e-12)
