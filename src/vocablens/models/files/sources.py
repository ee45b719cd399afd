"""Where a spec's files are read from by the partial loaders, and its tokenizer read cheaply.

:func:`source_dir` turns a :class:`~vocablens.models.files.source.Source` (``smollm2``, a directory, a ``.gguf`` file, a hub id) into the
safetensors directory to read and its provenance: a GGUF file is read from its float32 cache
(:mod:`vocablens.models.files.gguf_cache`; the first call dequantizes it once and writes the entry).
A directory's tokenizer is read cheaply by :func:`vocablens.models.files.tokenizer_files.light_tokenizer`.
"""

from __future__ import annotations

from pathlib import Path

from vocablens.errors import BadInput
from vocablens.models.files.gguf_cache import CACHE_MARK, cache_dir, load_gguf, mark_provenance
from vocablens.models.files.provenance import Provenance, dir_provenance
from vocablens.models.files.source import Source, hub_error
from vocablens.models.files.spec import diagnose_dir, reading



def source_dir(source: Source) -> tuple[Path, Provenance]:
    """The safetensors directory to read and the provenance of ``source``
    (:class:`~vocablens.models.files.source.Source`).

    Raises:
        ModelNotFound: nothing under ``spec`` (a hub id: not in the local cache).
        CorruptModelFile: a damaged GGUF file. BadInput: a GGUF file with the cache off or not writable.
    """
    spec, kind, path, hub = source.spec, source.kind, source.path, source.hub
    if kind == "gguf":
        cdir = cache_dir(path)
        mark = cdir / CACHE_MARK if cdir is not None else None
        if mark is None or not mark.is_file() or diagnose_dir(cdir, shapes=False) is not None:
            with reading(spec, kind, hub, "load", path):
                load_gguf(source, None)  # dequantizes once and writes the cache (the whole model, this time only)
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


__all__ = ["source_dir"]
