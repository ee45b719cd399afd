"""The one loader (:func:`vocablens.models.loader.load_mode`): every mode through one function, each
reading the matrices transformers' own model holds, and its argument checks."""

from __future__ import annotations

import pytest
import torch
from tiny_dirs import save_tiny, tiny_tokenizer

from vocablens.errors import BadInput
from vocablens.models.loader import MODES, load_mode


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("modes") / "m", tiny_tokenizer(), family="llama")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_reads_the_models_own_matrices(tiny_dir, mode):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
    lm = load_mode(str(tiny_dir), mode, max_memory="1kB" if mode == "streaming" else None)
    b = lm.borders
    assert torch.equal(b.W_E, ref.get_input_embeddings().weight)
    assert torch.equal(b.W_U, ref.get_output_embeddings().weight)
    assert b.tied is False
    forward = mode in ("full", "streaming")
    ids = torch.tensor([[0, 4, 9, 30]])
    if forward:
        with torch.no_grad():
            want = ref(input_ids=ids).logits
        assert torch.allclose(b.residual_stream(ids)[1], want, atol=1e-5, rtol=1e-5)
    else:
        with pytest.raises(BadInput):
            b.residual_stream(ids)


def test_borders_mode_reads_one_block(tiny_dir):
    lm = load_mode(str(tiny_dir), "borders", blocks=[1])
    assert not any(p.is_meta for p in lm.borders.blocks[1].parameters())
    assert all(p.is_meta for p in lm.borders.blocks[0].parameters())


@pytest.mark.parametrize("kw, match", [
    (dict(mode="lazy"), "unknown loading mode"),
    (dict(mode="streaming"), "needs max_memory"),
    (dict(mode="streaming", max_memory="lots"), "`max_memory` takes a size"),
    (dict(mode="full", max_memory="1GB"), "streaming mode"),
    (dict(mode="head", blocks=[0]), "borders mode only"),
    (dict(mode="streaming", max_memory="1GB", device="meta"), "CPU memory"),
])
def test_bad_arguments_are_one_line_before_loading(kw, match):
    with pytest.raises(BadInput, match=match) as e:
        load_mode("/nonexistent/model/dir", **kw)
    assert "\n" not in str(e.value)
