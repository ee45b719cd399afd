"""The lens path at layer L, at every position, for every family, against transformers' own logits.

The oracle is independent of the code under test: the model's logits come from a separate plain
forward (no vocablens hook on the model), and the lens path is vocablens's own: the residual stream
captured after the last block, then the final norm and the head (:attr:`Borders.unembedding`, i.e.
:class:`~vocablens.models.unembed.Unembedding`: norm, project_out, W_U, bias, scale, softcap). A
missed or doubled final norm, a lost bias, scale or softcap, or a wrong position shows here.
"""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from vocablens.models import Borders


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_lens_at_layer_L_equals_the_models_logits_at_every_position(family):
    model = tm.make_tiny(family)
    b = Borders.from_model(model)
    ids = tm.ids(batch=2, T=9, seed=3)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.double()  # [B, T, V], no vocablens hook on
        resid, _ = b.residual_stream(ids)  # [L+1, B, T, d]; the model's own logits are not used here
        lens = b.unembedding(resid[b.n_layers]).double()  # [B, T, V]
        via_unembedding = b.unembedding(resid[b.n_layers]).double()
    assert lens.shape == ref.shape == (2, 9, b.vocab_size)
    scale = max(1.0, float(ref.abs().max()))
    err = (lens - ref).abs().amax(dim=-1)  # [B, T]: every position checked
    assert float(err.max()) < 2e-5 * scale, (family, err)
    assert float((via_unembedding - ref).abs().max()) < 2e-5 * scale
    # and the lens at an earlier layer is a different distribution (the check can fail)
    with torch.no_grad():
        early = b.unembedding(resid[0]).double()
    assert float((early - ref).abs().max()) > 1e-3 * scale
