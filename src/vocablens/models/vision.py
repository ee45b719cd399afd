"""Images into a vision-language model: the image read and checked, the model's own
processor, and which input positions are image tokens.

A vision-language checkpoint (loaded through the image-text-to-text mapping,
:mod:`vocablens.models.files.auto_class`) turns an image into a run of image-token positions: its
processor (``AutoProcessor``, saved with the checkpoint) writes the image token once per visual
token into the ids and the pixels into ``pixel_values``; the model's forward replaces those
positions' embeddings by the projected vision features. The residual stream then holds the visual
tokens at those positions, and every lens reads them as it reads text (LLaVA: Liu et al. 2023,
"Visual Instruction Tuning", §4.1). Nothing here names a family: the image token is the config's
(``image_token_id`` / ``image_token_index``) or the processor's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from vocablens.errors import BadInput

#: the most pixels (width x height) an image may have; larger ones are refused before decoding
MAX_PIXELS = 40_000_000
#: the largest image file read
MAX_FILE_BYTES = 64 * 1024 * 1024


def has_vision(model) -> bool:
    """Whether ``model`` takes images: its config has a vision sub-config (``vision_config``)."""
    return getattr(getattr(model, "config", None), "vision_config", None) is not None


def vision_parts(model) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(vision tower parameters, projector parameters)`` of a vision-language model; ``([], [])``
    for a text model. Found by structure: the tower is the outermost module whose config is the
    model's ``vision_config``; the projector is every other parameter outside the language model
    (the outermost module whose config is the text config) and the LM head (LLaVA's
    ``multi_modal_projector``). A model whose language model is not found so counts no projector."""
    cfg = getattr(model, "config", None)
    vc = getattr(cfg, "vision_config", None)
    if vc is None:
        return [], []
    from vocablens.models.find import text_config

    tc = text_config(cfg)
    tower = next((m for m in model.modules() if getattr(m, "config", None) is vc), None)
    lm = next((m for m in model.modules() if m is not model and getattr(m, "config", None) is tc), None)
    tower_ps = list(tower.parameters()) if tower is not None else []
    if lm is None:
        return tower_ps, []
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inside = {id(p) for p in tower_ps} | {id(p) for p in lm.parameters()}
    inside |= {id(p) for p in head.parameters()} if head is not None else set()
    return tower_ps, [p for p in model.parameters() if id(p) not in inside]


def read_image(image) -> Any:
    """A path (str / ``os.PathLike``) or a PIL image -> a PIL image in RGB, checked.

    Raises:
        BadInput: no such file, a file that is not an image PIL can read, an image over
            :data:`MAX_PIXELS` pixels or a file over :data:`MAX_FILE_BYTES` bytes, or another type.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        im = image
    elif isinstance(image, (str, os.PathLike)):
        p = Path(image).expanduser()
        if not p.is_file():
            raise BadInput(f"`images`: no such file {str(image)!r}")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise BadInput(f"`images`: {p} is {p.stat().st_size:,} bytes; the limit is {MAX_FILE_BYTES:,}")
        try:
            im = Image.open(p)  # reads the header only: the size is checked before the pixels are decoded
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            raise BadInput(f"`images`: {p} is not an image PIL can read ({type(e).__name__})") from None
    else:
        raise BadInput(f"images are paths or PIL images; got {type(image).__name__}")
    w, h = im.size
    if w * h > MAX_PIXELS or w < 1 or h < 1:
        raise BadInput(f"`images`: {w}x{h} pixels; images up to {MAX_PIXELS:,} pixels are read")
    try:
        return im.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as e:  # a truncated or damaged file
        raise BadInput(f"`images`: the image cannot be decoded ({type(e).__name__}: {str(e)[:80]})") from None


def load_processor(lm):
    """The model's own processor (``AutoProcessor``) from where ``lm`` was loaded, sharing its
    tokenizer.

    Raises:
        BadInput: a model without a vision tower (:func:`has_vision`), or a checkpoint saved without
            a processor that takes images.
    """
    from transformers import AutoProcessor

    from vocablens.models.files.source import resolve_source

    source = resolve_source(lm.provenance.spec)
    kind, path, hub = source.kind, source.path, source.hub
    if not has_vision(lm.model):
        if kind == "dir" and _checkpoint_has_vision(Path(path)):  # e.g. Llama 4: its causal-LM class is text only
            raise BadInput(f"{lm.provenance.spec} holds a vision tower, but transformers' causal-LM class "
                           f"({type(lm.model).__name__}) loads its language model only: images are read for "
                           "checkpoints loaded through the image-text-to-text mapping (LLaVA-style)")
        raise BadInput(f"{lm.provenance.spec} has no vision tower: `images` needs a vision-language checkpoint")
    src = str(path) if kind == "dir" else hub
    try:
        proc = AutoProcessor.from_pretrained(src, tokenizer=lm.tokenizer, local_files_only=True,
                                             trust_remote_code=False)  # a processor's own code: never run
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise BadInput(f"cannot read the processor saved with {lm.provenance.spec}: {str(e).splitlines()[0][:160]}") from None
    if getattr(proc, "image_processor", None) is None:
        raise BadInput(f"{lm.provenance.spec} was saved without an image processor (preprocessor_config.json)")
    return proc


def _checkpoint_has_vision(d: Path) -> bool:
    """Whether the ``config.json`` in ``d`` has a vision sub-config (``vision_config``)."""
    import json

    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("vision_config"), dict)


def image_token_id(config, processor=None) -> int:
    """The id the processor writes at each image position: the config's ``image_token_id`` or
    ``image_token_index``, else the processor's.

    Raises:
        BadInput: neither names one.
    """
    for n in ("image_token_id", "image_token_index"):
        v = getattr(config, n, None)
        if isinstance(v, int):
            return v
    v = getattr(processor, "image_token_id", None)
    if isinstance(v, int):
        return v
    raise BadInput("this model's config names no image token (image_token_id)")


def image_inputs(lm, processor, text: str, images: list) -> tuple[torch.Tensor, dict]:
    """One prompt and its images through the model's own processor: ``(ids [T] int64, inputs)``,
    ``inputs`` the further tensors of the model's forward (``pixel_values`` [N, C, H, W] in the
    model's dtype, on its device, ...). A prompt without the processor's image token gets one per
    image in front (``"<image>\\n" + text``), as the model's chat formats place it.

    Raises:
        BadInput: empty text, an image that cannot be read (:func:`read_image`), or what the
            processor refuses (its message).
    """
    from vocablens.models.tokens import check_text

    check_text(text)
    pics = [read_image(x) for x in images]
    tok = getattr(processor, "image_token", None)
    if tok and tok not in text:
        text = "".join(f"{tok}\n" for _ in pics) + text
    try:
        enc = processor(text=text, images=pics, return_tensors="pt")
    except (ValueError, TypeError, RuntimeError) as e:
        raise BadInput(f"the model's processor refused the image: {str(e).splitlines()[0][:200]}") from None
    ids = enc["input_ids"][0].to(torch.int64)
    dtype = next(lm.model.parameters()).dtype
    dev = lm.borders.device
    extra = {k: (v.to(dev, dtype) if v.is_floating_point() else v.to(dev)) for k, v in enc.items()
             if torch.is_tensor(v) and k not in ("input_ids", "attention_mask")}
    return ids, extra


def image_runs(ids: torch.Tensor, image_id: int) -> list[list[int]]:
    """The positions of each image in ids [T]: one list per run of consecutive image tokens, in order."""
    runs: list[list[int]] = []
    for i, f in enumerate((ids.reshape(-1) == int(image_id)).tolist()):
        if f:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    return runs


def image_labels(ids: torch.Tensor, image_id: int) -> tuple[str | None, ...]:
    """Per input position, ``<image k/n>`` at the k-th of the n positions of one image's run of
    image tokens (``<image 2: k/n>`` with several images), else None: ids [T] int64."""
    runs = image_runs(ids, image_id)
    out: list[str | None] = [None] * int(ids.numel())
    for r, run in enumerate(runs, start=1):
        for k, i in enumerate(run, start=1):
            out[i] = f"<image {k}/{len(run)}>" if len(runs) == 1 else f"<image {r}: {k}/{len(run)}>"
    return tuple(out)


def image_patch(ids: torch.Tensor, image_id: int, position: int, inputs: dict, processor) -> tuple[Any, tuple, str]:
    """What the model saw at image position ``position`` of ``ids`` [T]: ``(image, box, label)``, the
    image as the model reads it (its ``pixel_values`` with the processor's normalization undone, a PIL
    RGB image), the patch's pixel box ``(x0, y0, x1, y1)`` in it, and the position's label
    (``<image k/n>``). The n image tokens of one image are read as a square grid of patches in row
    order (LLaVA's: CLIP's patches after the class token is dropped).

    Raises:
        BadInput: ``position`` is not an image position, or the image's tokens are not a square grid
            of one image's patches (a tiled or pooled layout this view does not map).
    """
    import math

    from PIL import Image

    runs = image_runs(ids, image_id)
    which = next((r for r, run in enumerate(runs) if position in run), None)
    if which is None:
        raise BadInput(f"position {position} is not an image position")
    k, n = runs[which].index(position), len(runs[which])
    side = math.isqrt(n)
    pv = inputs.get("pixel_values")
    if side * side != n or pv is None or pv.dim() != 4 or pv.shape[0] != len(runs):
        raise BadInput("this model's image tokens are not one square grid of patches per image; the patch is not shown")
    ip = getattr(processor, "image_processor", None)
    mean = torch.tensor(getattr(ip, "image_mean", None) or [0.0] * pv.shape[1]).view(-1, 1, 1)
    std = torch.tensor(getattr(ip, "image_std", None) or [1.0] * pv.shape[1]).view(-1, 1, 1)
    x = (pv[which].detach().float().cpu() * std + mean).clamp(0, 1)  # [C, H, W] in 0..1
    img = Image.fromarray((x.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
    H, W = x.shape[1], x.shape[2]
    r, c = divmod(k, side)
    return img, (c * W // side, r * H // side, (c + 1) * W // side, (r + 1) * H // side), \
        image_labels(ids, image_id)[position]


__all__ = ["MAX_FILE_BYTES", "MAX_PIXELS", "has_vision", "vision_parts", "image_inputs", "image_labels", "image_patch",
           "image_runs", "image_token_id", "load_processor", "read_image"]
