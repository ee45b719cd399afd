"""A safetensors checkpoint's tensors by name: which file holds each, and reading a few of them.

The low-level reading that every partial read shares (:func:`vocablens.models.files.partial.materialize_parts`,
:mod:`vocablens.models.files.matrices_only`, the streamed blocks) and the tie check: :func:`shard_files`
(tensor name -> file, single file or sharded through ``model.safetensors.index.json``),
:func:`checkpoint_name` (a model parameter's key in the checkpoint, with or without the base-model prefix), :func:`read_tensors` (memory-mapped by
``safe_open``), :func:`materialize` (meta parameters of a model replaced by the checkpoint's
tensors) and the names under which checkpoints store the two vocabulary matrices
(:data:`EMB_SUFFIXES`, :data:`HEAD_NAMES`, :func:`matrix_keys`). Nothing here knows a model family
or imports transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vocablens.errors import BadInput, CorruptModelFile

#: how checkpoints name the embedding matrix (the key ends with one of these)
EMB_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight",
                "tok_embeddings.weight")
#: how checkpoints name a stored LM head (the key is one of these, or ends with ``.`` + one)
HEAD_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")


class RenamedFiles(dict):
    """tensor name -> file, as :func:`shard_files`, under the names the model's parameters have when
    the checkpoint stores them under others (a vision-language checkpoint's
    ``language_model.model.embed_tokens.weight`` read as ``model.language_model.embed_tokens.weight``);
    ``stored`` maps such a name back to the key in the file (:func:`read_tensors` reads by it)."""

    def __init__(self, files: dict[str, Path], stored: dict[str, str]):
        super().__init__(files)
        self.stored = stored


class NoSafetensors(BadInput):
    """A checkpoint whose weights are only ``pytorch_model*.bin`` pickles: the partial reads read
    safetensors headers, so :func:`vocablens.models.files.loader.load` loads such a model whole."""


def renamed_files(model, files: dict):
    """``files`` (checkpoint key -> file) under the names of ``model``'s parameters, where
    transformers renames the checkpoint's keys on load (its own conversion mapping: a LLaVA
    checkpoint's ``language_model.lm_head.weight`` is the model's ``lm_head.weight``); ``files``
    itself when nothing is renamed. Only renamings are applied (no tensor is converted).

    Returns:
        :class:`RenamedFiles` or ``files``.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key

        renames = [c for c in get_model_conversion_mapping(model) if type(c) is WeightRenaming]
    except (ImportError, AttributeError, TypeError, ValueError):  # a transformers without the mapping
        return files
    if not renames:
        return files
    meta = dict.fromkeys(model.state_dict())
    named = {}
    for k in files:
        new = rename_source_key(k, renames, [], getattr(model, "base_model_prefix", None), meta)[0]
        named[new] = k
    if all(new == k for new, k in named.items()):
        return files
    return RenamedFiles({new: files[k] for new, k in named.items()}, {new: k for new, k in named.items() if new != k})


def shard_files(d: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it, for a model directory (single file or sharded).

    Raises:
        CorruptModelFile: an unreadable index or safetensors header; no weights at all.
        NoSafetensors: weights only as ``pytorch_model*.bin`` (the partial loaders need safetensors).
    """
    from safetensors import safe_open

    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CorruptModelFile(f"cannot read {index}: {e}; download the checkpoint again") from None
        return {k: d / v for k, v in wm.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        if not any(d.glob("pytorch_model*.bin")):
            raise CorruptModelFile(f"{d} holds no weights (*.safetensors); download the checkpoint into it")
        raise NoSafetensors(f"{d} has no safetensors weights; reading only the borders needs them "
                            "(load the whole model instead)")
    out = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                out.update({k: f for k in h.keys()})
        except Exception as e:  # safetensors raises its own error types for a damaged header
            raise CorruptModelFile(f"cannot read {f}: {str(e).splitlines()[0]}; download it again") from None
    return out


def matrix_keys(files: dict[str, Path]) -> tuple[list[str], list[str]]:
    """``(embedding keys, head keys)``: the checkpoint keys named like an embedding or a stored head."""
    embs = [k for k in files if k.endswith(EMB_SUFFIXES)]
    heads = [k for k in files if k in HEAD_NAMES or any(k.endswith("." + h) for h in HEAD_NAMES)]
    return embs, heads


def checkpoint_name(param: str, available: dict[str, Path], prefix: str) -> str | None:
    """The checkpoint key of a model parameter (checkpoints may omit or add the base-model prefix)."""
    cands = [param]
    if prefix and param.startswith(prefix + "."):
        cands.append(param[len(prefix) + 1:])
    elif prefix:
        cands.append(f"{prefix}.{param}")
    return next((c for c in cands if c in available), None)


def read_tensors(keys: list[str], files: dict[str, Path], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The checkpoint tensors ``keys``: the one reader of every partial load (borders, head, matrices,
    streamed blocks). Memory-mapped by ``safe_open`` as a private copy-on-write mapping (writing into
    a tensor copies that page for this process, never touches the file); converted when ``dtype``
    is given (then an in-memory copy).

    Raises:
        CorruptModelFile: a file that cannot be read (one line naming it).
    """
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for k in keys:
        by_file.setdefault(files[k], []).append(k)
    stored = getattr(files, "stored", {})  # RenamedFiles: the key in the file of a renamed tensor
    out = {}
    for f, ks in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in ks:
                    t = h.get_tensor(stored.get(k, k))
                    out[k] = t if dtype is None else t.to(dtype)
        except Exception as e:  # safetensors raises its own error types for a damaged file
            raise CorruptModelFile(f"cannot read {f}: {str(e).splitlines()[0]}; download it again") from None
    return out


def materialize(model: torch.nn.Module, names: list[str], files: dict[str, Path], dtype: torch.dtype | None) -> None:
    """Replace the meta parameters ``names`` of ``model`` by the checkpoint's tensors (in place).

    Raises:
        CorruptModelFile: a parameter the checkpoint does not hold, or holds in another shape.
    """
    prefix = getattr(model, "base_model_prefix", "") or ""
    params = dict(model.named_parameters())
    pairs = []
    for n in names:
        key = checkpoint_name(n, files, prefix)
        if key is None:
            raise CorruptModelFile(f"the checkpoint has no tensor for {n}; it does not match its config")
        pairs.append((n, key))
    ts = read_tensors([k for _, k in pairs], files, dtype)
    for n, key in pairs:
        t, p = ts[key], params[n]
        if tuple(t.shape) != tuple(p.shape):
            raise CorruptModelFile(f"{files[key].name}: {key} has shape {tuple(t.shape)}, the config says "
                                   f"{tuple(p.shape)}; the config and the weights disagree")
        mod_name, _, attr = n.rpartition(".")
        mod = model.get_submodule(mod_name) if mod_name else model
        setattr(mod, attr, torch.nn.Parameter(t, requires_grad=False))


def check_shards(d: Path, files: dict[str, Path]) -> None:
    """Every file a checkpoint's index names exists (checked before anything loads).

    Raises:
        CorruptModelFile: one line naming the first missing shard and how many tensors it holds.
    """
    from vocablens.errors import CorruptModelFile

    held: dict[Path, int] = {}
    for f in files.values():
        held[f] = held.get(f, 0) + 1
    missing = sorted(f for f in held if not f.is_file())
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CorruptModelFile(f"{d}: shard {missing[0].name}{more} is missing; model.safetensors.index.json "
                               f"names it for {held[missing[0]]} tensors; download the checkpoint again")


def normal_load_dtype(config, d: Path, files: dict[str, Path]) -> torch.dtype:
    """The dtype :func:`vocablens.models.load` gives this checkpoint (transformers'
    ``from_pretrained(dtype="auto")``): ``config.dtype`` when set, else the index's ``metadata.dtype``,
    else the first floating-point tensor of the first shard (file names sorted), as transformers'
    ``get_state_dict_dtype`` finds it. Every parameter is then cast to it, as the normal load does."""
    import json

    from transformers.modeling_utils import get_state_dict_dtype, load_state_dict

    cd = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if cd is not None:
        return cd if isinstance(cd, torch.dtype) else getattr(torch, str(cd).replace("torch.", ""))
    index = d / "model.safetensors.index.json"
    if index.is_file():
        meta = json.loads(index.read_text()).get("metadata") or {}
        if isinstance(meta.get("dtype"), str) and hasattr(torch, meta["dtype"]):
            return getattr(torch, meta["dtype"])
    first = sorted({str(f) for f in files.values()})[0]
    return get_state_dict_dtype(load_state_dict(first, map_location="meta"))


def normal_load_dtype_of(d: Path, files: dict[str, Path], trust_remote_code: bool) -> torch.dtype | None:
    """:func:`normal_load_dtype` of directory ``d``; None when its config cannot be read (the
    borders' read then says what is wrong with it)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    return normal_load_dtype(config, d, files)


def streamed_keys(lm, files: dict[str, Path], tdtype) -> tuple[int, list[dict[str, tuple[str, Path]]]]:
    """What a streaming load reads from the checkpoint ``files`` beside the borders: the parameters
    outside the borders and the blocks (learned positions: GPT-2, OPT), read now and kept resident, and
    for each block its parameters and buffers on ``meta`` -> (checkpoint key, file), read at each
    forward. Returns ``(bytes of every real parameter, [keys of block i for i in 0..L-1])``.

    Raises:
        UnsupportedArchitecture: a buffer outside the blocks, or a tensor of a block, that the
            checkpoint does not store (the first one, named).
    """
    from vocablens.errors import UnsupportedArchitecture
    from vocablens.models.find import named_children

    b, model = lm.borders, lm.model
    in_blocks = {id(t) for blk in b.blocks for t in [*blk.parameters(), *blk.buffers()]}
    rest = [n for n, p in model.named_parameters() if p.is_meta and id(p) not in in_blocks]
    materialize(model, rest, files, tdtype)
    lost = [n for n, t in model.named_buffers() if t.is_meta and id(t) not in in_blocks]
    where, why, keys = model, None, []
    if lost:
        why = f"buffer {lost[0]} is not in the checkpoint, so the model cannot be streamed; load it whole"
    names = {id(blk): n for n, blk in model.named_modules() if any(blk is x for x in b.blocks)}
    for i, blk in enumerate(b.blocks if why is None else ()):
        got, missing = _block_keys(model, blk, names[id(blk)], files)
        if missing is not None:
            where, why = blk, (f"block {i}: {missing} is not in the checkpoint, so it cannot be streamed; load the "
                               "whole model (no `max_memory`)")
            break
        keys.append(got)
    if why is not None:
        raise UnsupportedArchitecture(b.family, named_children(where), why)
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters() if not p.is_meta}.values()), keys


def _block_keys(model, blk, bname: str, files: dict[str, Path]) -> tuple[dict[str, tuple[str, Path]], str | None]:
    """``(block's parameters and buffers on meta -> (checkpoint key, file), the first one the
    checkpoint does not store or None)``."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    keys: dict[str, tuple[str, Path]] = {}
    for n, t in [*blk.named_parameters(), *blk.named_buffers()]:
        if not t.is_meta:
            continue
        key = checkpoint_name(f"{bname}.{n}", files, prefix)
        if key is None:
            return keys, n
        keys[n] = (getattr(files, "stored", {}).get(key, key), files[key])  # the key in the file
    return keys, None


__all__ = ["renamed_files", "check_shards", "normal_load_dtype", "normal_load_dtype_of", "streamed_keys", "EMB_SUFFIXES", "HEAD_NAMES", "NoSafetensors", "RenamedFiles", "checkpoint_name", "materialize", "matrix_keys", "read_tensors",
           "shard_files"]
