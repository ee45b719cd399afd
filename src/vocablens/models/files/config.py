"""A model's config without its weights: from a file, a directory, a GGUF header, the hub cache or
the built-in catalogue, and a meta-device model built from it (shapes and sharing, no storage).
"""

from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any


from vocablens.errors import CorruptModelFile, ModelNotFound
from vocablens.models.files.catalogue import catalogue_entry, catalogue_names
from vocablens.models.files.meta import meta_model  # noqa: F401  (re-exported: built from a config)
from vocablens.models.files.source import DEFAULT_MODEL, check_remote_code, hub_kwargs, resolve_source
from vocablens.models.files.spec import reading
from vocablens.models.files.tie import config_as_loaded


def load_config(spec: str | os.PathLike | None, trust_remote_code: bool = False):
    """Load only a model's config (no weights): default model, directory, config.json, ``.gguf`` or hub id.

    Raises:
        ModelNotFound, CorruptModelFile; BadInput: a config that needs the model's own code and
        ``trust_remote_code`` off (:mod:`vocablens.models.files.remote_code`).
    """
    from transformers import AutoConfig

    spec_s = DEFAULT_MODEL if spec is None else str(spec)
    p = Path(spec_s).expanduser()
    if p.is_file() and p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorruptModelFile(f"cannot read config {p}: {exc}") from None
        mt = data.get("model_type")
        if not mt:
            raise CorruptModelFile(f"{p} has no model_type")
        try:
            return AutoConfig.for_model(**data)
        except Exception as exc:
            raise CorruptModelFile(f"cannot build a config from {p}: {exc}".splitlines()[0]) from None
    source = resolve_source(spec_s)
    kind, path, hub = source.kind, source.path, source.hub
    check_remote_code(source, trust_remote_code)
    with reading(spec_s, kind, hub, "read the config of", path):
        if kind == "gguf":
            from vocablens.models.files.gguf_cache import checked_facts

            facts = checked_facts(path, spec_s)  # cut short or unbuildable: one line, before transformers
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
            if facts.vocab_size is not None:
                cfg.vocab_size = facts.vocab_size  # V is the embedding's rows, whatever the metadata says
            return cfg
        if kind == "dir":
            return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        return AutoConfig.from_pretrained(hub, trust_remote_code=trust_remote_code, **hub_kwargs(hub))


@lru_cache(maxsize=8)
def _gguf_config(path: str, mtime_ns: int, size: int):
    """A GGUF file's config, parsed once per file version (transformers' header reading takes seconds
    for the default model: docs/performance.md). When the file's float32 cache entry exists
    (:mod:`vocablens.models.files.gguf_cache`, written by its first load) its ``config.json`` is read
    instead, in milliseconds: the config transformers made from this same header, less the two keys
    saving added (``architectures``, ``dtype``)."""
    from transformers import AutoConfig

    from vocablens.models.files.gguf_cache import CACHE_MARK, cache_dir

    cdir = cache_dir(Path(path))
    if cdir is not None and (cdir / CACHE_MARK).is_file() and (cdir / "config.json").is_file():
        try:
            cfg = AutoConfig.from_pretrained(str(cdir), trust_remote_code=False)
        except Exception:  # a damaged entry: the header is the source
            cfg = None
        if cfg is not None:
            cfg.architectures = None
            cfg.dtype = None
            return cfg
    return load_config(path)


def resolve_config(spec: str | os.PathLike, trust_remote_code: bool = False
                   ) -> tuple[Any, int | None, str, tuple[str, ...]]:
    """A model's config, its tokenizer size when known, where the config came from, and notes.

    Order: the built-in catalogue (hub id or alias), a ``config.json`` file, a model directory, a
    ``.gguf`` file (or ``smollm2``), and finally a hub id in the local cache — all through
    :func:`vocablens.models.load_config`, no weights read.

    Returns:
        ``(config, tokenizer_vocab_size or None, source, notes)``; source is ``catalogue``, ``config``,
        ``gguf`` or ``hub cache``. For a GGUF file V is its embedding tensor's rows, the tokenizer's
        size its token list's length, and ``notes`` says where its metadata disagrees
        (:func:`vocablens.models.files.gguf_header.gguf_notes`); otherwise ``notes`` is empty.

    Raises:
        ModelNotFound: nothing under that spec (the message lists the catalogue's aliases).
        CorruptModelFile: a file that cannot be read as a config.
        BadInput: a config that needs the model's own code, ``trust_remote_code`` off.
    """
    from transformers import AutoConfig

    entry = catalogue_entry(str(spec))
    if entry is not None:
        cfg = AutoConfig.for_model(**entry.config)
        cfg.name_or_path = entry.hub_id
        return cfg, entry.tokenizer_vocab_size, "catalogue", ()
    p = Path(str(spec)).expanduser()
    try:
        source = resolve_source(str(spec)) if not (p.is_file() and p.suffix == ".json") else None
        kind, path = ("json", p) if source is None else (source.kind, source.path)
        if kind == "gguf":
            st = path.stat()
            cfg = copy.deepcopy(_gguf_config(str(path), st.st_mtime_ns, st.st_size))
        else:
            cfg = load_config(spec, trust_remote_code=trust_remote_code)
    except ModelNotFound:
        if p.suffix == ".gguf":
            raise  # a named file: resolve_spec's own line says it is missing ("no such GGUF file: ...")
        raise ModelNotFound(f"{spec!r} is not a config file, model directory, .gguf file, cached hub id "
                            f"or a catalogue model ({catalogue_names()})") from None
    if kind == "json":
        return cfg, None, "config", ()
    if kind == "gguf":
        from vocablens.models.files.gguf_cache import checked_facts
        from vocablens.models.files.gguf_header import gguf_notes

        facts = checked_facts(path, str(spec))  # milliseconds: the header, without the strings
        cfg.name_or_path = str(spec)
        if facts.vocab_size is not None:
            cfg.vocab_size = facts.vocab_size
        return cfg, facts.n_tokens, "gguf", tuple(gguf_notes(facts))
    if kind == "dir":
        tvs = _dir_tokenizer_size(path)
        return config_as_loaded(cfg, path), tvs, "config", ()
    return cfg, None, "hub cache", ()


def _dir_tokenizer_size(path: Path) -> int | None:
    tj = path / "tokenizer.json"
    if not tj.is_file():
        return None
    try:
        d = json.loads(tj.read_text())
        ids = set(d.get("model", {}).get("vocab", {}).values()) if isinstance(
            d.get("model", {}).get("vocab"), dict) else set(range(len(d.get("model", {}).get("vocab", []))))
        ids |= {t["id"] for t in d.get("added_tokens", [])}
        return len(ids) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["load_config", "resolve_config", "meta_model"]
