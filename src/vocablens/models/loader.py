"""The one loader: every loading mode behind one function, :func:`load_mode`.

=============  ====================================================================  ==============
mode           what is in memory                                                     forward pass
=============  ====================================================================  ==============
``full``       the whole model (:func:`vocablens.models.load`)                         yes
``borders``    embedding, LM head (+ bias), final norm; ``blocks`` / ``value_vectors``  no
               add one block or every FFN value matrix
               (:func:`vocablens.models.lazy.load_borders_only`)
``head``       LM head and final norm (the family's own module), copy-on-write mapped   no
               (:func:`vocablens.models.matrices.load_head_only`)
``matrices``   embedding and LM head, no transformers modeling code                    no
               (:func:`vocablens.models.matrices.load_matrices_only`)
``streaming``  borders and the blocks that fit in ``max_memory``; the rest are read     yes
               at each forward (:func:`vocablens.models.streaming.load_streaming`)
=============  ====================================================================  ==============

Every mode reads the head the model itself uses (:mod:`vocablens.models.tie`), computes the final
norm with the family's own transformers module, hands out tensors that can be written (a write
into a mapped tensor makes a private copy of its page, never touches the file), and places its real
tensors on ``device`` (the partial modes read onto the CPU, then move: a tied matrix stays one
tensor; the blocks left on ``meta`` stay there).
"""

from __future__ import annotations

import os

from vocablens.errors import BadInput

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
        blocks, value_vectors: for ``borders`` (see :func:`~vocablens.models.lazy.load_borders_only`).

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
        from vocablens.models.loading import load

        return load(spec, device=device, **kw)
    from vocablens.models.checkpoint_files import NoSafetensors

    from vocablens.models.readout_store import apply_stored

    try:
        return apply_stored(_partial(spec, mode, device, kw, max_memory, blocks, value_vectors), str(spec))
    except NoSafetensors:  # pytorch_model.bin only: no header to read a few tensors from
        from vocablens.models.loading import loaded_whole_instead

        return loaded_whole_instead(spec, mode, device=device, **kw)


def _partial(spec, mode: str, device: str, kw: dict, max_memory, blocks, value_vectors):
    """The partial loaders (every mode but ``full``)."""
    if mode == "streaming":
        from vocablens.models.streaming import load_streaming

        return load_streaming(spec, max_memory=max_memory, **kw)
    if mode == "borders":
        from vocablens.models.lazy import load_borders_only

        lm = load_borders_only(spec, blocks=blocks, value_vectors=value_vectors, **kw)
    elif mode == "head":
        from vocablens.models.matrices import load_head_only

        lm = load_head_only(spec, **kw)
    else:
        from vocablens.models.matrices import load_matrices_only

        lm = load_matrices_only(spec, **kw)
    return borders_to(lm, device)


def borders_to(lm, device: str):
    """Move a partially loaded model's real tensors to ``device`` (the blocks stay on ``meta``); a
    tied matrix stays one tensor. Returns ``lm`` itself when nothing moves, else a
    :class:`~vocablens.models.LoadedModel` with fresh borders."""
    import torch

    from vocablens.models.borders import Borders
    from vocablens.models.loading import LoadedModel

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


__all__ = ["MODES", "borders_to", "load_mode"]
