"""Models larger than memory: the full forward with blocks streamed from the checkpoint.

:func:`load_streaming` keeps the borders (embedding, LM head, final norm) and as many blocks as fit
in ``max_memory`` resident; every other block stays on the ``meta`` device and is read from the
safetensors checkpoint just before its forward (``safe_open``: memory-mapped, zero-copy when the
dtype is the checkpoint's) and dropped right after it, with the file's mapping closed so its pages
leave the process. The forward therefore holds the borders, the resident blocks, one streamed
block and the residual stream: the same layer-by-layer idea as accelerate's disk offload
(``device_map`` + ``max_memory``), without copying the checkpoint to an offload folder.

Results are the same tensors as the normal load (same weights, same kernels, same order); the cost
is reading each streamed block once per forward (see ``benchmarks/memory.py --max-memory``).
Weights of a streamed block are on ``meta`` outside its forward: analyses that read block weights
directly (``explain``'s head attribution, ``project``) need the whole model or the one-block load
(``vocablens.models.load(spec, read=..., blocks=[i])``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from vocablens.errors import BadInput
from vocablens.models.spec import DEFAULT_MODEL

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """``"200MB"`` -> 200_000_000 (kB/MB/GB are powers of 10, KiB/MiB/GiB of 2; a bare number is bytes).

    Raises:
        BadInput: not a positive size.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise BadInput(f"`max_memory` takes a size such as 200MB, 1.5GB or 800MiB; got {text!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise BadInput(f"`max_memory` must be positive; got {text!r}")
    return n


def _nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


class BlockStreamer:
    """Reads one block's tensors before its forward and drops them after it (forward hooks).

    Args:
        block: the block module (its parameters on ``meta``).
        keys: parameter or buffer name inside the block -> (checkpoint key, file).
        dtype: dtype to convert to, or None for the checkpoint's.
    """

    def __init__(self, block: torch.nn.Module, keys: dict[str, tuple[str, Path]], dtype: torch.dtype | None):
        self.block, self.keys, self.dtype = block, keys, dtype
        self.loads = 0
        from vocablens.models.hooks import ModelPatch

        self._patch = ModelPatch()  # kept for the model's lifetime; remove() takes the hooks off again
        self._patch.pre_hook(block, self._load, with_kwargs=True)
        self._patch.post_hook(block, self._drop, with_kwargs=True, always_call=True)

    def _set(self, name: str, t: torch.Tensor) -> None:
        mod_name, _, attr = name.rpartition(".")
        mod = self.block.get_submodule(mod_name) if mod_name else self.block
        if attr in mod._parameters:
            mod._parameters[attr] = torch.nn.Parameter(t, requires_grad=False)
        else:
            mod._buffers[attr] = t

    def _load(self, module, args, kwargs):
        from vocablens.models.checkpoint_files import read_tensors

        ts = read_tensors([k for k, _ in self.keys.values()], dict(self.keys.values()), self.dtype)
        for name, (key, _) in self.keys.items():
            self._set(name, ts[key])
        self.loads += 1

    def _drop(self, module, args, kwargs, output):
        for name in self.keys:
            mod_name, _, attr = name.rpartition(".")
            mod = self.block.get_submodule(mod_name) if mod_name else self.block
            old = mod._parameters.get(attr, mod._buffers.get(attr))
            self._set(name, torch.empty(old.shape, dtype=old.dtype, device="meta"))
        # the block's tensors are gone: their file mappings close, and its pages leave the process

    def remove(self) -> None:
        """Detach the hooks (the block stays on ``meta``)."""
        self._patch.close()


def checkpoint_bytes(d: Path) -> int:
    """Bytes of a safetensors checkpoint directory (the files, headers included)."""
    from vocablens.models.checkpoint_files import shard_files

    return sum(f.stat().st_size for f in set(shard_files(d).values()))


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


def load_streaming(spec: str | os.PathLike = DEFAULT_MODEL, max_memory: str | int = "1GB", dtype=None,
                   trust_remote_code: bool = False):
    """Load a model whose weights need not fit in memory: blocks beyond ``max_memory`` are streamed.

    Args:
        spec: as :func:`vocablens.models.load` (safetensors checkpoints; a ``.gguf`` file through its
            float32 cache, which the first load writes).
        max_memory: bytes (int) or a size string (``"200MB"``, ``"2GiB"``) for the weights kept
            resident: the borders always, then blocks 0, 1, ... while they fit; the rest stream.
        dtype: torch dtype or name, ``"auto"`` for the checkpoint's; default: the normal load's
            (:func:`normal_load_dtype`), so a checkpoint of mixed dtypes is cast to one, as
            :func:`vocablens.models.load` does, and a float16 one runs in float32 (a provenance note).

    Returns:
        :class:`~vocablens.models.LoadedModel` whose dtypes and forward (``borders.residual_stream``,
        ``model(...)``) equals the normal load's. ``model.vocablens_streamers`` lists the
        :class:`BlockStreamer` of each streamed block (``loads`` counts the reads).

    Raises:
        BadInput: a bad ``max_memory``; a block holding a buffer the checkpoint does not store.
        CorruptModelFile: a shard the index names is missing (checked before anything loads).
        As :func:`vocablens.models.partial.read_parts` otherwise (the same materializer reads the resident parts).
    """
    from vocablens.models.source import resolve_source, run_dtype
    from vocablens.models.sources import source_dir

    cap = parse_bytes(max_memory)
    source = resolve_source(spec)
    d, prov = source_dir(source)
    tdtype, dtype_note = run_dtype(source, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    return stream_beyond(source.spec, d, prov, cap, tdtype, trust_remote_code).with_note(dtype_note)


def stream_beyond(spec: str, d: Path, prov, cap: int, tdtype: torch.dtype | None, trust_remote_code: bool = False):
    """:func:`load_streaming` of the safetensors directory ``d`` (``prov`` its provenance), ``cap``
    bytes resident, in ``tdtype`` (None: the normal load's, :func:`normal_load_dtype`): the borders
    read by the one materializer (:func:`vocablens.models.partial.materialize_parts`), then the
    parameters outside the blocks, then the blocks that fit; the rest stream.

    Raises:
        As :func:`load_streaming`.
    """
    from vocablens.models import partial  # materialize_parts looked up at each call (tests replace it)
    from vocablens.models.checkpoint_files import shard_files

    files = shard_files(d)
    check_shards(d, files)  # a missing shard: one line now, not a traceback mid-forward
    if tdtype is None:  # the normal load's one dtype (a mixed checkpoint is cast, as from_pretrained does)
        tdtype = _normal_load_dtype_of(d, files, trust_remote_code)
    lm = partial.materialize_parts(spec, d, prov, partial.Parts.of(partial.BORDERS), tdtype, trust_remote_code)
    from vocablens.models.auto_class import renamed_files

    files = renamed_files(lm.model, files)  # the checkpoint's keys as the model names them (a vision-language model)
    used = _outside_blocks_resident(lm, files, tdtype)
    b, model = lm.borders, lm.model
    block_names = {id(blk): n for n, blk in model.named_modules() if any(blk is x for x in b.blocks)}
    streamers, resident = [], []
    for i, blk in enumerate(b.blocks):
        need = sum(p.numel() * (b.W_E.element_size() if tdtype is None else p.element_size())
                   for p in blk.parameters())
        keys = _block_keys(model, blk, block_names[id(blk)], files, i, b.family)
        if not streamers and used + need <= cap:
            resident.append((blk, keys))
            used += need
        else:
            streamers.append(BlockStreamer(blk, keys, tdtype))
    for blk, keys in resident:  # read once and kept
        s = BlockStreamer(blk, keys, tdtype)
        s._load(blk, (), {})
        s.remove()
    model.vocablens_streamers = streamers
    model.vocablens_streamed = True
    return lm


def _normal_load_dtype_of(d: Path, files: dict[str, Path], trust_remote_code: bool) -> torch.dtype | None:
    """:func:`normal_load_dtype` of directory ``d``; None when its config cannot be read (the
    borders' read then says what is wrong with it)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    return normal_load_dtype(config, d, files)


def _outside_blocks_resident(lm, files: dict[str, Path], tdtype) -> int:
    """Read the parameters outside the borders and the blocks (learned positions: GPT-2, OPT) and
    keep them resident; returns the bytes of every real parameter.

    Raises:
        UnsupportedArchitecture: a buffer outside the blocks that the checkpoint does not store.
    """
    from vocablens.errors import UnsupportedArchitecture
    from vocablens.models.checkpoint_files import materialize
    from vocablens.models.find import named_children

    b, model = lm.borders, lm.model
    in_blocks = {id(t) for blk in b.blocks for t in [*blk.parameters(), *blk.buffers()]}
    rest = [n for n, p in model.named_parameters() if p.is_meta and id(p) not in in_blocks]
    materialize(model, rest, files, tdtype)
    lost = [n for n, t in model.named_buffers() if t.is_meta and id(t) not in in_blocks]
    if lost:
        raise UnsupportedArchitecture(b.family, named_children(model), f"buffer {lost[0]} is not in the "
                                      "checkpoint, so the model cannot be streamed; load it whole")
    return _nbytes({id(p): p for p in model.parameters() if not p.is_meta}.values())


def _block_keys(model, blk, bname: str, files: dict[str, Path], i: int, family: str) -> dict[str, tuple[str, Path]]:
    """Block ``i``'s parameters and buffers on ``meta`` -> (checkpoint key, file).

    Raises:
        UnsupportedArchitecture: one of them is not in the checkpoint.
    """
    from vocablens.errors import UnsupportedArchitecture
    from vocablens.models.checkpoint_files import checkpoint_name
    from vocablens.models.find import named_children

    prefix = getattr(model, "base_model_prefix", "") or ""
    keys: dict[str, tuple[str, Path]] = {}
    for n, t in [*blk.named_parameters(), *blk.named_buffers()]:
        if not t.is_meta:
            continue
        key = checkpoint_name(f"{bname}.{n}", files, prefix)
        if key is None:
            raise UnsupportedArchitecture(family, named_children(blk), f"block {i}: {n} is not in the checkpoint, "
                                          "so it cannot be streamed; load the whole model (no `max_memory`)")
        keys[n] = (getattr(files, "stored", {}).get(key, key), files[key])  # the key in the file
    return keys


__all__ = ["BlockStreamer", "checkpoint_bytes", "load_streaming", "parse_bytes", "stream_beyond"]
