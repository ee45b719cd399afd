"""What is wrong with a model's files, in one line: :func:`reading` turns what transformers raises
while reading a model into a :class:`~vocablens.errors.VocabLensError`, :func:`diagnose_dir` and
:func:`missing_parts` name the file at fault.

Where a spec points (the default model, a ``.gguf`` file, a model directory or a hub id) is decided
once, in :mod:`vocablens.models.files.source` (:func:`~vocablens.models.files.source.resolve_source`); its names
are importable from here as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from vocablens.errors import BadInput, CorruptModelFile, UnsupportedArchitecture, VocabLensError
from vocablens.models.files.remote_code import REMOTE_CODE_HINT, remote_code_message
from vocablens.models.files.source import (  # noqa: F401  (re-exported: where a spec points)
    DEFAULT_GGUF_NAME, DEFAULT_GGUF_PACKAGE, DEFAULT_MODEL, INSTALL_DEFAULT, check_remote_code, default_gguf_path,
    hub_error, hub_is_cached, hub_kwargs, hub_reachable, resolve_spec,
)


def _shape_mismatch(path: Path) -> str | None:
    """The first tensor whose shape in the safetensors files differs from what ``config.json`` builds."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from vocablens.models.files.meta import meta_model

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


def files_fault(path: Path, shapes: bool = True) -> str | None:
    """What is wrong with a model directory, as one line naming the file, or None: first what is
    damaged (:func:`diagnose_dir`, ``shapes`` as there), then what is missing (:func:`missing_parts`)."""
    lack = missing_parts(path)  # cheap (no model built); the damage, when there is some, is said first
    return diagnose_dir(path, shapes) or lack


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
        diag = files_fault(path) if kind == "dir" and path is not None else None
        raise CorruptModelFile(f"cannot {what} {spec}: {diag or msg}") from None


__all__ = ["check_remote_code", "reading", "diagnose_dir", "files_fault", "file_errors", "DEFAULT_MODEL", "INSTALL_DEFAULT", "default_gguf_path",
           "resolve_spec", "hub_error", "hub_is_cached", "hub_reachable", "hub_kwargs"]
