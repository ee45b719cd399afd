"""The dtype a checkpoint runs in: float16 checkpoints run in float32 on the CPU unless asked otherwise.

float16 holds at most 65,504: a residual stream that grows past it (a block's FFN output of 7.95e4
in a 135M model) becomes inf, then NaN after the next norm, and every figure read from it is NaN.
transformers' ``dtype="auto"`` keeps the checkpoint's dtype; on the CPU float16 also has no fast
kernels, so vocablens loads such a checkpoint in float32 there (2x the memory of the stored
weights) and says so in the provenance's notes. ``dtype="auto"`` (``--dtype auto``) keeps the
stored dtype; any other dtype is used as given. bfloat16 keeps its dtype (its range is float32's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vocablens.models.dtypes import torch_dtype


def stored_dtype(spec: str | os.PathLike | None):
    """The dtype a normal load (``from_pretrained(dtype="auto")``) gives a model directory or a hub id
    in the local cache: ``config.json``'s ``dtype`` / ``torch_dtype``, else the shard index's
    ``metadata.dtype``, else the first floating-point tensor of the first safetensors file (by its
    header). None for a GGUF file (dequantized to float32) or when nothing says.
    """
    import torch

    from vocablens.models.spec import resolve_spec

    try:
        kind, path, hub = resolve_spec(spec if spec is None else str(spec))
    except Exception:  # the loader says what is missing
        return None
    if kind == "hub" and hub:
        try:
            from huggingface_hub import try_to_load_from_cache

            got = try_to_load_from_cache(hub, "config.json")
        except Exception:
            got = None
        path = Path(got).parent if isinstance(got, str) else None
    elif kind != "dir":
        return None
    if path is None:
        return None
    names = []
    for f, keys in (("config.json", ("dtype", "torch_dtype")), ("model.safetensors.index.json", ())):
        try:
            data = json.loads((path / f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        names += [data.get(k) for k in keys]
        if not keys:
            names.append((data.get("metadata") or {}).get("dtype") if isinstance(data.get("metadata"), dict) else None)
    for n in names:
        if isinstance(n, str) and isinstance(getattr(torch, n.replace("torch.", ""), None), torch.dtype):
            return getattr(torch, n.replace("torch.", ""))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(files[0]), framework="pt") as h:
            for k in h.keys():
                dt = h.get_slice(k).get_dtype()
                if dt in ("F16", "BF16", "F32", "F64"):
                    return {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                            "F64": torch.float64}[dt]
    except Exception:  # a damaged file: the loader names it
        return None
    return None


def run_dtype(spec, dtype, device="cpu"):
    """``(dtype to load in, note or None)`` for ``spec`` on ``device``.

    Args:
        dtype: None (the rule of this module), ``"auto"`` or ``""`` (the checkpoint's own dtype:
            returns None), a torch dtype or a name (``float16``, ``bf16``: used as given).
        device: a torch device or its name; only the CPU upcasts.

    Returns:
        ``(torch.float32, note)`` for a float16 checkpoint on the CPU when ``dtype`` is None, else
        ``(the requested torch dtype or None, None)``.

    Raises:
        BadInput: an unknown dtype name.
    """
    import torch

    if dtype is None:
        if torch.device(device).type != "cpu" or stored_dtype(spec) != torch.float16:
            return None, None
        return torch.float32, ("the checkpoint is float16; it runs in float32 on the CPU (float16 overflows past "
                               "65,504 and has no fast CPU kernels); --dtype float16 keeps it")
    if isinstance(dtype, str) and dtype.strip().lower() in ("", "auto"):
        return None, None
    return torch_dtype(dtype, "`dtype`"), None


def with_note(lm, note: str | None):
    """``lm`` (a :class:`~vocablens.models.LoadedModel`) with ``note`` added to its provenance's notes."""
    if not note or note in lm.provenance.notes:
        return lm
    from vocablens.models.provenance import Provenance

    lm.provenance = Provenance(**{**lm.provenance.__dict__, "notes": tuple(lm.provenance.notes) + (note,)})
    return lm


__all__ = ["run_dtype", "stored_dtype", "with_note"]
