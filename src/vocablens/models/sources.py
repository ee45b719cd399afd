"""Where a spec's files are read from by the partial loaders, and its tokenizer read cheaply.

:func:`source_dir` turns a spec (``smollm2``, a directory, a ``.gguf`` file, a hub id) into the
safetensors directory to read and its provenance: a GGUF file is read from its float32 cache
(:mod:`vocablens.models.gguf_cache`; the first call dequantizes it once and writes the entry).
:func:`light_tokenizer` loads a directory's tokenizer through the class its config names, without
transformers' ``Auto*`` config machinery.
"""

from __future__ import annotations

import json
from pathlib import Path

from vocablens.errors import BadInput
from vocablens.models.gguf_cache import CACHE_MARK, cache_dir, load_gguf, mark_provenance
from vocablens.models.provenance import Provenance, dir_provenance
from vocablens.models.spec import diagnose_dir, hub_error, reading, resolve_spec
from vocablens.models.tokenizer_files import building_tokenizer, json_tokenizer_problem


def source_dir(spec: str) -> tuple[Path, Provenance]:
    """The safetensors directory to read and the provenance of ``spec``.

    Raises:
        ModelNotFound: nothing under ``spec`` (a hub id: not in the local cache).
        CorruptModelFile: a damaged GGUF file. BadInput: a GGUF file with the cache off or not writable.
    """
    kind, path, hub = resolve_spec(spec)
    if kind == "gguf":
        cdir = cache_dir(path)
        mark = cdir / CACHE_MARK if cdir is not None else None
        if mark is None or not mark.is_file() or diagnose_dir(cdir, shapes=False) is not None:
            with reading(spec, kind, hub, "load", path):
                load_gguf(path, spec, None)  # dequantizes once and writes the cache (the whole model, this time only)
            if mark is None or not mark.is_file():
                raise BadInput("the GGUF cache is off or not writable (VOCABLENS_CACHE): load the whole model instead")
        prov = Provenance(**{**mark_provenance(cdir).__dict__, "spec": spec, "loaded_from": str(cdir)})
        return cdir, prov
    if kind == "dir":
        return path, dir_provenance(path, spec)
    from huggingface_hub import snapshot_download

    try:
        d = Path(snapshot_download(hub, local_files_only=True, allow_patterns=["*.json", "*.safetensors", "*.model",
                                                                              "*.txt", "*.jinja"]))
    except Exception:
        raise hub_error(hub) from None
    return d, Provenance(spec=spec, name=hub, source=f"hub:{hub}", format="hub", quantization="")


def light_tokenizer(d: Path, trust_remote_code: bool = False, shown: str | None = None):
    """The tokenizer of a model directory through the class its ``tokenizer_config.json`` names
    (the class ``AutoTokenizer`` would pick), without importing transformers' config machinery;
    ``AutoTokenizer`` when the class is not named, not exported or needs remote code.

    Raises:
        CorruptModelFile: the tokenizer cannot be built; the line names ``shown`` (default: ``d``) and
            what in its files disagrees (:func:`vocablens.models.tokenizer_files.building_tokenizer`).
    """
    with building_tokenizer(shown or str(d), lambda: json_tokenizer_problem(d)):
        return _light_tokenizer(d, trust_remote_code)


def _light_tokenizer(d: Path, trust_remote_code: bool):
    import transformers

    cfg_path = d / "tokenizer_config.json"
    try:
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    except (OSError, ValueError):
        cfg = {}
    name = cfg.get("tokenizer_class")
    if name and not trust_remote_code and "auto_map" not in cfg and (d / "tokenizer.json").is_file():
        # the fast class, as AutoTokenizer(use_fast=True) picks it (transformers 4 names the slow one)
        cls = None if name.endswith("Fast") else getattr(transformers, name + "Fast", None)
        cls = cls or getattr(transformers, name, None)
        if cls is not None:
            return cls.from_pretrained(str(d))
    return transformers.AutoTokenizer.from_pretrained(str(d), trust_remote_code=trust_remote_code)


__all__ = ["light_tokenizer", "source_dir"]
