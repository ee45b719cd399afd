"""A checkpoint quantized by a transformers quantizer, as the loader meets it: its ``quantization_config``
named (:func:`quantization_config`, :func:`quantization_name`), the model placed where its quantizer
can run it (:func:`placed_on`), the provenance that says its matrices are read dequantized
(:func:`quantized_provenance`), and the one-line refusals (:func:`refused`, :func:`refuse_edit`).

A checkpoint quantized by a transformers quantizer (torchao, optimum-quanto, bitsandbytes, GPTQ, AWQ,
compressed-tensors ...) names it in ``config.json`` (``quantization_config.quant_method``) and loads
through the same ``from_pretrained`` call as any other; its forward runs on the quantized weights, with
the quantizer's own kernels. The weights themselves (what a quantized tensor is, read dequantized, its
stored bytes) are the model abstraction's: :mod:`vocablens.models.quantized_weights`.
"""

from __future__ import annotations

import torch
from torch import nn

from vocablens.errors import UnsupportedQuantization
from vocablens.models.quantized_weights import storage_types


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


__all__ = ["placed_on", "quantization_config", "quantization_name", "quantized_provenance", "refuse_edit", "refused"]
