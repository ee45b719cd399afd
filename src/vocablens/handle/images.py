"""Images in the handle's workflows: a prompt and its images through the model's own processor, then
the same lens path as text, every position read, image positions labelled.

:meth:`Images.image_prompt` gives a prompt's ids and the further inputs of the model's
forward (``pixel_values`` ...); :class:`Pictured` is the borders whose forward of those ids takes
them; :meth:`Images.position_labels` labels each image position ``<image 3/256>``
(:func:`vocablens.models.vision.image_labels`). The lenses read the forward as they read any other:
layer L equals the model's own logits on the same inputs, pixels included.
"""

from __future__ import annotations

import torch

from vocablens.handle import checks
from vocablens.errors import BadInput
from vocablens.handle.protocols import NeedsImages


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


class Images:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsImages`)."""

    def image_prompt(self: NeedsImages, text: str, images) -> tuple[torch.Tensor, dict]:
        """One prompt and its images through the model's own processor (read on first use, kept):
        ``(ids [1, T] int64, inputs)``, ``inputs`` the further tensors of the model's forward
        (``pixel_values`` [N, C, H, W] in the model's dtype ...; :func:`vocablens.models.vision.image_inputs`).
        ``images``: a path, a PIL image, or a list of them. A prompt without the image token gets one
        per image in front.

        Raises:
            BadInput: a prompt that is not one text, no images, a model without a vision tower, an image
                that cannot be read or is too large (:func:`vocablens.models.vision.read_image`).
        """
        from vocablens.models.vision import image_inputs, load_processor

        if not isinstance(text, str):
            raise BadInput("a prompt with images is one text (images are read with one prompt)")
        checks.prompt_text(text)
        pics = list(images) if isinstance(images, (list, tuple)) else [images]
        if not pics:
            raise BadInput("images: give at least one image (a path or a PIL image)")
        if self.processor is None:
            self.processor = load_processor(self)
        ids, inputs = image_inputs(self, self.processor, text, pics)
        return ids.reshape(1, -1), inputs

    def position_labels(self: NeedsImages, ids) -> tuple[str | None, ...] | None:
        """Per position of ``ids`` ([T] or [1, T]), ``<image k/n>`` at image-token positions, else None;
        None when the model has no vision tower or ``ids`` hold no image token."""
        from vocablens.models.vision import has_vision, image_labels, image_token_id

        if not has_vision(self.model):
            return None
        try:
            tid = image_token_id(self.model.config, self.processor)
        except BadInput:
            return None
        ids = torch.as_tensor(ids).reshape(-1)
        return image_labels(ids, tid) if bool((ids == tid).any()) else None

    def image_patch(self: NeedsImages, ids, inputs: dict, position: int):
        """The patch of the image the model saw at image position ``position`` of ``ids`` ([T] or
        [1, T], with the ``inputs`` of :meth:`image_prompt`): ``(image, box, label)``
        (:func:`vocablens.models.vision.image_patch`: the image as the model reads it, the patch's
        pixel box ``(x0, y0, x1, y1)``, ``<image k/n>``).

        Raises:
            BadInput: not an image position, or a layout of image tokens that is not a square grid.
        """
        from vocablens.models.vision import image_patch, image_token_id

        if self.processor is None:
            raise BadInput("no image was read with this model (image_prompt first)")
        ids = torch.as_tensor(ids).reshape(-1)
        return image_patch(ids, image_token_id(self.model.config, self.processor), int(position), inputs, self.processor)

    def with_images(self: NeedsImages, text: str, images) -> tuple[torch.Tensor, Pictured]:
        """``(ids [T] int64, Pictured borders)`` of one prompt and its images (:meth:`image_prompt`)."""
        ids, inputs = self.image_prompt(text, images)
        return ids[0], Pictured(self.borders, ids[0], inputs)


__all__ = ["Images", "Pictured"]
