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
            lp = torch.log_softmax(b.softcap * torch.tanh((h @ b.unembedding.weight.T).double() / b.softcap), -1)
            kl = (final.exp() * (final - lp)).sum(-1)
            ent = -(lp.exp() * lp).sum(-1)
            torch.testing.assert_close(res.layers[layer].kl_to_final.double(), kl, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(res.layers[layer].entropy.double(), ent, rtol=1e-4, atol=1e-5)


def test_bad_arguments():
    b = Borders.from_model(make_tiny("llama"))
    x = ids(batch=1, T=4)[0]
    with pytest.raises(BadInput, match="`k`"):
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


class _Tok:
    """A tokenizer stand-in: ``real`` tokens (the rows beyond are padding), each named ``t{id}``."""

    def __init__(self, real: int) -> None:
        self.real = real

    def __len__(self) -> int:
        return self.real

    def convert_ids_to_tokens(self, i):
        return [f"t{j}" for j in i] if isinstance(i, list) else f"t{i}"


class _Shift:
    """A translator (tuned-lens stand-in): h -> h + h A_layer."""

    def __init__(self, L: int, d: int) -> None:
        self.A = 0.3 * torch.randn(L, d, d, generator=torch.Generator().manual_seed(4))

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return h + h @ self.A[layer]


@pytest.mark.parametrize("family", ["llama", "gemma2", "opt_project", "phi"])
def test_trajectory_streamed_equals_float64_full_rows(family):
    """The explorer's /api/trajectory (one streamed pass, ops.token_logprobs) against the float64 logits
    of every layer: rank among the real tokens (padding rows never counted), probability normalized
    over all V, top-1 over the real tokens; its JSON keys and lengths as before."""
    from types import SimpleNamespace

    from vocablens.models.tokens import token_str
    from vocablens.serve.adapters import trajectory_json

    model = make_tiny(family)
    V = model.get_output_embeddings().weight.shape[0]
    tok = _Tok(V - 6)
    b = Borders.from_model(model, tokenizer=tok)
    L, real = b.n_layers, b.real_vocab_size
    x = ids(batch=1, T=6)[0]
    with torch.no_grad():
        resid, _ = b.residual_stream(x[None])
    tuned = _Shift(L, b.d_model)
    from vocablens import Model

    lm = Model(model, tok, b, SimpleNamespace(to_dict=lambda: {"name": "tiny"}))
    lm.add_lens("tuned", tuned)  # the explorer reads the handle's tuned lens
    stream = lm.forward(x[None])  # the prompt's cached forward, as the explorer keeps it
    U = b.unembedding
    for tid in (7, int(real) - 1):
        out = trajectory_json(lm, x[None], stream, 3, tid, True)
        assert set(out) == {"tokens", "position", "token", "token_id", "n_layers", "logit", "tuned", "model"}
        for name, tr in (("logit", None), ("tuned", tuned)):
            ranks, probs, top1 = [], [], []
            for ly in range(L + 1):
                h = resid[ly, 0, 3:4].float()
                if tr is not None and ly < L:
                    h = tr.translate(ly, h)
                with torch.no_grad():
                    hn = U.float32().normed(h, torch.float32)[0].double()
                z = hn @ U.weight.double().T + (0 if U.bias is None else U.bias.double())
                z = z * U.logit_scale
                if U.softcap:
                    z = U.softcap * torch.tanh(z / U.softcap)
                ranks.append(int((z[:real] > z[tid]).sum()))
                probs.append(float(torch.log_softmax(z.detach(), -1)[tid].exp()))
                top1.append(token_str(tok, int(z[:real].argmax())))
            got = out[name]
            assert set(got) == {"rank", "prob", "top1"} and len(got["rank"]) == L + 1
            assert got["rank"] == ranks and got["top1"] == top1
            torch.testing.assert_close(torch.tensor(got["prob"], dtype=torch.float64), torch.tensor(probs, dtype=torch.float64),
                                       rtol=1e-4, atol=1e-7)


def test_kind_names_what_was_computed():
    """Issue 40, fault 1: ``kind="tuned"`` without a translator returned the logit lens labelled
    'tuned'. A kind is the lens computed, or the call refuses in one line before any forward."""
    from vocablens.errors import VocabLensError
    from vocablens.lens.logit import lens_batches
    from vocablens.vocab_space import settle

    b = Borders.from_model(make_tiny("llama"))
    x = ids(batch=1, T=5)[0]
    for call in (lambda: logit_lens(b, x, kind="tuned"),
                 lambda: logit_lens(b, [x, x[:3]], kind="tuned"),
                 lambda: lens_batches(b, [x], [None], kinds=["tuned"]),
                 lambda: settle(b, x[None], kind="tuned")):
        with pytest.raises(VocabLensError) as err:
            call()
        assert isinstance(err.value, BadInput) and "\n" not in str(err.value)
        assert "kind='tuned' needs a translator" in str(err.value)
    shift = _Shift(b.n_layers, b.d_model)
    with pytest.raises(BadInput, match="translator given is a tuned lens"):
        logit_lens(b, x, translator=shift, kind="logit")
    # the label by default, and when it is the lens computed
    assert logit_lens(b, x).kind == logit_lens(b, x, kind="logit").kind == "logit"
    tuned = logit_lens(b, x, translator=shift, kind="tuned")
    assert tuned.kind == "tuned" and logit_lens(b, x, translator=shift).kind == "tuned"
    # the tuned lens really read through the translator (not the logit lens relabelled)
    assert not torch.equal(tuned.layers[0].entropy, logit_lens(b, x).layers[0].entropy)
    assert settle(b, x[None], translator=shift).kind == "tuned" and settle(b, x[None]).kind == "logit"

    class _Named(_Shift):
        kind = "jacobian"

    named = _Named(b.n_layers, b.d_model)
    assert logit_lens(b, x, translator=named).kind == "jacobian"
    with pytest.raises(BadInput, match="translator given is a jacobian lens"):
        logit_lens(b, x, translator=named, kind="tuned")
