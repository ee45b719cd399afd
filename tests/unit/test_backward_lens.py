"""The backward lens (Katz et al. 2024) against autograd in float64 on tiny models.

The oracle re-runs the model once per layer with a plain forward hook that makes the stream at that
layer a leaf, differentiates ``-log_softmax(logits)[target]`` with ``torch.autograd.grad``, and
projects ``-g`` through W_U itself: no vocablens code on its path.
"""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from vocablens.errors import BadInput
from vocablens.lens.backward import backward_lens
from vocablens.models import Borders


def oracle_grad(model, b: Borders, ids: torch.Tensor, layer: int, target: int, pos: int) -> torch.Tensor:
    leaf = {}

    def pre(_m, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_(True)
        leaf["h"] = x
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def post(_m, _a, o):
        x = (o[0] if isinstance(o, tuple) else o).detach().requires_grad_(True)
        leaf["h"] = x
        return (x, *o[1:]) if isinstance(o, tuple) else x

    h = (b.blocks[0].register_forward_pre_hook(pre, with_kwargs=True) if layer == 0
         else b.blocks[layer - 1].register_forward_hook(post))
    try:
        with torch.enable_grad():
            logits = model(input_ids=ids[None], use_cache=False).logits[0, pos]
            loss = -torch.log_softmax(logits.double(), -1)[target]
            (g,) = torch.autograd.grad(loss, leaf["h"])
    finally:
        h.remove()
    return g[0, pos]


@pytest.mark.parametrize("family", ["llama", "gemma2", "opt_project"])
def test_backward_lens_equals_autograd_in_float64(family):
    model = tm.make_tiny(family).double()
    b = Borders.from_model(model)
    ids = tm.ids(batch=1, T=7, seed=6)[0]
    target, pos = 5, 4
    res = backward_lens(b, ids, target, position=pos, k=4)
    assert res.grads.shape == (b.n_layers + 1, b.d_model) and res.position == pos
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids[None]).logits[0, pos].double(), -1)[target]
    assert abs(res.loss + float(torch.log(p))) < 1e-9
    W = b.unembedding.weight.detach().double()
    for layer in range(b.n_layers + 1):
        g = oracle_grad(model, b, ids, layer, target, pos)
        assert torch.allclose(res.grads[layer].double(), g, atol=1e-6, rtol=1e-5), layer
        d = -g
        if b.project_out is not None:
            d = b.project_out(d.to(W.dtype)).detach()  # a linear map without bias on OPT
        scores = W @ d
        assert torch.equal(res.top_ids[layer], scores.topk(4).indices)
        assert abs(float(res.target_score[layer]) - float(scores[target])) < 1e-4 * max(1.0, float(scores.abs().max()))


def test_backward_lens_refusals_and_the_model_is_left_as_found():
    model = tm.make_tiny("llama")
    b = Borders.from_model(model)
    flags = [p.requires_grad for p in model.parameters()]
    ids = tm.ids(batch=1, T=5)[0]
    backward_lens(b, ids, 3)
    assert [p.requires_grad for p in model.parameters()] == flags
    with pytest.raises(BadInput, match="outside the vocabulary"):
        backward_lens(b, ids, b.vocab_size + 5)
    with pytest.raises(BadInput, match="position"):
        backward_lens(b, ids, 3, position=9)
    with pytest.raises(BadInput, match="`k`"):
        backward_lens(b, ids, 3, k=0)
