"""The cache of dequantized GGUF models: a float32 safetensors directory per GGUF file version.

Dequantizing a GGUF file with transformers takes seconds to minutes; the result is saved once under
:func:`cache_root` (``gguf/<stem>-<hash>``, the hash over the file's content identity (:func:`file_identity`)
and the vocablens and transformers versions) and loaded from there next time in about a second. The
directory is written through :func:`vocablens.files.atomic_dir`, so a reader never sees half of it.
Disk: about 4 bytes per parameter (SmolLM2-135M: 0.54 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from vocablens.models.provenance import Provenance, gguf_provenance

#: the file that marks a complete cache entry (written last, inside the swapped-in directory)
CACHE_MARK = "vocablens-provenance.json"


def cache_root() -> Path | None:
    """Where dequantized GGUF models are cached: ``$VOCABLENS_CACHE``, else
    ``$XDG_CACHE_HOME/vocablens`` or ``~/.cache/vocablens``; None when ``VOCABLENS_CACHE=off``."""
    v = os.environ.get("VOCABLENS_CACHE", "")
    if v.lower() in ("0", "off", "no", "false", "none"):
        return None
    if v:
        return Path(v).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vocablens"


def cache_dir(path: Path) -> Path | None:
    """The cache directory for one GGUF file version, or None when caching is off."""
    import transformers

    from vocablens.version import __version__

    root = cache_root()
    if root is None:
        return None
    key = f"{file_identity(path)}|{__version__}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "gguf" / f"{path.stem}-{digest}"


def file_identity(path: Path, sample: int = 1 << 20) -> str:
    """What names one GGUF file's content, read in milliseconds: its name, its size and the SHA-256 of
    its first, middle and last ``sample`` bytes (the header with all metadata, and tensor data).

    Not its location or mtime: the same file installed again (a fresh virtual environment, a copy)
    finds its cache entry instead of writing a second one.
    """
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}|{size}".encode())
    with open(path, "rb") as f:
        for start in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            f.seek(start)
            h.update(f.read(sample))
    return h.hexdigest()


def read_cache(cdir: Path | None, spec: str, dtype):
    """``(tokenizer, model, provenance)`` from a complete cache entry, or None (missing or damaged)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cdir is None or not (cdir / CACHE_MARK).is_file():
        return None
    try:
        prov = Provenance(**json.loads((cdir / CACHE_MARK).read_text()))
        tok = AutoTokenizer.from_pretrained(str(cdir))
        model = AutoModelForCausalLM.from_pretrained(str(cdir), dtype=dtype or torch.float32)
    except Exception:  # a damaged cache entry: the caller falls back to the GGUF file
        return None
    return tok, model, Provenance(**{**prov.__dict__, "spec": spec, "loaded_from": str(cdir)})


def _sweep(root: Path, age_s: float = 3600.0) -> None:
    """Remove what a killed writer left under ``root``: temporary (``.NAME.tmp-*``) and moved-aside
    (``.NAME.old-*``) entries older than ``age_s`` (younger ones may belong to a writer still at work)."""
    import shutil
    import time

    for p in root.glob(".*.*-*") if root.is_dir() else ():
        try:
            if (".tmp-" in p.name or ".old-" in p.name) and time.time() - p.stat().st_mtime > age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def write_cache(cdir: Path, model, tok, prov: Provenance) -> bool:
    """Save a dequantized model as a cache entry; returns whether it was written.

    An entry a killed process left half-written is never read: the directory is swapped in whole
    (:func:`vocablens.files.atomic_dir`) and read only with its mark; its leftovers are swept after
    an hour. Caching is an optimisation: a full disk, a read-only cache or any other failure is
    swallowed (the load that called it has its model already).
    """
    from vocablens.files import atomic_dir

    _sweep(cdir.parent)
    try:
        with atomic_dir(cdir) as tmp:
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            (tmp / CACHE_MARK).write_text(json.dumps({**prov.__dict__, "dtype": "", "loaded_from": ""}))
    except Exception:
        return False
    return True


def load_gguf(path: Path, spec: str, tdtype):
    """Dequantize the GGUF file ``path`` to float32 with transformers and write its cache entry, or read
    the entry when there is one: ``(tokenizer, model, provenance)``, the model cast to ``tdtype`` when
    given. Errors of the readers propagate (the caller wraps them: :func:`vocablens.models.spec.reading`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cdir = cache_dir(path)
    hit = read_cache(cdir, spec, tdtype)
    if hit is not None:  # the entry is keyed by content, shared by every copy of the file: the source
        tok, model, prov = hit  # is the file given now, not the copy that wrote the entry
        return tok, model, Provenance(**{**prov.__dict__, "source": str(path)})
    prov = gguf_provenance(path, spec)
    d, f = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # The weights are plain dequantized tensors now; drop the GGUF quantizer so the model is an
    # ordinary transformers model (serializable, editable).
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if cdir is not None:
        write_cache(cdir, model, tok, prov)
    if tdtype is not None and tdtype != torch.float32:
        model = model.to(tdtype)
    return tok, model, prov


__all__ = ["CACHE_MARK", "cache_root", "cache_dir", "load_gguf", "read_cache", "write_cache"]
