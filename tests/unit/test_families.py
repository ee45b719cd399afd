"""The Borders adapter on tiny random models of every supported family."""

import copy

import pytest
import torch

from tiny_models import FAMILIES, ids, make_tiny, writes_through
from vocablens.errors import UnsupportedArchitecture
from vocablens.models import Borders


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    model = make_tiny(request.param)
    return request.param, model, Borders.from_model(model)


def test_recomposed_logits_equal_model(tiny):
    family, model, b = tiny
    x = ids()
    with torch.no_grad():
        resid, logits = b.residual_stream(x)
        # Recompose: final norm -> (project_out) -> W_U (+ bias) -> scale -> softcap, by hand.
        h = resid[-1]
        if b.final_norm is not None:
            h = b.final_norm(h)
        if b.project_out is not None:
            h = b.project_out(h)
        manual = h @ b.unembedding.weight.T
        if b.unembedding.bias is not None:
            manual = manual + b.unembedding.bias
        manual = manual * b.logit_scale
        if b.softcap is not None:
            manual = b.softcap * torch.tanh(manual / b.softcap)
    assert resid.shape == (b.n_layers + 1, *x.shape, b.d_model)
    assert (manual - logits).abs().max().item() <= 1e-4
    assert (b.unembedding(resid[-1]) - logits).abs().max().item() <= 1e-4


def test_layer_zero_is_embedding_output(tiny):
    """Embedding.lookup is, bit for bit, what block 0 reads from the token embedding (the input scale,
    BLOOM's embedding norm, OPT's project_in, each where and how the model applies it). Families with
    learned absolute positions (GPT-2's wpe, OPT's embed_positions) add position rows after it: a copy
    with those rows zeroed shows the token part alone."""
    family, model, b = tiny
    x = ids()
    E = b.input_embedding
    assert (E.positions is not None) == (family in ("gpt2", "opt", "opt_project"))
    assert (E.input_norm is not None) == (family == "bloom")
    assert (E.project_in is not None) == (family == "opt_project")
    if E.positions is not None:
        model = copy.deepcopy(model)
        b = Borders.from_model(model)
        with torch.no_grad():
            for p in b.input_embedding.positions.parameters():
                p.zero_()
    with torch.no_grad():
        resid, _ = b.residual_stream(x)
        emb = b.input_embedding.lookup(x)
    assert emb.shape == (*x.shape, b.d_model) and emb.dtype == b.W_E.dtype
    assert torch.equal(resid[0], emb)
    assert torch.equal(b.embed(x), emb)


def test_family_facts(tiny):
    family, model, b = tiny
    assert b.vocab_size == model.config.vocab_size
    # tied: transformers' model sees a write into its input embedding in its own head, and a model
    # built from a config ties exactly when the config says so
    tied = writes_through(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    assert b.tied is tied
    assert tied == bool(model.config.get_text_config().tie_word_embeddings), family
    if family.startswith("gemma"):
        expected = torch.tensor(b.d_model ** 0.5, dtype=b.W_E.dtype).item()
        assert b.embed_scale == expected
    if family in ("gemma2", "gemma3_text"):
        assert b.softcap == model.config.final_logit_softcapping
    if family == "opt_project":
        assert b.project_out is not None and b.final_norm is None and b.d_emb != b.d_model
    if family == "phi":
        assert b.unembedding.bias is not None
    if family == "cohere":
        assert b.logit_scale == pytest.approx(0.25)
    if family == "granite":
        assert b.logit_scale == pytest.approx(1 / 2.5) and b.embed_scale == 3.0


def test_tied_decided_by_storage_not_config():
    model = make_tiny("llama_tied")
    assert Borders.from_model(model).tied
    # Untie by storage while the config still says tied.
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert model.config.tie_word_embeddings
    assert not writes_through(model.model.embed_tokens.weight, model.lm_head.weight)  # the oracle agrees
    assert not Borders.from_model(model).tied
    # a head that is a view of the embedding's storage (not the same Parameter) is one matrix
    model = make_tiny("llama_tied")
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.data[:])
    assert writes_through(model.model.embed_tokens.weight, model.lm_head.weight)
    assert Borders.from_model(model).tied


def test_unsupported_family_names_family_and_modules():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Linear(4, 4)

        def get_input_embeddings(self):
            return torch.nn.Embedding(10, 4)

        def get_output_embeddings(self):
            return None

    with pytest.raises(UnsupportedArchitecture) as ei:
        Borders.from_model(Odd())
    assert "Odd" in str(ei.value) and "encoder" in str(ei.value)
