"""Logit lens: layer L equals the model's own output on every family; the real model's known case."""

import pytest
import torch

from tiny_models import FAMILIES, ids, make_tiny
from vocablens.errors import BadInput
from vocablens.lens import logit_lens
from vocablens.render.lens import lens_to_dict
from vocablens.lens.logit import layer_logprobs
from vocablens.models import Borders
from vocablens.models.tokens import encode_prompt


@pytest.mark.parametrize("family", FAMILIES)
def test_last_layer_equals_model_output(family):
    model = make_tiny(family)
    b = Borders.from_model(model)
    x = ids(batch=1, T=6)[0]
    res = logit_lens(b, x, positions="all", k=3)
    with torch.no_grad():
        p_model = torch.softmax(model(x[None]).logits[0].float(), -1)
    # rebuild the layer-L distribution from the lens output's top-1 and the full recomputation
    assert res.model_max_abs_diff <= 1e-5
    with torch.no_grad():
        resid, _ = b.residual_stream(x[None])
        p_lens = layer_logprobs(b, resid[-1, 0], b.n_layers).exp()
    assert (p_lens - p_model).abs().max() <= 1e-5
    last = res.layers[-1]
    assert torch.equal(last.top_ids[:, 0], p_model.argmax(-1))
    assert torch.all(last.kl_to_final.abs() <= 1e-5) and torch.all(last.final_top1_rank == 0)
    assert len(res.layers) == b.n_layers + 1


def test_kl_and_entropy_match_direct_computation():
    model = make_tiny("gemma2")  # softcap and sqrt(d) scale on the path
    b = Borders.from_model(model)
    x = ids(batch=1, T=5)[0]
    res = logit_lens(b, x, positions="all", k=2)
    with torch.no_grad():
        resid, logits = b.residual_stream(x[None])
        final = torch.log_softmax(logits[0].double(), -1)
        for layer in (0, 1):
            h = b.final_norm(resid[layer, 0])
            lp = torch.log_softmax(b.softcap * torch.tanh((h @ b.W_U.T).double() / b.softcap), -1)
            kl = (final.exp() * (final - lp)).sum(-1)
            ent = -(lp.exp() * lp).sum(-1)
            torch.testing.assert_close(res.layers[layer].kl_to_final.double(), kl, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(res.layers[layer].entropy.double(), ent, rtol=1e-4, atol=1e-5)


def test_bad_arguments():
    b = Borders.from_model(make_tiny("llama"))
    x = ids(batch=1, T=4)[0]
    with pytest.raises(BadInput, match="-k"):
        logit_lens(b, x, k=0)
    with pytest.raises(BadInput, match="layer 9"):
        logit_lens(b, x, layers=[0, 9])
    with pytest.raises(BadInput, match="position"):
        logit_lens(b, x, positions=[7])
    with pytest.raises(BadInput, match="empty"):
        logit_lens(b, torch.zeros(0, dtype=torch.long))


@pytest.mark.slow
def test_real_model_paris(smollm2):
    model, tok, b, _ = smollm2
    x = encode_prompt(tok, "The capital of France is")
    res = logit_lens(b, x, k=5)
    d = lens_to_dict(res, tok)
    assert d["layers"][-1]["positions"][0]["top_tokens"][0] == " Paris"
    assert d["layers"][-1]["layer"] == 30 and len(d["layers"]) == 31
    assert res.model_max_abs_diff <= 1e-5
    # the answer appears only late: rank of " Paris" at layer 0 is far from the top
    assert d["layers"][0]["positions"][0]["final_top1_rank"] > 100
    assert set(d["layers"][0]) == {"layer", "positions"}  # one position: still a list of one
    assert set(d["layers"][0]["positions"][0]) >= {"position", "top_tokens", "top_probs", "entropy", "kl_to_final"}


def test_layer_L_comes_from_the_model_logits_and_the_check_still_reads_the_lens_path(monkeypatch):
    """Layer L's statistics are read off the model's own logits (no second GEMM), so they do not move
    when the lens path is broken; ``model_max_abs_diff`` still runs the lens path (final norm, head)
    at the last position, so a broken path shows there."""
    import vocablens.lens.logit as LL

    b = Borders.from_model(make_tiny(FAMILIES[0]))
    x = ids(batch=1, T=6)[0]
    ok = logit_lens(b, x, positions="all", k=3)
    assert ok.model_max_abs_diff <= 1e-5
    assert logit_lens(b, x, k=3).model_max_abs_diff == ok.model_max_abs_diff  # same row read
    real = LL.lens_states
    monkeypatch.setattr(LL, "lens_states", lambda *a, **kw: real(*a, **kw) * 1.5)  # a wrong head input
    bad = logit_lens(b, x, positions="all", k=3)
    assert bad.model_max_abs_diff > 1e-3
    assert torch.equal(bad.layers[-1].top_ids, ok.layers[-1].top_ids)
    assert torch.equal(bad.layers[-1].entropy, ok.layers[-1].entropy)
    assert not torch.equal(bad.layers[0].entropy, ok.layers[0].entropy)
