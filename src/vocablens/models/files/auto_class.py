"""Which transformers Auto class builds a checkpoint: the causal-LM mapping first, else the
image-text-to-text mapping when the checkpoint's language model is a decoder (LLaVA-style
vision-language checkpoints).

A vision-language checkpoint (``LlavaForConditionalGeneration`` ...) is a vision tower, a projector
and a decoder-only language model whose embedding and LM head are the model's two vocabulary
borders; on a text prompt the whole model computes what its language model computes. It loads
through ``AutoModelForImageTextToText`` and the family adapter (:class:`~vocablens.models.Borders`)
reads its language model's borders; the readout is checked against the whole model's own logits as
for any whole load. No family is named here: the two mappings are transformers' own.
"""

from __future__ import annotations

from vocablens.errors import UnsupportedArchitecture


def _mappings() -> tuple[dict, dict]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def is_image_text(config) -> bool:
    """Whether ``config`` builds through the image-text-to-text mapping (not the causal-LM one):
    its ``model_type`` is in transformers' ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` and not in
    ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, and it names no code of its own for a causal LM."""
    causal, image_text = _mappings()
    mt = getattr(config, "model_type", None)
    auto_map = getattr(config, "auto_map", None) or {}
    return mt not in causal and mt in image_text and "AutoModelForCausalLM" not in auto_map


def auto_model_class(config):
    """The transformers Auto class that builds ``config``'s model: ``AutoModelForCausalLM``, or
    ``AutoModelForImageTextToText`` for a vision-language checkpoint (:func:`is_image_text`) whose
    language model is a decoder.

    Raises:
        UnsupportedArchitecture: a vision-language checkpoint whose language model is an
            encoder-decoder (its borders are not a decoder-only LM's).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if not is_image_text(config):
        return AutoModelForCausalLM
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False) or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedArchitecture(str(config.model_type), "none",
                                      "its language model is an encoder-decoder, not a decoder-only LM")
    return AutoModelForImageTextToText


__all__ = ["auto_model_class", "is_image_text"]
