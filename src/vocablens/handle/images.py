"""Images in the handle's workflows: a prompt and its images through the model's own
processor, then the same lens path as text, every position read, image positions labelled.

:func:`with_images` returns the prompt's ids, a :class:`Pictured` view of the borders (its forward
takes the pixels with those ids) and the label of each position (``<image 3/256>``,
:func:`vocablens.models.vision.image_labels`). The lenses read the forward as they read any other:
layer L equals the model's own logits on the same inputs, pixels included.
"""

from __future__ import annotations

import torch

from vocablens.errors import BadInput


class Pictured:
    """``borders`` whose :meth:`residual_stream` of one prompt's ids runs the model with that prompt's
    images (``inputs``: ``pixel_values`` ...); any other call goes to the real Borders."""

    def __init__(self, borders, ids: torch.Tensor, inputs: dict) -> None:
        self._borders, self._ids, self._inputs = borders, ids.reshape(1, -1), inputs

    def residual_stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if input_ids.shape == self._ids.shape and torch.equal(input_ids.cpu(), self._ids.cpu()):
            return self._borders.residual_stream(input_ids, attention_mask, **self._inputs)
        raise BadInput("a prompt with images is read alone (one prompt, its own images)")

    def __getattr__(self, name: str):
        return getattr(self._borders, name)


def as_list(images) -> list:
    """``images`` (a path, a PIL image, or a list of them) as a list.

    Raises:
        BadInput: an empty list.
    """
    got = list(images) if isinstance(images, (list, tuple)) else [images]
    if not got:
        raise BadInput("images: give at least one image (a path or a PIL image)")
    return got


def with_images(m, text, images) -> tuple[torch.Tensor, Pictured, tuple[str | None, ...]]:
    """One prompt and its images through ``m``'s processor (loaded on first use, kept on ``m``):
    ``(ids [T] int64, Pictured borders, labels per position)``.

    Raises:
        BadInput: several prompts, a prompt that is not text, a model without a vision tower, an image
            that cannot be read or is too large (:func:`vocablens.models.vision.read_image`).
    """
    from vocablens.models.vision import image_inputs, image_labels, image_token_id, load_processor

    if not isinstance(text, str):
        raise BadInput("a prompt with images is one text (images are read with one prompt)")
    if not text.strip():
        raise BadInput("empty prompt: give some text")
    pics = as_list(images)
    if m.processor is None:
        m.processor = load_processor(m)
    proc = m.processor
    ids, inputs = image_inputs(m, proc, text, pics)
    labels = image_labels(ids, image_token_id(m.model.config, proc))
    return ids, Pictured(m.borders, ids, inputs), labels


__all__ = ["Pictured", "as_list", "with_images"]
