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
from vocablens.models.files.spec import DEFAULT_MODEL
from vocablens.models.files.loaded_model import with_note

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
        from vocablens.models.files.checkpoint_files import read_tensors

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
    from vocablens.models.files.checkpoint_files import shard_files

    return sum(f.stat().st_size for f in set(shard_files(d).values()))


def load_streaming(spec: str | os.PathLike = DEFAULT_MODEL, max_memory: str | int = "1GB", dtype=None,
                   trust_remote_code: bool = False):
    """Load a model whose weights need not fit in memory: blocks beyond ``max_memory`` are streamed.

    Args:
        spec: as :func:`vocablens.models.load` (safetensors checkpoints; a ``.gguf`` file through its
            float32 cache, which the first load writes).
        max_memory: bytes (int) or a size string (``"200MB"``, ``"2GiB"``) for the weights kept
            resident: the borders always, then blocks 0, 1, ... while they fit; the rest stream.
        dtype: torch dtype or name, ``"auto"`` for the checkpoint's; default: the normal load's
            (:func:`~vocablens.models.files.checkpoint_files.normal_load_dtype`), so a checkpoint of mixed dtypes is cast to one, as
            :func:`vocablens.models.load` does, and a float16 one runs in float32 (a provenance note).

    Returns:
        :class:`~vocablens.models.LoadedModel` whose dtypes and forward (``borders.residual_stream``,
        ``model(...)``) equals the normal load's. ``model.vocablens_streamers`` lists the
        :class:`BlockStreamer` of each streamed block (``loads`` counts the reads).

    Raises:
        BadInput: a bad ``max_memory``; a block holding a buffer the checkpoint does not store.
        CorruptModelFile: a shard the index names is missing (checked before anything loads).
        As :func:`vocablens.models.files.partial.read_parts` otherwise (the same materializer reads the resident parts).
    """
    from vocablens.models.files.source import resolve_source, run_dtype
    from vocablens.models.files.sources import source_dir

    cap = parse_bytes(max_memory)
    source = resolve_source(spec)
    d, prov = source_dir(source)
    tdtype, dtype_note = run_dtype(source, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    return with_note(stream_beyond(source.spec, d, prov, cap, tdtype, trust_remote_code), dtype_note)


def stream_beyond(spec: str, d: Path, prov, cap: int, tdtype: torch.dtype | None, trust_remote_code: bool = False):
    """:func:`load_streaming` of the safetensors directory ``d`` (``prov`` its provenance), ``cap``
    bytes resident, in ``tdtype`` (None: the normal load's,
    :func:`~vocablens.models.files.checkpoint_files.normal_load_dtype`): the borders
    read by the one materializer (:func:`vocablens.models.files.partial.materialize_parts`), then the
    parameters outside the blocks, then the blocks that fit; the rest stream.

    Raises:
        As :func:`load_streaming`.
    """
    from vocablens.models.files import partial  # materialize_parts looked up at each call (tests replace it)
    from vocablens.models.files.checkpoint_files import check_shards, normal_load_dtype_of, shard_files, streamed_keys

    files = shard_files(d)
    check_shards(d, files)  # a missing shard: one line now, not a traceback mid-forward
    if tdtype is None:  # the normal load's one dtype (a mixed checkpoint is cast, as from_pretrained does)
        tdtype = normal_load_dtype_of(d, files, trust_remote_code)
    lm = partial.materialize_parts(spec, d, prov, partial.Parts.of(partial.BORDERS), tdtype, trust_remote_code)
    from vocablens.models.files.checkpoint_files import renamed_files

    files = renamed_files(lm.model, files)  # the checkpoint's keys as the model names them (a vision-language model)
    used, block_keys = streamed_keys(lm, files, tdtype)
    b = lm.borders
    streamers, resident = [], []
    for blk, keys in zip(b.blocks, block_keys):
        need = sum(p.numel() * (b.W_E.element_size() if tdtype is None else p.element_size())
                   for p in blk.parameters())
        if not streamers and used + need <= cap:
            resident.append((blk, keys))
            used += need
        else:
            streamers.append(BlockStreamer(blk, keys, tdtype))
    for blk, keys in resident:  # read once and kept
        s = BlockStreamer(blk, keys, tdtype)
        s._load(blk, (), {})
        s.remove()
    lm.model.vocablens_streamers = streamers
    lm.model.vocablens_streamed = True
    return lm


__all__ = ["BlockStreamer", "checkpoint_bytes", "load_streaming", "parse_bytes", "stream_beyond"]
