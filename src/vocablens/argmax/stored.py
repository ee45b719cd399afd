"""Stored verdicts: a completed exact argmax scan kept in the user's cache and read back when it matches.

Layout: ``<cache>/argmax/<key>.safetensors`` (the result's tensors) and ``<key>.json`` (its numbers,
dicts and the key's inputs), each written to a temporary file and renamed
(:func:`vocablens.files.atomic_path`); the JSON is written last, and a result is read only when both
exist and the JSON names the same key. ``<cache>`` is :func:`vocablens.models.files.gguf_cache.cache_root`
(``$VOCABLENS_CACHE``, ``off`` disables storing), or ``$VOCABLENS_ARGMAX_CACHE`` when set.

The key is a SHA-256 of the exact bytes (not a rounded copy: a verdict can hinge on the last bit)
of the head ``W [V, d]``, the bias ``[V]`` as used, the final norm's parameters, the masks
(padding, untrained, deferred rows) and the scan's settings (tolerance, verify mode, bias mode ...).
Any change to one of them gives another key: a changed head is never served stale verdicts. Only a
scan that ran to its end is stored (not interrupted, no stage cut short by a budget).

Beside them, ``norm-<key>.safetensors``: the final norm's probed form (gain, shift, centring:
:func:`vocablens.argmax.norm.probe_norm`) of a head-only load, whose norm is the family's
transformers module built at first use (:class:`~vocablens.models.files.final_norm.FamilyNorm`). Building
it imports the family's modeling code (tens of MiB resident, seconds of CPU); read back, the norm
bounds of a later run use the numbers that module gave, without building it. Its key is a SHA-256 of
what decides the module (:attr:`FamilyNorm.family`: the config's bytes and the transformers
version), the norm's parameters and the vocablens version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path

import torch

from vocablens.argmax.norm import NormModel
from vocablens.argmax.result import ArgmaxResult

#: bumped when the stored layout or the meaning of a verdict changes
FORMAT = 1
_TENSORS = ("verdict", "stage", "margin", "residual", "group", "in_play", "center", "whiten", "scale",
            "quant", "row")


def verdict_key(W: torch.Tensor, bias: torch.Tensor | None, norm_params: dict, masks: dict,
                settings: dict) -> str:
    """SHA-256 (hex) of the exact bytes of ``W [V, d]``, ``bias [V]`` (or None), the final norm's
    parameters ``{name: tensor}``, bool masks ``{name: [V] or None}`` and the JSON-able settings."""
    h = hashlib.sha256()
    h.update(f"vocablens-argmax-{FORMAT}".encode())
    items = [("W", W), ("bias", bias)] + sorted(norm_params.items()) + sorted(masks.items())
    for name, t in items:
        h.update(name.encode())
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


def store_dir() -> Path | None:
    """``$VOCABLENS_ARGMAX_CACHE`` when set (``off``: no storing), else ``<cache>/argmax``; None when
    caching is off (``VOCABLENS_CACHE=off``). The test suite points the first at a directory of its
    own, so a scan stored by one run never answers the next run's tests."""
    import os

    from vocablens.models.files.gguf_cache import cache_root

    own = os.environ.get("VOCABLENS_ARGMAX_CACHE", "")
    if own:
        return None if own.lower() in ("0", "off", "no", "false", "none") else Path(own).expanduser()
    root = cache_root()
    return None if root is None else root / "argmax"


def store_verdicts(res: ArgmaxResult, key: str) -> Path | None:
    """Write a completed result under ``key``; returns the JSON path, or None when not stored
    (caching off, or the scan was interrupted or cut short: such a result is never stored)."""
    from safetensors.torch import save_file

    from vocablens.files import atomic_path

    d = store_dir()
    if d is None or res.interrupted or res.cut_short:
        return None
    d.mkdir(parents=True, exist_ok=True)
    tensors = {f"t.{n}": getattr(res, n).contiguous() for n in _TENSORS}
    for t, x in res.x_extra.items():
        tensors[f"x.{t}"] = x.contiguous()
    for t, (ids, wts) in res.combos.items():
        tensors[f"ci.{t}"] = ids.contiguous()
        tensors[f"cw.{t}"] = wts.contiguous()
    cmean = {}
    for t, (m_all, hv) in res.combo_mean.items():
        tensors[f"cm.{t}"] = hv.contiguous()
        cmean[str(t)] = m_all
    ctilt = {}
    for t, (a, u, ex) in res.combo_tilt.items():
        tensors[f"tu.{t}"] = u.contiguous()
        tensors[f"te.{t}"] = ex.contiguous()
        ctilt[str(t)] = a
    meta = {f.name: getattr(res, f.name) for f in fields(res)
            if f.name not in _TENSORS and f.name not in ("x_extra", "combos", "combo_mean", "combo_tilt")}
    meta["group_can_tie"] = {str(k): v for k, v in meta["group_can_tie"].items()}
    meta["reasons"] = {str(k): v for k, v in meta["reasons"].items()}
    meta["cut_short"] = list(meta["cut_short"])
    doc = {"format": FORMAT, "key": key, "result": meta, "combo_mean": cmean, "combo_tilt": ctilt}
    with atomic_path(d / f"{key}.safetensors") as tmp:
        save_file(tensors, str(tmp))
    with atomic_path(d / f"{key}.json") as tmp:
        Path(tmp).write_text(json.dumps(doc))
    return d / f"{key}.json"


def load_verdicts(key: str) -> ArgmaxResult | None:
    """The stored result under ``key``, or None (none stored, caching off, or an unreadable or
    mismatched file: never a partial result)."""
    from safetensors.torch import load_file

    d = store_dir()
    if d is None or not (d / f"{key}.json").is_file() or not (d / f"{key}.safetensors").is_file():
        return None
    try:
        doc = json.loads((d / f"{key}.json").read_text())
        if doc.get("format") != FORMAT or doc.get("key") != key:
            return None
        tens = load_file(str(d / f"{key}.safetensors"))
        meta = doc["result"]
        meta["group_can_tie"] = {int(k): v for k, v in meta["group_can_tie"].items()}
        meta["reasons"] = {int(k): v for k, v in meta["reasons"].items()}
        meta["cut_short"] = tuple(meta["cut_short"])
        x_extra, combos, cmean, ctilt = {}, {}, {}, {}
        for name, t in tens.items():
            kind, _, tok = name.partition(".")
            if kind == "x":
                x_extra[int(tok)] = t
            elif kind == "ci":
                combos[int(tok)] = (t, tens[f"cw.{tok}"])
            elif kind == "cm":
                cmean[int(tok)] = (float(doc["combo_mean"][tok]), t)
            elif kind == "tu":
                ctilt[int(tok)] = (float(doc["combo_tilt"][tok]), t, tens[f"te.{tok}"])
        return ArgmaxResult(**{n: tens[f"t.{n}"] for n in _TENSORS}, x_extra=x_extra, combos=combos,
                            combo_mean=cmean, combo_tilt=ctilt, **meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def norm_key(norm) -> str | None:
    """SHA-256 (hex) under which the probed form of ``norm`` is kept, or None when ``norm`` names no
    family (:attr:`~vocablens.models.files.final_norm.FamilyNorm.family`: only a head-only load's norm is
    costly to build; a module already built is probed in milliseconds)."""
    from vocablens.version import __version__

    family = getattr(norm, "family", None)
    params = dict(norm.named_parameters())
    if not isinstance(family, str) or not params:
        return None
    device = next(iter(params.values())).device.type       # the probe runs where the norm is
    return verdict_key(torch.zeros(0), None, params, {},
                       {"norm form": FORMAT, "family": family, "vocablens": __version__, "device": device})


def store_norm_model(model: NormModel, key: str) -> Path | None:
    """Keep ``model`` under ``key`` (:func:`norm_key`); returns the file, or None when caching is
    off. ``gain`` and ``shift`` are stored bit for bit (float64 [d]), the rest in the metadata."""
    from safetensors.torch import save_file

    from vocablens.files import atomic_path

    d = store_dir()
    if d is None:
        return None
    d.mkdir(parents=True, exist_ok=True)
    meta = {"key": key, "radius": repr(model.radius), "centred": str(model.centred), "kind": model.kind,
            "max_error": repr(model.max_error)}
    with atomic_path(d / f"norm-{key}.safetensors") as tmp:
        save_file({"gain": model.gain.contiguous(), "shift": model.shift.contiguous()}, str(tmp), metadata=meta)
    return d / f"norm-{key}.safetensors"


def load_norm_model(key: str) -> NormModel | None:
    """The :class:`~vocablens.argmax.norm.NormModel` kept under ``key``, or None (none kept,
    caching off, or an unreadable or mismatched file)."""
    from safetensors import safe_open

    d = store_dir()
    f = None if d is None else d / f"norm-{key}.safetensors"
    if f is None or not f.is_file():
        return None
    try:
        with safe_open(str(f), framework="pt") as h:
            meta = h.metadata() or {}
            if meta.get("key") != key or meta.get("centred") not in ("True", "False"):
                return None
            return NormModel(gain=h.get_tensor("gain"), shift=h.get_tensor("shift"), radius=float(meta["radius"]),
                             centred=meta["centred"] == "True", kind=meta["kind"], max_error=float(meta["max_error"]))
    except Exception:  # noqa: BLE001  (an unreadable or corrupt file, safetensors' own error too: none kept)
        return None
