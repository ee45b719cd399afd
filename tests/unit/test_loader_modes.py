"""The one loader (:func:`vocablens.models.files.loader.load_mode`): every mode through one function, each
reading the matrices transformers' own model holds, and its argument checks."""

from __future__ import annotations

import pytest
import torch
from tiny_dirs import save_tiny, tiny_tokenizer

from vocablens.errors import BadInput
from vocablens.models.files.loader import MODES, load_mode


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
    assert torch.equal(b.unembedding.weight, ref.get_output_embeddings().weight)
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


# ------------------------------------------------------------------ the one entry: load(spec, read=...)
def test_each_mode_is_a_read_of_the_one_entry(tiny_dir):
    from vocablens.models.files.loader import MODE_READS, load
    from vocablens.models.files.matrices_only import MatricesOnly
    from vocablens.models.files.partial import BORDERS

    assert MODE_READS["borders"] == BORDERS and set(MODE_READS) == set(MODES)
    ref = load(str(tiny_dir))  # the whole model, through transformers
    for read, light in ((("head", "final_norm"), True), (("embedding", "head"), True), (BORDERS, False)):
        lm = load(str(tiny_dir), read=read)
        assert isinstance(lm.model, MatricesOnly) is light, read   # no modeling code for the matrices and the norm
        assert torch.equal(lm.borders.unembedding.weight, ref.borders.unembedding.weight) and torch.equal(lm.borders.W_E, ref.borders.W_E)
        assert all(p.is_meta for blk in lm.borders.blocks for p in blk.parameters()) or light
    h = torch.randn(2, 3, ref.borders.W_E.shape[1])
    normed = load(str(tiny_dir), read=("head", "final_norm")).borders.final_norm(h)
    assert torch.allclose(normed, ref.borders.final_norm(h), atol=0, rtol=0)  # the family's own module


def test_blocks_and_value_vectors_are_read_on_demand(tiny_dir):
    from transformers import AutoModelForCausalLM

    from vocablens.models.files.loader import load

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
    lm = load(str(tiny_dir), read=("input_embedding", "head", "final_norm"), blocks=[1])
    assert torch.equal(lm.borders.blocks[1].mlp.down_proj.weight, ref.model.layers[1].mlp.down_proj.weight)
    assert all(p.is_meta for p in lm.borders.blocks[0].parameters())
    vv = load(str(tiny_dir), read=("head", "value_vectors")).borders   # value vectors build the modules
    for i, blk in enumerate(vv.blocks):
        assert torch.equal(blk.mlp.down_proj.weight, ref.model.layers[i].mlp.down_proj.weight)
        assert blk.mlp.up_proj.weight.is_meta


def test_max_memory_streams_the_whole_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    from vocablens.models.files.loader import load

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).eval()
    lm = load(str(tiny_dir), max_memory="1kB")
    assert len(lm.model.vocablens_streamers) == len(lm.borders.blocks)  # nothing fits: every block streams
    ids = torch.tensor([[0, 4, 9, 30]])
    with torch.no_grad():
        assert torch.allclose(lm.borders.residual_stream(ids)[1], ref(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw, match", [
    (dict(read=("heads",)), "read takes parts of"),
    (dict(read=()), "read takes parts of"),
    (dict(blocks=[0]), "blocks are read with read"),
    (dict(read=("head",), blocks=["one"]), "block indices"),
    (dict(read=("head",), max_memory="1GB"), "whole-model load"),
    (dict(max_memory="1GB", device="meta"), "CPU memory"),
    (dict(max_memory="lots"), "`max_memory` takes a size"),
])
def test_bad_reads_are_one_line_before_loading(kw, match):
    from vocablens.models.files.loader import load

    with pytest.raises(BadInput, match=match) as e:
        load("/nonexistent/model/dir", **kw)
    assert "\n" not in str(e.value)


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the GPU half "
                           "of this test runs where torch.cuda.is_available()")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_CUDA)])
def test_every_read_is_placed_on_the_device_and_a_tied_matrix_stays_one(tiny_dir, tmp_path_factory, device):
    from vocablens.models.files.loader import MODE_READS, load

    tied_dir = save_tiny(tmp_path_factory.mktemp("tied") / "m", tiny_tokenizer(), family="llama_tied")
    for d, tied in ((tiny_dir, False), (tied_dir, True)):
        ref = load(str(d)).borders  # the whole model on the CPU
        h = torch.randn(3, 5, ref.W_E.shape[1])
        for read in [r for r in MODE_READS.values() if r is not None] + [("head", "final_norm", "value_vectors")]:
            lm = load(str(d), read=read, device=device, blocks=[1] if "input_embedding" in read else None)
            b = lm.borders
            real = [t for t in [*lm.model.parameters(), *lm.model.buffers()] if not t.is_meta]
            assert real and all(t.device.type == device for t in real), read
            assert b.tied is tied and (b.unembedding.weight.data_ptr() == b.W_E.data_ptr()) is tied, read  # one tensor when tied
            assert torch.equal(b.unembedding.weight.cpu(), ref.unembedding.weight) and torch.equal(b.W_E.cpu(), ref.W_E)
            if "input_embedding" in read:
                assert all(p.is_meta for p in b.blocks[0].parameters())           # blocks not read stay on meta
                assert all(p.device.type == device for p in b.blocks[1].parameters())
            if "final_norm" in read:
                got = b.final_norm(h.to(device)).cpu()
                torch.testing.assert_close(got, ref.final_norm(h), rtol=1e-5, atol=1e-5)
