"""Loading only the borders: the same matrices as the full load, from a fraction of the memory."""

import pytest
import torch

from tiny_models import make_tiny, writes_through
from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.files.partial import load_borders_only
from vocablens.models.files.matrices_only import MatricesOnly
from vocablens.models.files.partial import load_matrices_only


@pytest.fixture(scope="module", params=["llama", "llama_tied", "gpt2", "opt", "qwen3", "gemma3_text"])
def saved(request, tmp_path_factory):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401

    model = make_tiny(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, safe_serialization=True)
    _write_tokenizer(d, model.config.vocab_size)
    return request.param, model, d


def _write_tokenizer(d, V):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(V)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0").save_pretrained(d)


def test_borders_only_equal_full_load(saved):
    from vocablens.models import load

    family, model, d = saved
    full = load(str(d)).borders
    lazy = load_borders_only(str(d)).borders
    assert lazy.tied == full.tied and lazy.family == full.family
    assert torch.equal(lazy.W_E, full.W_E) and torch.equal(lazy.unembedding.weight, full.unembedding.weight)
    assert (lazy.unembedding.bias is None) == (full.unembedding.bias is None)
    if full.unembedding.bias is not None:
        assert torch.equal(lazy.unembedding.bias, full.unembedding.bias)
    if full.final_norm is not None:
        for (n, p), (_, q) in zip(full.final_norm.named_parameters(), lazy.final_norm.named_parameters()):
            assert torch.equal(p, q), n
    # the readout through the final norm is the same
    u = torch.randn(3, full.d_model)
    assert torch.allclose(lazy.unembedding.readout(True) @ u.T, full.unembedding.readout(True) @ u.T)
    # the blocks were never read
    assert all(p.is_meta for p in lazy.blocks.parameters())
    with pytest.raises(BadInput, match="borders only"):
        lazy.residual_stream(torch.tensor([[1, 2, 3]]))


def _transformers_ties(d) -> bool:
    """The oracle: transformers' own model from ``d`` sees a write into its embedding in its head."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    return writes_through(m.get_input_embeddings().weight, m.get_output_embeddings().weight)


def test_tied_stays_one_matrix(saved):
    family, model, d = saved
    b = load_borders_only(str(d)).borders
    tied = _transformers_ties(d)
    assert tied == bool(model.config.get_text_config().tie_word_embeddings)  # what the config says
    assert b.tied is tied and (b.unembedding.weight is b.W_E) is tied  # one matrix exactly when transformers keeps one


def test_config_that_disagrees_with_the_weights(tmp_path):
    import json

    model = make_tiny("llama")
    model.save_pretrained(tmp_path, safe_serialization=True)
    _write_tokenizer(tmp_path, model.config.vocab_size)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 2 * cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CorruptModelFile, match="disagree"):
        load_borders_only(str(tmp_path))


def test_matrices_only_equal_full_load(saved):
    from transformers import AutoTokenizer

    from vocablens.geometry.embedding import nearest_neighbors
    from vocablens.models import load

    family, model, d = saved
    full = load(str(d))
    lm = load_matrices_only(str(d))
    b = lm.borders
    assert torch.equal(b.W_E, full.borders.W_E) and torch.equal(b.unembedding.weight, full.borders.unembedding.weight)
    assert b.tied == full.borders.tied and b.vocab_size == full.borders.vocab_size
    assert b.real_vocab_size == full.borders.real_vocab_size and b.family == full.borders.family
    assert type(lm.tokenizer) is type(AutoTokenizer.from_pretrained(str(d)))
    assert lm.tokenizer("t3 t5 t7")["input_ids"] == full.tokenizer("t3 t5 t7")["input_ids"]
    assert lm.provenance.describe() == full.provenance.describe()
    a = nearest_neighbors(full.borders, full.tokenizer, ["t5"], k=4).results[0]
    c = nearest_neighbors(b, lm.tokenizer, ["t5"], k=4).results[0]
    for x, y in zip(a.lists, c.lists):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.cosines, y.cosines)
    if isinstance(lm.model, MatricesOnly):  # read without transformers' model classes
        assert b.tied is _transformers_ties(d) and (b.unembedding.weight is b.W_E) is b.tied
        with pytest.raises(BadInput, match="two matrices only"):
            b.unembedding(torch.randn(2, b.d_model))
        with pytest.raises(BadInput, match="borders only"):
            b.residual_stream(torch.tensor([[1, 2, 3]]))
    else:  # OPT keeps project_in/out: the borders loader reads it, same matrices
        assert family == "opt"


def test_one_block_equals_full_load(saved):
    from vocablens import vocab_space as vs
    from vocablens.models import load

    family, model, d = saved
    full = load(str(d)).borders
    one = load_borders_only(str(d), blocks=[1]).borders
    for (n, p), (_, q) in zip(full.blocks[1].named_parameters(), one.blocks[1].named_parameters()):
        assert torch.equal(p, q), n
    assert all(p.is_meta for p in one.blocks[0].parameters())
    for kind in ("value", "key"):
        a = vs.project_vectors(full, [1, 1], [0, 3], k=5, kind=kind)
        c = vs.project_vectors(one, [1, 1], [0, 3], k=5, kind=kind)
        for f in ("norms", "top_ids", "top_scores", "bottom_ids", "bottom_scores"):
            assert torch.equal(getattr(a, f), getattr(c, f)), (kind, f)
    with pytest.raises(BadInput, match="out of range"):
        load_borders_only(str(d), blocks=[2])


def _same(a, b):
    import dataclasses

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f.name


def test_value_vectors_only_equal_full_load(saved):
    from vocablens import vocab_space as vs
    from vocablens.models import load

    family, model, d = saved
    full = load(str(d)).borders
    vals = load_borders_only(str(d), value_vectors=True).borders
    assert any(p.is_meta for p in vals.blocks.parameters())  # attention and keys were not read
    for a, b in zip(vs.search_tokens(full, [5, 9], k=3), vs.search_tokens(vals, [5, 9], k=3)):
        _same(a, b)
    _same(vs.project_vectors(full, [0, 1], [2, 7], k=4), vs.project_vectors(vals, [0, 1], [2, 7], k=4))


@pytest.mark.slow
def test_default_model_matrices_only_neighbors_equal_full():
    from vocablens.geometry.embedding import nearest_neighbors
    from vocablens.models import load

    full = load("smollm2")
    lm = load_matrices_only("smollm2")
    assert isinstance(lm.model, MatricesOnly) and lm.borders.tied
    assert torch.equal(full.borders.W_E, lm.borders.W_E)
    assert type(lm.tokenizer) is type(full.tokenizer) and len(lm.tokenizer) == len(full.tokenizer)
    ids = list(range(0, lm.borders.vocab_size, 97))
    assert lm.tokenizer.convert_ids_to_tokens(ids) == full.tokenizer.convert_ids_to_tokens(ids)
    text = "The capital of France is Paris. <|im_start|>user\n naïve 日本"
    assert lm.tokenizer(text)["input_ids"] == full.tokenizer(text)["input_ids"]
    a = nearest_neighbors(full.borders, full.tokenizer, [" king"], k=5).results[0].lists[0]
    b = nearest_neighbors(lm.borders, lm.tokenizer, [" king"], k=5).results[0].lists[0]
    assert torch.equal(a.ids, b.ids) and torch.equal(a.cosines, b.cosines)


@pytest.mark.slow
def test_default_model_borders_only_equal_full():
    from vocablens.geometry.embedding import nearest_neighbors
    from vocablens.models import load

    full = load("smollm2")
    lazy = load_borders_only("smollm2")
    assert torch.equal(full.borders.W_E, lazy.borders.W_E) and lazy.borders.tied
    assert torch.equal(full.borders.final_norm.weight, lazy.borders.final_norm.weight)
    assert lazy.provenance.describe() == full.provenance.describe()
    a = nearest_neighbors(full.borders, full.tokenizer, [" king"], k=5).results[0].lists[0]
    b = nearest_neighbors(lazy.borders, lazy.tokenizer, [" king"], k=5).results[0].lists[0]
    assert torch.equal(a.ids, b.ids) and torch.equal(a.cosines, b.cosines)


@pytest.mark.parametrize("cls", ["GPT2Tokenizer", "LlamaTokenizer", "PreTrainedTokenizerFast"])
def test_light_tokenizer_picks_the_class_autotokenizer_picks(tmp_path, cls):
    """The borders-only load reads the tokenizer through light_tokenizer (AutoTokenizer parsed
    tokenizer.json twice); it must be the fast class AutoTokenizer gives, also where the config names
    the slow one (transformers 4 exports both)."""
    import json

    from transformers import AutoTokenizer

    from vocablens.models.files.tokenizer_files import light_tokenizer

    _write_tokenizer(tmp_path, 50)
    p = tmp_path / "tokenizer_config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "tokenizer_class": cls}))
    light, auto = light_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(light) is type(auto)
    assert light("t3 t7 t49")["input_ids"] == auto("t3 t7 t49")["input_ids"]
    assert light.get_vocab() == auto.get_vocab()
