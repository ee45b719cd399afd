"""Decoder blocks, embedding and stream found from the model itself (issue 50, A).

Llama 4 (``Llama4ForConditionalGeneration``, text config ``llama4_text``) was refused with "no list of
decoder blocks found": its causal-LM class keeps the text model under a name the lookup did not list.
Here a tiny Llama 4 (tiny text and vision configs, random weights) is saved as a user would, with the
default model's tokenizer, and loaded: the readout check passes, and the lens at layer L and the score
equal the model's own logits and log-probabilities, computed by the composite class itself (its
vision tower in memory). The vision tower's blocks are never taken for the text model's, also when
the first lookup is told to: the probe forward keeps the list the stream flows through."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vocablens.errors import UnsupportedArchitecture

TEXT = "The class statement defines a new type."


def _tiny_llama4(V: int):
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = dict(hidden_size=64, intermediate_size=96, intermediate_size_mlp=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2, vocab_size=V,
                max_position_embeddings=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(0)
    m = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision,
                                                     image_token_index=V - 1)).eval()
    with torch.no_grad():  # norms away from 1 and a sharp head, so a missed norm or scale shows
        for n, p in m.named_parameters():
            if "norm" in n and p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
        m.get_output_embeddings().weight.mul_(20.0)
    return m


@pytest.fixture(scope="module")
def llama4_dir(tmp_path_factory):
    from vocablens.models.files.source import resolve_source
    from vocablens.models.files.sources import source_dir
    from vocablens.models.files.tokenizer_files import light_tokenizer

    tok = light_tokenizer(source_dir(resolve_source("smollm2"))[0])
    d = tmp_path_factory.mktemp("llama4") / "tiny-llama4"
    m = _tiny_llama4(len(tok))
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def own(llama4_dir):
    """The composite model, read back by its own class (the reference: no vocablens hook on it)."""
    from transformers import Llama4ForConditionalGeneration

    return Llama4ForConditionalGeneration.from_pretrained(llama4_dir).eval()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))


def test_tiny_llama4_loads_and_its_lens_and_score_equal_the_models_own(llama4_dir, own):
    import vocablens

    m = vocablens.load(str(llama4_dir))
    assert m.provenance.readout.startswith("checked: max |Δp| = ")
    b = m.borders
    assert b.n_layers == 2 and all(type(blk).__name__ == "Llama4TextDecoderLayer" for blk in b.blocks)
    assert b.d_model == 64  # the text config's hidden size (the vision tower's is 32)
    ids = m.encode(TEXT)  # [1, T]
    with torch.no_grad():
        ref = own(input_ids=ids).logits[0].double()  # [T, V]
    ref_p = torch.softmax(ref, -1)
    res = m.lens(TEXT, k=5, positions="all")[0]
    top = res.layers[-1]
    assert res.n_layers == 2 and top.layer == 2
    assert torch.equal(top.top_ids, ref_p.topk(5, -1).indices)
    assert torch.allclose(top.top_probs.double(), ref_p.topk(5, -1).values, atol=1e-5, rtol=0)
    resid, _ = b.residual_stream(ids)
    assert float((b.unembedding(resid[-1])[0].double() - ref).abs().max()) < 1e-4 * max(1.0, float(ref.abs().max()))
    own_lp = torch.log_softmax(ref, -1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    got = m.score(TEXT, top_k=0).value.logprobs.double()
    assert torch.allclose(got, own_lp, atol=2e-4, rtol=0)
    # and the lens at layer 0 is another distribution (the comparison can fail)
    assert float((b.unembedding(resid[0])[0].double() - ref).abs().max()) > 1e-2


def test_the_composite_class_itself_reads_its_text_model(own):
    """Borders of ``Llama4ForConditionalGeneration`` (vision tower in memory, both towers with 2
    blocks): the text model's blocks and its readout, checked against the model's own logits."""
    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    b, check = find_readout(Borders.from_model(own))
    assert b.blocks is own.language_model.model.layers and b.family == "llama4"
    assert b.config is own.config.text_config and check.max_dp <= check.tolerance
    assert b.embedding is own.language_model.model.embed_tokens


def test_the_probe_keeps_the_list_the_stream_flows_through(own):
    """Told the vision tower's blocks, the probe forward (text only: the vision tower does not run)
    replaces them with the text model's."""
    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    wrong = Borders.from_model(own).replace(blocks=own.vision_model.model.layers)
    b, check = find_readout(wrong)
    assert b.blocks is own.language_model.model.layers and check.max_dp <= check.tolerance


class _NoBlocks(nn.Module):
    """Embedding and head, nothing between them in a list."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.mix = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 10, bias=False)

    def get_input_embeddings(self):
        return self.emb

    def get_output_embeddings(self):
        return self.head


def test_a_model_without_a_list_of_blocks_is_refused_saying_so():
    from vocablens.models.borders import Borders

    with pytest.raises(UnsupportedArchitecture, match="no list of repeated blocks") as e:
        Borders.from_model(_NoBlocks())
    assert "\n" not in str(e.value)


def test_a_logit_multiplier_of_a_composite_model_is_read_off_even_when_probabilities_are_flat():
    """Aya Vision multiplies its Cohere 2 text model's logits by ``logit_scale`` (1/16) in the composite
    class; on a tiny random model every probability is ~1/V, so |Δp| alone passed the readout without
    it. The multiplier is read off the logits, and the score equals the model's own log-probabilities."""
    from tiny_families import build

    from vocablens.generate.score import score_ids
    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    m = build("aya_vision", 512, "image-text-to-text")
    b, check = find_readout(Borders.from_model(m))
    assert check.logit_scale == pytest.approx(m.config.text_config.logit_scale, rel=1e-5)
    ids = torch.randint(0, 400, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = torch.log_softmax(m(input_ids=ids[None]).logits[0].double(), -1)[torch.arange(11), ids[1:]]
    assert torch.allclose(score_ids(b, ids, top_k=0).logprobs.double(), own, atol=2e-5, rtol=0)


def test_several_residual_streams_are_refused_saying_so():
    """DeepSeek V4's hyper-connections keep 4 streams per position ([B, T, 4, d]): refused in one line,
    never read as one stream."""
    from tiny_families import build

    from vocablens.models.borders import Borders
    from vocablens.models.readout import find_readout

    m = build("deepseek_v4", 512)
    with pytest.raises(UnsupportedArchitecture, match=r"not one residual stream \[B, T, d\]") as e:
        find_readout(Borders.from_model(m))
    assert "\n" not in str(e.value)


def test_an_image_on_llama4_says_its_language_model_alone_was_loaded(llama4_dir, tmp_path):
    """Llama 4's causal-LM class loads the text model only: an image is refused naming that, never
    'has no vision tower' of a checkpoint that holds one (the qa pass's input)."""
    from PIL import Image

    import vocablens
    from vocablens.errors import BadInput

    img = tmp_path / "img.png"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(img)
    m = vocablens.load(str(llama4_dir))
    with pytest.raises(BadInput) as info:
        m.lens("hi", images=str(img))
    msg = str(info.value)
    assert "holds a vision tower" in msg and "language model only" in msg and "has no vision tower" not in msg
