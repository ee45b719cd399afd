"""Loading only the borders: the same matrices as the full load, from a fraction of the memory."""

import pytest
import torch

from tiny_models import make_tiny
from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.lazy import load_borders_only


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
    assert torch.equal(lazy.W_E, full.W_E) and torch.equal(lazy.W_U, full.W_U)
    assert (lazy.b_U is None) == (full.b_U is None)
    if full.b_U is not None:
        assert torch.equal(lazy.b_U, full.b_U)
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


def test_tied_stays_one_matrix(saved):
    family, model, d = saved
    b = load_borders_only(str(d)).borders
    if model.config.tie_word_embeddings:
        assert b.tied and b.W_U.data_ptr() == b.W_E.data_ptr()


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


@pytest.mark.slow
def test_default_model_borders_only_equal_full():
    from vocablens.geometry import nearest_neighbors
    from vocablens.models import load

    full = load("smollm2")
    lazy = load_borders_only("smollm2")
    assert torch.equal(full.borders.W_E, lazy.borders.W_E) and lazy.borders.tied
    assert torch.equal(full.borders.final_norm.weight, lazy.borders.final_norm.weight)
    assert lazy.provenance.describe() == full.provenance.describe()
    a = nearest_neighbors(full.borders, full.tokenizer, [" king"], k=5).results[0].lists[0]
    b = nearest_neighbors(lazy.borders, lazy.tokenizer, [" king"], k=5).results[0].lists[0]
    assert torch.equal(a.ids, b.ids) and torch.equal(a.cosines, b.cosines)
