"""Quantized weights as transformers' quantizers leave them, read as plain float tensors.

A model loaded through a transformers quantizer (:mod:`vocablens.models.files.quantized`) holds its
matrices as tensor subclasses (torchao ``Int8Tensor``, quanto ``WeightQBytesTensor``) or packed
parameters (bitsandbytes ``Params4bit`` / ``Int8Params``) that do not support every tensor op
(torchao's ``Int8Tensor`` has no ``view``).

Everything in vocablens that reads a weight as numbers (the borders' ``W_E`` and ``W_U``, a block's
linear weights, the scan for NaN/inf) goes through :func:`dequantized`, the one place that turns a
quantized weight into a plain tensor of its logical shape and dtype. :func:`stored_bytes` counts what a
weight holds as stored (quantized values, scales, zero points), :func:`logical_numel` the parameters
it stands for.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from vocablens.errors import UnsupportedQuantization


def _inner(t: torch.Tensor) -> torch.Tensor:
    """The tensor a Parameter wraps (a tensor subclass keeps its class there)."""
    return t.data if isinstance(t, nn.Parameter) and type(t) is nn.Parameter else t


#: packages whose tensor subclasses hold quantized weights (other subclasses, such as the DTensors of
#: tensor parallelism, are not quantized and are read as they are)
QUANTIZER_PACKAGES = frozenset({"torchao", "optimum", "bitsandbytes", "hqq", "compressed_tensors", "gptqmodel"})


def is_quantized(t) -> bool:
    """Whether ``t`` is a quantized weight: a tensor subclass of a quantizer's package (torchao,
    optimum-quanto ...: :data:`QUANTIZER_PACKAGES`), a bitsandbytes parameter (``quant_state``:
    4-bit; ``SCB``: 8-bit), or one of torch's own quantized tensors."""
    if not isinstance(t, torch.Tensor):
        return False
    if getattr(t, "quant_state", None) is not None or getattr(t, "SCB", None) is not None:
        return True
    inner = _inner(t)
    return type(inner).__module__.split(".")[0] in QUANTIZER_PACKAGES or bool(getattr(inner, "is_quantized", False))


def dequantized(t: torch.Tensor) -> torch.Tensor:
    """The one dequantize function: a weight as a plain tensor of its logical shape, no grad.

    A plain tensor is returned as is (the same object: its storage, version and ties unchanged); a
    quantized one is dequantized into a new tensor (its float dtype: the one the model computes in).

    Args:
        t: a weight, quantized (:func:`is_quantized`) or not.

    Returns:
        a ``torch.Tensor`` (never a subclass), on ``t``'s device.

    Raises:
        UnsupportedQuantization: a quantized type that none of the known ways dequantizes.
    """
    if not is_quantized(t):
        return t
    with torch.no_grad():
        if getattr(t, "quant_state", None) is not None:  # bitsandbytes 4-bit: packed uint8 + quant_state
            import bitsandbytes.functional as bnbf

            out = bnbf.dequantize_4bit(t.data, t.quant_state)
        elif getattr(t, "SCB", None) is not None:  # bitsandbytes 8-bit: int8 rows x absmax / 127
            out = t.data.float() * (t.SCB.float().unsqueeze(1) / 127.0)
        elif hasattr(_inner(t), "dequantize"):  # torchao, optimum-quanto, torch's own quantized tensors
            out = _inner(t).dequantize()
        else:
            raise UnsupportedQuantization(f"cannot read a {type(_inner(t)).__name__} weight as numbers "
                                          "(no dequantize method); vocablens reads transformers' quantizers' "
                                          "tensors that have one")
        if type(out) is not torch.Tensor:
            out = out.as_subclass(torch.Tensor)
        return out.detach()


def stored_parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a weight holds as stored: a tensor subclass's inner tensors, a bitsandbytes
    weight's packed data and its quantization state, else the tensor itself."""
    qs = getattr(t, "quant_state", None)
    if qs is not None:
        parts = [t.data]
        while qs is not None:  # nested (double) quantization keeps a second state for the absmax
            parts += [x for x in (getattr(qs, "absmax", None), getattr(qs, "code", None)) if isinstance(x, torch.Tensor)]
            qs = getattr(qs, "state2", None)
        return parts
    if getattr(t, "SCB", None) is not None:
        return [t.data, t.SCB]
    t = _inner(t)
    if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [p for n in names for p in stored_parts(getattr(t, n))]


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes a weight holds as stored: quantized values, scales and zero points of a quantized weight
    (what the checkpoint file holds for it), ``numel x element size`` of a plain one."""
    return sum(p.numel() * p.element_size() for p in stored_parts(t) if isinstance(p, torch.Tensor))


def weights_stored_bytes(model: nn.Module) -> int:
    """Bytes the weights of a loaded model hold as stored: every parameter and persistent buffer (what
    ``save_pretrained`` writes), a tensor shared by two modules once, a quantized weight as its
    quantized values, scales and zero points (:func:`stored_bytes`).

    Args:
        model: an ``nn.Module`` with real (not meta) tensors.

    Returns:
        int, bytes.
    """
    tensors = list(model.parameters())
    for mod in model.modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        tensors += [b for name, b in mod.named_buffers(recurse=False) if name not in skip]
    seen: set = set()
    n = 0
    for t in tensors:
        key = _memory_key(t)
        if key not in seen:
            seen.add(key)
            n += stored_bytes(t)
    return n


def _memory_key(t: torch.Tensor) -> tuple:
    """What tells two tensors apart as memory: storage, offset and shape; a quantized weight or a
    subclass without a storage of its own: the object."""
    if is_quantized(t) or t.is_meta:
        return ("object", id(t))
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
    except (RuntimeError, NotImplementedError):  # a subclass (a DTensor shard) without a plain storage
        return ("object", id(t))


def logical_numel(t: torch.Tensor) -> int:
    """Parameters a weight stands for: a bitsandbytes 4-bit weight packs two in a byte (its own shape
    is the packed one; the quantization state keeps the logical shape); others report their own."""
    qs = getattr(t, "quant_state", None)
    return math.prod(qs.shape) if qs is not None and getattr(qs, "shape", None) is not None else t.numel()


def storage_types(model: nn.Module, borders) -> dict[str, str]:
    """``{"embedding": ..., "lm_head": ..., "blocks": ...}``: the storage types of the weights of each
    group (``Int8Tensor``, ``Params4bit``, ``float32`` ...), the most common first, as a GGUF
    provenance names its tensor types."""
    groups: dict[str, Counter] = {}
    emb, head = borders.embedding.weight, borders.lm_head.weight
    for _, p in model.named_parameters():
        g = "embedding" if p is emb else "lm_head" if p is head else "blocks" if p.dim() >= 2 else None
        if g is None:
            continue
        name = type(_inner(p)).__name__ if is_quantized(p) else str(p.dtype).replace("torch.", "")
        groups.setdefault(g, Counter())[name] += 1
    return {g: "/".join(k for k, _ in groups[g].most_common()) for g in ("embedding", "lm_head", "blocks") if g in groups}


def kept_dequantized(memo: dict, w: torch.Tensor) -> torch.Tensor:
    """``w`` itself when it is not quantized, else its :func:`dequantized` copy, made once and kept in
    ``memo`` (a :class:`~vocablens.models.Borders`'s) while ``w`` is alive (``w`` is kept with it so its
    ``id`` cannot be reused)."""
    if not is_quantized(w):
        return w
    key = ("dequantized", id(w))
    if key not in memo:
        memo[key] = (w, dequantized(w))
    return memo[key][1]


__all__ = ["QUANTIZER_PACKAGES", "dequantized", "is_quantized", "kept_dequantized", "logical_numel", "storage_types",
           "stored_bytes", "stored_parts", "weights_stored_bytes"]
