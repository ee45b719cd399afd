"""Vision-language checkpoints (issue 50, B and C) on a tiny LLaVA built from configs and saved with
its processor (``tests/tiny_vlm.py``).

Oracles: the language model alone (a ``LlamaForCausalLM`` holding the same weights) for text prompts;
the whole model's own logits on its own processor's inputs (pixels included) for image prompts; a
forward hook on the language model's first block for an intermediate layer at image positions; the
modules' own parameter counts for anatomy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiny_dirs import run_cli
from tiny_vlm import N_IMAGE_TOKENS, language_model_of, save_image, save_tiny_llava

TEXT = "The class statement defines a new type."


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return save_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny-llava")


@pytest.fixture(scope="module")
def vlm(vlm_dir):
    import vocablens

    return vocablens.load(vlm_dir)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return save_image(tmp_path_factory.mktemp("img") / "x.png")


def _topk(logits: torch.Tensor, k: int):
    p = torch.softmax(logits.double(), -1)
    return p.topk(k, -1)


def test_loads_through_the_image_text_mapping_with_the_language_models_borders(vlm):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert "llava" not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # what was refused before
    b, model = vlm.borders, vlm.model
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert b.W_E is model.model.language_model.embed_tokens.weight and b.unembedding.weight is model.lm_head.weight
    assert b.n_layers == 2 and b.final_norm is model.model.language_model.norm
    assert vlm.provenance.readout.startswith("checked")


def test_text_lens_and_score_equal_the_language_models(vlm):
    lm = language_model_of(vlm.model)
    ids = vlm.encode(TEXT)[0]
    with torch.no_grad():
        own = lm(input_ids=ids[None]).logits[0]
        whole = vlm.model(input_ids=ids[None]).logits[0]
    assert torch.allclose(own, whole, atol=1e-5)  # on text the whole model is its language model
    res = vlm.lens(TEXT, positions="all", k=5)[0]
    L = res.layers[-1]
    want = _topk(own, 5)
    assert torch.equal(L.top_ids, want.indices)
    assert torch.allclose(L.top_probs.double(), want.values, atol=1e-5)
    sc = vlm.score(TEXT).value
    lp = torch.log_softmax(own.double(), -1)[torch.arange(len(ids) - 1), ids[1:]]
    assert torch.allclose(sc.logprobs.double(), lp, atol=2e-4)
    assert res.input_labels is None


def test_image_lens_labels_image_positions_and_layer_L_is_the_models_own(vlm, vlm_dir, image):
    from PIL import Image
    from transformers import AutoProcessor

    res = vlm.lens("What is this?", images=str(image), positions="all", k=5)[0]
    proc = AutoProcessor.from_pretrained(vlm_dir, tokenizer=vlm.tokenizer)
    inputs = proc(text="<image>\nWhat is this?", images=Image.open(image).convert("RGB"), return_tensors="pt")
    assert torch.equal(res.input_ids, inputs["input_ids"][0])
    img = (inputs["input_ids"][0] == vlm.model.config.image_token_index).nonzero()[:, 0].tolist()
    assert len(img) == N_IMAGE_TOKENS
    assert [res.input_labels[i] for i in img] == [f"<image {k}/{N_IMAGE_TOKENS}>" for k in range(1, N_IMAGE_TOKENS + 1)]
    assert all(res.input_labels[i] is None for i in range(len(res.input_ids)) if i not in img)
    with torch.no_grad():
        own = vlm.model(**inputs).logits[0]
    want = _topk(own, 5)
    assert torch.equal(res.layers[-1].top_ids, want.indices)  # every position, image positions included
    assert torch.allclose(res.layers[-1].top_probs.double(), want.values, atol=1e-5)
    # the pixels entered: four positions holding one token id read four different layer-0 streams
    assert len({tuple(res.layers[0].top_probs[i].tolist()) for i in img}) == N_IMAGE_TOKENS
    d = vlm.lens("What is this?", images=str(image), positions="all").to_json()
    assert d["tokens"][img[0]] == f"<image 1/{N_IMAGE_TOKENS}>"


def test_intermediate_layer_and_a_translator_read_at_image_positions(vlm, vlm_dir, image):
    from PIL import Image
    from transformers import AutoProcessor

    class Half:  # a translator: what a tuned or Jacobian lens is to the lens path
        kind = "half"

        def translate(self, layer, h):
            return 0.5 * h

    vlm.add_lens("half", Half())
    res = vlm.lens("What is this?", images=[Image.open(image)], kind="logit,half", positions="all", k=3)
    inputs = AutoProcessor.from_pretrained(vlm_dir, tokenizer=vlm.tokenizer)(text="<image>\nWhat is this?", images=Image.open(image).convert("RGB"),
                                                    return_tensors="pt")
    got = {}
    lm = vlm.model.model.language_model
    h = lm.layers[0].register_forward_hook(lambda mod, a, out: got.setdefault("h", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            vlm.model(**inputs)
    finally:
        h.remove()
    with torch.no_grad():
        for kind, scale in (("logit", 1.0), ("half", 0.5)):
            want = _topk(vlm.model.lm_head(lm.norm(scale * got["h"][0])), 3)
            layer1 = res[0, kind].layers[1]
            assert torch.equal(layer1.top_ids, want.indices), kind
            assert torch.allclose(layer1.top_probs.double(), want.values, atol=1e-5), kind


def test_anatomy_counts_the_vision_tower_and_projector_apart(vlm):
    from vocablens.accounting.anatomy import anatomy

    m = vlm.model
    a = anatomy(vlm.borders)
    tower = sum(p.numel() for p in m.model.vision_tower.parameters())
    proj = sum(p.numel() for p in m.model.multi_modal_projector.parameters())
    lm_body = sum(p.numel() for n, p in m.model.language_model.named_parameters() if "embed_tokens" not in n)
    assert (a.params_vision, a.params_projector) == (tower, proj)
    assert a.params_total == sum(p.numel() for p in m.parameters())
    assert a.params_non_embedding == lm_body and a.params_position == 0
    assert any("vision tower" in n for n in a.notes)


def test_matrix_reads_find_the_renamed_checkpoint_keys(vlm, vlm_dir):
    import vocablens

    mat = vocablens.load(vlm_dir, read=("embedding", "head"))
    assert torch.equal(mat.borders.W_E, vlm.borders.W_E) and torch.equal(mat.borders.unembedding.weight, vlm.borders.unembedding.weight)
    head = vocablens.load(vlm_dir, read=("head", "final_norm"))
    x = torch.randn(3, 64)
    assert torch.allclose(head.borders.unembedding(x), vlm.borders.unembedding(x), atol=1e-5)


def test_cli_lens_image_labels_and_bad_images_exit_2(vlm_dir, image, tmp_path, capsys, monkeypatch):
    import json

    code, out, _ = run_cli(capsys, "lens", "What is this?", "--image", image, "-m", vlm_dir, "--positions", "all", "--json")
    assert code == 0
    assert json.loads(out)["tokens"][:N_IMAGE_TOKENS] == [f"<image {k}/{N_IMAGE_TOKENS}>" for k in range(1, N_IMAGE_TOKENS + 1)]
    bad = tmp_path / "not.png"
    bad.write_text("not an image")
    code, out, err = run_cli(capsys, "lens", "x", "--image", bad, "-m", vlm_dir)
    assert code == 2 and out == "" and "not an image" in err and len(err.strip().splitlines()) == 1
    import vocablens.models.vision as V

    monkeypatch.setattr(V, "MAX_PIXELS", 100)  # the 50x40 image is then too large
    code, _, err = run_cli(capsys, "lens", "x", "--image", image, "-m", vlm_dir)
    assert code == 2 and "pixels" in err and len(err.strip().splitlines()) == 1


def test_image_on_a_model_without_a_vision_tower_is_one_line(tmp_path, image, capsys):
    from tiny_dirs import save_tiny, tiny_tokenizer

    d = save_tiny(tmp_path / "text", tiny_tokenizer())
    code, out, err = run_cli(capsys, "lens", "x", "--image", image, "-m", d)
    # refused after the load (its progress lines come first): the error is one line, no traceback
    assert code == 2 and out == "" and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error")] == [err.strip().splitlines()[-1]]
    assert "no vision tower" in err.strip().splitlines()[-1]


def test_trajectory_and_a_cached_forward_read_image_positions(vlm, image):
    lens = vlm.lens("What is this?", images=str(image), positions="all", k=1)[0]
    t = vlm.trajectory("What is this?", position=2, images=str(image), kinds=("logit",))
    d = t.to_json()
    assert d["tokens"][2] == f"<image 3/{N_IMAGE_TOKENS}>" and d["position"] == 2
    # its token (the model's top-1 there) is rank 0 at layer L, as the lens at L says
    assert d["token_id"] == int(lens.layers[-1].top_ids[2, 0]) and d["logit"]["rank"][-1] == 0
    ids, inputs = vlm.image_prompt("What is this?", str(image))
    cached = vlm.lens(ids, positions="all", k=1, stream=vlm.forward(ids, inputs))[0]
    assert cached.input_labels == lens.input_labels and torch.equal(cached.layers[-1].top_ids, lens.layers[-1].top_ids)


def test_explorer_with_an_image_labels_the_map(vlm, vlm_dir, image):
    from serve_tiny import client
    from vocablens.serve import ServerState, create_app

    state = ServerState(vlm, model_spec=str(vlm_dir), max_tokens=64, argmax=False, images=[str(image)])
    with client(create_app(state)) as c:
        r = c.post("/api/lens", json={"prompt": "What is this?", "kind": "logit", "k": 3})
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["tokens"][:N_IMAGE_TOKENS] == [f"<image {k}/{N_IMAGE_TOKENS}>" for k in range(1, N_IMAGE_TOKENS + 1)]
        own = vlm.lens("What is this?", images=str(image), positions="all", k=3)[0]
        assert [p["top_ids"] for p in d["layers"][-1]["positions"]] == own.layers[-1].top_ids.tolist()
        r = c.post("/api/explain", json={"prompt": "What is this?", "position": -1})
        assert r.status_code == 400 and "images" in r.json()["error"]
        r = c.post("/api/patch", json={"prompt": "What is this?", "position": 3})  # <image 4/4>: bottom right
        assert r.status_code == 200, r.text
        p = r.json()
        assert p["label"] == f"<image 4/{N_IMAGE_TOKENS}>" and p["size"] == [28, 28] and p["box"] == [14, 14, 28, 28]
        assert p["png"].startswith("data:image/png;base64,")
        r = c.post("/api/patch", json={"prompt": "What is this?", "position": -1})  # '?': no patch
        assert r.status_code == 400 and "not an image position" in r.json()["error"]


def test_the_patch_is_the_pixels_the_model_read(vlm, image):
    """The patch view's image, normalized again by the processor's mean and std, is the model's
    pixel_values (to the 8-bit rounding of a PNG), and its box is the patch grid's cell."""
    ids, inputs = vlm.image_prompt("What is this?", str(image))
    img, box, label = vlm.image_patch(ids, inputs, 1)
    ip = vlm.processor.image_processor
    x = torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32)).permute(2, 0, 1) / 255  # [3, 28, 28]
    assert x.shape == (3, 28, 28)
    again = (x - torch.tensor(ip.image_mean).view(3, 1, 1)) / torch.tensor(ip.image_std).view(3, 1, 1)
    assert (again - inputs["pixel_values"][0]).abs().max() <= 0.5 / 255 / min(ip.image_std) + 1e-6
    assert box == (14, 0, 28, 14) and label == f"<image 2/{N_IMAGE_TOKENS}>"


def test_report_lens_sections_read_the_image(vlm, image):
    run = vlm.report(prompt="What is this?", images=str(image), only=("lens", "explain"), budget_s=60)
    lens = next(s for s in run.sections if s.plan.key == "lens").result
    want = vlm.lens("What is this?", images=str(image), positions="all", k=5)[0]
    assert lens.input_labels == want.input_labels and torch.equal(lens.layers[-1].top_ids, want.layers[-1].top_ids)
    explain = next(s for s in run.sections if s.plan.key == "explain")
    assert explain.result is None and "images" in explain.note
