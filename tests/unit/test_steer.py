"""Steering by value vectors: selection by concept z-score, the hook, the folded weights, the effect."""

import pytest
import torch

from tiny_models import ids, make_tiny
from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import block_view
from vocablens.vocab_space.steer import concept_scores, steer
from vocablens.vocab_space.steer_eval import concept_mass, perplexity


@pytest.fixture(scope="module")
def tiny():
    return Borders.from_model(make_tiny("llama"))


def test_concept_scores_equal_brute_force(tiny):
    T = [3, 17, 40]
    layers, neurons, z = concept_scores(tiny, T)
    R = tiny.unembedding.readout(True, scaled=True)[: tiny.real_vocab_size].double()
    for b in range(tiny.n_layers):
        W = block_view(tiny, b).W_out.detach().double()          # [d_ff, d]
        S = W @ R.t()                                            # [d_ff, V]: every vector's logits
        ref = (S[:, T].mean(1) - S.mean(1)) / S.std(1, unbiased=False)
        sel = layers == b
        assert torch.equal(neurons[sel], torch.arange(W.shape[0]))
        assert torch.allclose(z[sel].double(), ref, atol=1e-4)


def test_selection_takes_extreme_z(tiny):
    T = [5, 6]
    layers, neurons, z = concept_scores(tiny, T)
    st = steer(tiny, promote=T, top_n=4, scale=3.0)
    assert [v.role for v in st.vectors] == ["promote"] * 4
    best = torch.argsort(z, descending=True)[:4]
    assert [(v.block, v.neuron) for v in st.vectors] == [(int(layers[i]), int(neurons[i])) for i in best]
    sup = steer(tiny, suppress=T, top_n=3, scale=2.0)
    worst = torch.argsort(z)[:3]
    assert [(v.block, v.neuron) for v in sup.vectors] == [(int(layers[i]), int(neurons[i])) for i in worst]
    abl = steer(tiny, suppress=T, top_n=3, suppress_mode="ablate")
    assert all(v.factor == 0.0 and v.role == "ablate" for v in abl.vectors)
    only_last = steer(tiny, promote=T, top_n=5, blocks=[tiny.n_layers - 1])
    assert {v.block for v in only_last.vectors} == {tiny.n_layers - 1}


def test_hook_equals_folded_weights_and_restores(tiny):
    x = ids()
    st = steer(tiny, promote=[7, 9], suppress=[11], top_n=5, scale=4.0)
    before = [p.detach().clone() for p in tiny.model.parameters()]
    with torch.no_grad():
        base = tiny.model(input_ids=x).logits
        with st:
            hooked = tiny.model(input_ids=x).logits
        with st.folded():
            folded = tiny.model(input_ids=x).logits
        after = tiny.model(input_ids=x).logits
    assert (hooked - base).abs().max() > 1e-4                  # the steering does something
    assert torch.allclose(hooked, folded, atol=1e-5)           # hook == folded weights
    assert torch.equal(after, base)                            # and both are gone afterwards
    assert all(torch.equal(a, p) for a, p in zip(before, tiny.model.parameters()))


def test_hook_scales_exactly_the_chosen_activations(tiny):
    """The down projection's input is multiplied by the factor on the chosen neurons only."""
    st = steer(tiny, promote=[2], top_n=3, scale=5.0, blocks=[0])
    mod = block_view(tiny, 0).mlp_out
    seen = {}
    def record(_mod, args, _out):  # returns None: a forward hook's return value would replace the output
        seen["in"] = args[0].detach().clone()

    h = mod.register_forward_hook(record)
    try:
        with torch.no_grad():
            tiny.model(input_ids=ids())
            plain = seen.pop("in")
            with st:
                tiny.model(input_ids=ids())
    finally:
        h.remove()
    idx = torch.tensor([v.neuron for v in st.vectors])
    # the hook runs before this forward hook sees the (scaled) input
    steered = seen["in"]
    assert torch.allclose(steered[..., idx], plain[..., idx] * 5.0, atol=1e-5)
    rest = torch.ones(plain.shape[-1], dtype=torch.bool)
    rest[idx] = False
    assert torch.equal(steered[..., rest], plain[..., rest])


def test_mass_and_perplexity_against_reference(tiny):
    x = ids(batch=1)[0]
    T = [4, 8, 15]
    m = concept_mass(tiny, x, T)
    with torch.no_grad():
        lp = torch.log_softmax(tiny.model(input_ids=x[None]).logits[0].double(), -1)
    assert torch.allclose(m.double(), lp[:, T].exp().sum(-1), atol=1e-6)
    ref = torch.exp(-lp[:-1].gather(1, x[1:, None]).mean())
    assert perplexity(tiny, [x]) == pytest.approx(float(ref), rel=1e-5)


def test_bad_arguments(tiny):
    for kw in ({}, {"promote": [1], "top_n": 0}, {"promote": [1], "top_n": True}, {"promote": [1], "scale": -1.0},
               {"promote": [1], "blocks": [tiny.n_layers]}, {"suppress": [1], "suppress_mode": "zero"},
               {"promote": [tiny.vocab_size + 5]}):
        with pytest.raises(BadInput):
            steer(tiny, **kw)


@pytest.mark.slow
def test_suppressing_day_names_on_the_default_model():
    """The real model: boosting the vectors that push day names down lowers their mass after
    'The meeting is on', at a small perplexity cost."""
    import vocablens.models as M

    lm = M.load("smollm2")
    b, tok = lm.borders, lm.tokenizer
    days = [tok.get_vocab()[t] for t in ("ĠMonday", "ĠTuesday", "ĠWednesday", "ĠThursday", "ĠFriday")]
    st = steer(b, suppress=days, top_n=10, scale=8.0)
    x = tok("The meeting is on", return_tensors="pt").input_ids[0]
    before = float(concept_mass(b, x, days)[-1])
    with st:
        after = float(concept_mass(b, x, days)[-1])
    assert after < 0.5 * before


def test_vector_top_tokens_equal_float64_readout(tiny):
    """steer.vector_top_tokens (one streamed scores pass for all vectors) against the float64 readout:
    the top tokens of R v for promote/ablate vectors, of -R v for suppress vectors, real rows only."""
    from vocablens.vocab_space.steer import vector_top_tokens

    st = steer(tiny, promote=[3, 17], suppress=[40], top_n=2)
    got = vector_top_tokens(tiny, st.vectors, k=4)
    R = tiny.unembedding.readout(True)[: tiny.real_vocab_size].double()
    assert len(got) == len(st.vectors) == 4 and {v.role for v in st.vectors} == {"promote", "suppress"}
    for v, ids_ in zip(st.vectors, got):
        s = R @ block_view(tiny, v.block).W_out[v.neuron].detach().double()
        assert ids_ == torch.topk(-s if v.role == "suppress" else s, 4).indices.tolist()
    assert vector_top_tokens(tiny, []) == []
