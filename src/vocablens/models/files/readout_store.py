"""The readout check of a load: a whole load runs it (:func:`checked_readout`) and stores its
:class:`~vocablens.models.readout.ReadoutCheck`, a load without the blocks (borders, head, matrices,
streaming) reads it back (:func:`apply_stored`).

A check is stored under ``<cache>/readout/<key>.json`` (:func:`vocablens.models.files.gguf_cache.cache_root`;
nothing is stored with ``VOCABLENS_CACHE=off``), the key a SHA-256 of the weights' identity: the
resolved path, size and modification time (ns) of each weight file (a ``.gguf`` file; a directory's
``*.safetensors`` and ``pytorch_model*.bin``), plus the vocablens and transformers versions. A load
without the blocks finds it by the same key; without one, its provenance says the readout is
unchecked and why (no forward pass can run without the blocks).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from vocablens.models.readout import ReadoutCheck

#: provenance line of a load that cannot check its readout and found no stored check
UNCHECKED = ("unchecked: loaded without the blocks, so no forward pass compared the readout with the model's "
             "own logits, and no earlier whole load of these weights stored a check (load it whole once)")


def weights_key(source) -> str | None:
    """SHA-256 hex of the identity of the weight files of ``source`` (a
    :class:`~vocablens.models.files.source.Source`; module docstring), or None (a hub id, a directory without
    weight files, an unreadable path)."""
    import transformers

    from vocablens.version import __version__

    files = source.files
    if not files:
        return None
    try:
        stamp = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    except OSError:
        return None
    doc = json.dumps([stamp, __version__, transformers.__version__])
    return hashlib.sha256(doc.encode()).hexdigest()


def _path(key: str) -> Path | None:
    from vocablens.models.files.gguf_cache import cache_root

    root = cache_root()
    return None if root is None else root / "readout" / f"{key}.json"


def store_check(source, check: ReadoutCheck) -> None:
    """Keep ``check`` for later loads of the same weights (best effort: a cache that cannot be
    written stores nothing, silently; the load itself is unaffected)."""
    from vocablens.files import atomic_write

    key = weights_key(source)
    p = _path(key) if key else None
    if p is None:
        return
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, json.dumps(check.to_dict()))
    except Exception:  # noqa: BLE001  (a read-only or full cache: nothing stored)
        return


def checked_readout(borders, source):
    """``(borders, provenance line)`` after :func:`vocablens.models.readout.find_readout` (one probe
    forward of a few tokens): the check every whole load ends with, stored for later loads of
    ``source``'s weights without the blocks (:func:`store_check`; ``source``: the
    :class:`~vocablens.models.files.source.Source` the borders were read from). Weights holding NaN or inf, or whose probe forward overflows (float16 kept by ``--dtype``), are not checked: the
    commands refuse them with their own line, naming the layer, before printing anything.

    Raises:
        UnsupportedArchitecture: the readout differs from the model's own logits (see find_readout).
    """
    from vocablens.errors import NonFiniteActivations, UnsupportedArchitecture
    from vocablens.models.readout import find_readout

    try:
        borders, check = find_readout(borders)
    except NonFiniteActivations as e:
        # the commands' own forwards refuse such a stream naming its first non-finite layer
        return borders, f"unchecked: {e}"
    except UnsupportedArchitecture:
        if borders.nonfinite():
            return borders, "unchecked: the weights hold NaN or inf values"
        raise
    store_check(source, check)
    return borders, check.line()


def stored_check(source) -> ReadoutCheck | None:
    """The check an earlier whole load of the same weights stored, or None."""
    key = weights_key(source)
    p = _path(key) if key else None
    if p is None or not p.is_file():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        return ReadoutCheck(**d)
    except (OSError, ValueError, TypeError):
        return None


def apply_stored(lm, source):
    """A load without the blocks: the stored check's logit scale and final-norm module applied to
    its borders, and its provenance saying whether the readout was checked (``source``: the
    :class:`~vocablens.models.files.source.Source` ``lm`` was read from). Returns a
    :class:`~vocablens.models.LoadedModel` (``lm`` itself when nothing changes but the provenance)."""
    import dataclasses

    b = lm.borders
    check = stored_check(source)
    if check is None or (check.family and check.family != b.family):
        line = UNCHECKED
    else:
        changes = {}
        if check.logit_scale != b.logit_scale:
            changes["logit_scale"] = check.logit_scale
        if check.final_norm is not None and b.final_norm is None or (
                check.final_norm is not None and _module_name(b, b.final_norm) != check.final_norm):
            try:
                norm = b.model.get_submodule(check.final_norm)
            except AttributeError:
                norm = None
            if norm is not None and not any(p.is_meta for p in norm.parameters()):
                changes["final_norm"] = norm
        if changes:
            b = b.replace(**changes)
        line = check.line()  # the same weights' check, the same line: outputs agree whatever the load mode
    prov = dataclasses.replace(lm.provenance, readout=line)
    return type(lm)(lm.model, lm.tokenizer, b, prov)


def _module_name(b, mod) -> str | None:
    for n, m in b.model.named_modules():
        if m is mod:
            return n
    return None


__all__ = ["UNCHECKED", "apply_stored", "checked_readout", "store_check", "stored_check", "weights_key"]
