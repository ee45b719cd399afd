"""Quantized weights as transformers' quantizers leave them, read as plain float tensors.

A checkpoint quantized by a transformers quantizer (torchao, optimum-quanto, bitsandbytes, GPTQ, AWQ,
compressed-tensors ...) names it in ``config.json`` (``quantization_config.quant_method``) and loads
through the same ``from_pretrained`` call as any other. Its forward runs on the quantized weights, with
the quantizer's own kernels; its matrices are tensor subclasses (torchao ``Int8Tensor``, quanto
``WeightQBytesTensor``) or packed parameters (bitsandbytes ``Params4bit`` / ``Int8Params``) that do
not support every tensor op (torchao's ``Int8Tensor`` has no ``view``).

Everything in vocablens that reads a weight as numbers (the borders' ``W_E`` and ``W_U``, a block's
linear weights, the scan for NaN/inf) goes through :func:`dequantized`, the one place that turns a
quantized weight into a plain tensor of its logical shape and dtype; the provenance says that the
matrices were read dequantized (:func:`quantized_provenance`). :func:`stored_bytes` counts what a
weight holds as stored (quantized values, scales, zero points), :func:`logical_numel` the parameters
it stands for.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from vocablens.errors import UnsupportedQuantization


def quantization_config(obj) -> dict | None:
    """The ``quantization_config`` of a model, a config or a ``config.json`` dict, as a dict (None: not
    quantized). A GGUF load's own quantizer (dequantized on load) counts as not quantized."""
    cfg = obj if isinstance(obj, dict) else getattr(obj, "config", obj)
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else getattr(cfg, "quantization_config", None)
    if qc is None:
        return None
    d = qc if isinstance(qc, dict) else (qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc)))
    method = str(getattr(d.get("quant_method"), "value", d.get("quant_method")) or "")
    return None if method.lower() == "gguf" else {**d, "quant_method": method or "quantized"}


def quantization_name(qc: dict) -> str:
    """One phrase for a ``quantization_config`` dict: ``torchao Int8WeightOnlyConfig``,
    ``bitsandbytes 4-bit nf4``, ``gptq 4-bit``, ``quanto int8``."""
    method = str(qc.get("quant_method") or "quantized")
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return f"bitsandbytes 4-bit {qc.get('bnb_4bit_quant_type') or ''}".strip()
        return "bitsandbytes 8-bit"
    qt = qc.get("quant_type")
    if isinstance(qt, dict):  # torchao: {"default": {"_type": "Int8WeightOnlyConfig", ...}} or the object's dict
        qt = (qt.get("default") or {}).get("_type") if isinstance(qt.get("default"), dict) else qt.get("_type")
    elif qt is not None and not isinstance(qt, str):
        qt = type(qt).__name__
    detail = qt or qc.get("weights") or (f"{qc['bits']}-bit" if qc.get("bits") else "") or qc.get("format") or ""
    return f"{method} {detail}".strip()


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


def placed_on(model: nn.Module, spec: str, device: str) -> None:
    """``model.to(device)`` (a whole load's last step without a device map), unless its quantizer
    placed it there already (bitsandbytes: CUDA): a quantized model stays where its quantizer put it
    when that is ``device``'s type; one whose quantizer cannot move it is one line (``spec`` names it).

    Raises:
        UnsupportedQuantization: the quantizer refuses the move (bitsandbytes weights stay on CUDA).
    """
    if quantization_config(model) is not None and next(model.parameters()).device.type == torch.device(device).type:
        return
    try:
        model.to(device)
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        qc = quantization_config(model)
        if qc is None:
            raise
        raise UnsupportedQuantization(f"{spec} ({quantization_name(qc)}) cannot run on {device}: "
                                      f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None


def quantized_provenance(prov, model: nn.Module, borders):
    """``prov`` of a model loaded through a transformers quantizer: its quantization named, the storage
    types per group, and ``dequantized`` set (the matrices vocablens reads are dequantized copies; the
    model's forward runs on its quantized weights). ``prov`` unchanged when the model is not quantized."""
    qc = quantization_config(model)
    if qc is None:
        return prov
    from dataclasses import replace

    note = ("quantized by a transformers quantizer: the model runs on its quantized weights; the matrices "
            "vocablens reads (embedding, LM head, block weights) are read dequantized")
    return replace(prov, quantization=quantization_name(qc), tensor_types=storage_types(model, borders),
                   dequantized=True, notes=(*prov.notes, note))


def refuse_edit(model: nn.Module, what: str) -> None:
    """Refuse an edit that writes weights (``expand``/``trim``'s matrices, ``steer``'s folded value
    vectors) of a model quantized by a transformers quantizer: the matrices vocablens reads are
    dequantized copies, so a write would never reach the model or the file it saves.

    Raises:
        UnsupportedQuantization: ``model`` is quantized (one line naming the quantization and ``what``).
    """
    qc = quantization_config(model)
    if qc is not None:
        raise UnsupportedQuantization(f"{what} writes the model's weights, which are stored quantized "
                                      f"({quantization_name(qc)}): edit a float checkpoint instead")


def refused(spec: str, qc: dict, exc: BaseException) -> UnsupportedQuantization:
    """The one line for a quantized checkpoint transformers cannot load here (a quantizer whose package
    or device is missing: bitsandbytes or GPTQ kernels without CUDA, ...)."""
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return UnsupportedQuantization(f"{spec} is quantized with {quantization_name(qc)}, which transformers cannot "
                                   f"load here: {why}")



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


__all__ = ["kept_dequantized", "dequantized", "stored_parts", "is_quantized", "logical_numel", "placed_on", "quantization_config", "quantization_name",
           "quantized_provenance", "refuse_edit", "refused", "storage_types", "stored_bytes", "weights_stored_bytes"]
