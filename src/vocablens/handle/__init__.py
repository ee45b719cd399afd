"""The handle (layer 4½ of DESIGN.md): :class:`Model` and :func:`load`, text in, results out.

``import vocablens; m = vocablens.load("smollm2")`` gives a :class:`Model`; its methods are the
workflows (``m.lens``, ``m.score``, ``m.expand`` ...), and what they return shows itself
(:mod:`vocablens.handle.results`). ``Model`` composes one mixin per topic (:mod:`vocablens.handle.model`
lists them), each typed by what it needs of the model (:mod:`vocablens.handle.protocols`). The CLI, the
report and the explorer are its clients; it imports analyses, ``render`` and ``models``, never them.
"""

from __future__ import annotations

import os

from vocablens.handle.model import Model
from vocablens.handle.results import Result
from vocablens.models.files.spec import DEFAULT_MODEL


def load(spec: str | os.PathLike | None = DEFAULT_MODEL, dtype=None, device: str = "cpu",
         trust_remote_code: bool = False, max_memory: str | int | dict | None = None, *, read=None,
         blocks=None, device_map: str | dict | None = None, offload_folder: str | os.PathLike | None = None,
         tp: bool = False) -> Model:
    """Load a causal LM as a :class:`Model` (:func:`vocablens.models.load`; the arguments are its).

    ``m = vocablens.load("smollm2")``; it still unpacks as ``model, tokenizer, borders, provenance``.
    ``vocablens.load("smollm2", read=("head", "final_norm"))`` reads those parts only;
    ``vocablens.load(spec, device_map="auto", max_memory={0: "70GiB", 1: "70GiB", "cpu": "200GiB"})``
    places one model over several devices (:mod:`vocablens.models.files.placement`; ``"disk"`` offload
    included, ``offload_folder`` for what transformers rewrites), every workflow giving the figures of
    a one-device load. ``vocablens.load(spec, tp=True)`` under torchrun splits the model over the ranks
    with transformers' tensor parallel (lens, score, generate and lens evaluation then read the head
    vocab-parallel, :mod:`vocablens.lens.readout_path`).
    Transformers' progress bars and logging are silenced for the duration of the load only (the
    previous settings are put back), so a notebook shows no bars and no IProgress warning.

    Raises:
        ModelNotFound, CorruptModelFile, UnsupportedArchitecture, BadInput: as :func:`vocablens.models.load`.
    """
    from vocablens.handle.quiet import quiet_loading

    with quiet_loading():
        from vocablens import models

        lm = models.load(spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                         max_memory=max_memory, read=read, blocks=blocks, device_map=device_map,
                         offload_folder=offload_folder, tp=tp)
    return Model.of(lm, spec=str(spec) if spec is not None else DEFAULT_MODEL)


__all__ = ["Model", "Result", "load"]
