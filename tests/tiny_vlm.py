"""A tiny LLaVA-style vision-language checkpoint on disk (issue 50, B and C): random weights from a
``LlavaConfig`` with a tiny llama text config and a tiny CLIP vision config (28x28 images, 14-pixel
patches: 4 image tokens), saved with its processor (a small CLIP image processor and the default
model's tokenizer plus the image token ``<image>``)."""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_SIZE, PATCH = 28, 14
#: image tokens per image: one per patch (the default strategy drops CLIP's class token)
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2


def save_tiny_llava(d: Path, seed: int = 0) -> Path:
    """The checkpoint in ``d`` (safetensors, config, tokenizer, processor); returns ``d``."""
    import transformers as T

    from vocablens.models.files.source import resolve_source
    from vocablens.models.files.sources import source_dir
    from vocablens.models.files.tokenizer_files import light_tokenizer

    tok = light_tokenizer(source_dir(resolve_source("smollm2"))[0])
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    V = len(tok)
    tc = T.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    vc = T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32)
    cfg = T.LlavaConfig(text_config=tc, vision_config=vc, image_token_index=tok.convert_tokens_to_ids("<image>"),
                        vision_feature_layer=-1, vision_feature_select_strategy="default",
                        image_seq_length=N_IMAGE_TOKENS)
    torch.manual_seed(seed)
    m = T.LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # peaked distributions, and norms that are not all ones (a missed norm shows)
        m.lm_head.weight.mul_(20.0)
        m.model.language_model.norm.weight.add_(0.2 * torch.randn(64))
    ip = T.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    proc = T.LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH, image_token="<image>",
                            vision_feature_select_strategy="default", num_additional_image_tokens=1)
    d.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(d, safe_serialization=True)
    proc.save_pretrained(d)
    return d


def save_image(path: Path, w: int = 50, h: int = 40, seed: int = 0) -> Path:
    """A random RGB PNG of ``w`` x ``h`` pixels at ``path``."""
    import numpy as np
    from PIL import Image

    Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8")).save(path)
    return path


def language_model_of(m):
    """The LLaVA model's language model as a ``LlamaForCausalLM`` of its own (the same weights, copied):
    what a text prompt must give."""
    import transformers as T

    lm = T.LlamaForCausalLM(m.config.text_config).eval()
    sd = {k[len("model.language_model."):]: v for k, v in m.state_dict().items() if k.startswith("model.language_model.")}
    missing = lm.model.load_state_dict(sd, strict=True)
    assert not missing.missing_keys
    lm.lm_head.weight.data.copy_(m.lm_head.weight.data)
    return lm
