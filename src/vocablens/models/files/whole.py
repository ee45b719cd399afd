"""The whole model through transformers, on one device, placed by a device map, split by tensor
parallel or loaded by a quantizer (:func:`load_whole`, the loader's full read: :func:`vocablens.models.load`
with no ``read``), ending with the readout check
(:func:`~vocablens.models.files.readout_store.checked_readout`).

A GGUF file loads through its float32 cache (:mod:`vocablens.models.files.gguf_cache`); a directory or hub
id through ``from_pretrained`` of the causal-LM class, else the image-text-to-text one
(:mod:`vocablens.models.files.auto_class`), with the device map's arguments
(:mod:`vocablens.models.files.placement`), the tensor-parallel plan (:mod:`vocablens.models.tensor_parallel`)
or the checkpoint's own quantizer (:mod:`vocablens.models.files.quantized`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vocablens.errors import BadInput
from vocablens.models.files.gguf_cache import load_gguf
from vocablens.models.files.loaded_model import LoadedModel, with_note
from vocablens.models.files.provenance import Provenance, dir_provenance
from vocablens.models.files.quantized import placed_on, quantization_config, quantized_provenance, refused
from vocablens.models.files.source import Source, hub_kwargs
from vocablens.models.files.spec import reading
from vocablens.models.files.tokenizer_files import building_tokenizer, hub_tokenizer_problem, json_tokenizer_problem


def load_whole(source: Source, run: tuple, device: str, trust_remote_code: bool, placement: tuple | None = None,
               tp: bool = False) -> LoadedModel:
    """The whole model of ``source`` (:class:`~vocablens.models.files.source.Source`) in ``run``'s dtype
    (``(dtype, note)`` of :func:`~vocablens.models.files.source.run_dtype`) through transformers (a GGUF file through its float32 cache), its readout checked against the
    model's own logits (:func:`~vocablens.models.files.readout_store.checked_readout`); ``placement``: ``(device map, max_memory, offload
    folder)`` of :mod:`vocablens.models.files.placement`, or None (all on ``device``); ``tp``: split over the
    torchrun ranks by the family's tensor-parallel plan (``tp_plan="auto"``, placed by transformers)."""
    from transformers import AutoTokenizer

    from vocablens.models.files import placement as P
    from vocablens.models.files.readout_store import checked_readout

    spec, kind, path, hub = source.spec, source.kind, source.path, source.hub
    tdtype, dtype_note = run
    prov, scratch = None, None
    if placement is not None and kind == "gguf":  # a device map reads the float32 cache as a directory
        from vocablens.models.files.sources import source_dir

        path, prov = source_dir(source)  # the provenance names the GGUF file, as a whole load's does
        kind = "dir"
    with reading(spec, kind, hub, "load", path):
        if kind == "gguf":
            tok, model, prov = load_gguf(source, tdtype)
        else:
            src = str(path) if kind == "dir" else hub
            kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
            if kind == "hub":
                kw.update(hub_kwargs(hub))
            with building_tokenizer(spec, lambda: json_tokenizer_problem(Path(src)) if kind == "dir"
                                    else hub_tokenizer_problem(src)):
                tok = AutoTokenizer.from_pretrained(src, **kw)
            placed = {} if placement is None else P.placed_kwargs(src, kw, tdtype, *placement)
            scratch = placed.pop("scratch", None)
            if tp:
                placed["tp_plan"] = _tp_plan(src, kw)
            with _tp_failure(tp, "loading"):
                model = _from_pretrained(spec, src, tdtype, kw, placed)
    if placement is None and not tp:  # a tensor-parallel load sits where transformers put each rank's shards
        placed_on(model, spec, device)
    P.remove_scratch_with(model, scratch)
    if prov is None:  # a directory or hub id read by from_pretrained
        prov = dir_provenance(path, spec) if kind == "dir" else Provenance(
            spec=spec, name=hub, source=f"hub:{hub}", format="hub",
            quantization=str(getattr(model.config, "dtype", "") or ""),
        )
    model.eval()
    model.requires_grad_(False)
    pdtype = next(model.parameters()).dtype
    prov = Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})
    from vocablens.models.borders import Borders

    found = Borders.from_model(model, tokenizer=tok)
    prov = quantized_provenance(prov, model, found)  # the matrices read dequantized, and said so
    with _tp_failure(tp, "running the probe forward"):  # tensor parallel: the same check, the probe's logits gathered
        borders, line = checked_readout(found, source)
    if tp:
        from vocablens.models.tensor_parallel import check_split, world_size

        check_split(borders)
        line += f", tensor parallel over {world_size()} ranks"
    lm = with_note(LoadedModel(model, tok, borders, Provenance(**{**prov.__dict__, "readout": line})), dtype_note)
    return lm if placement is None else with_note(lm, P.placement_line(found))


def loaded_whole_instead(source: Source, mode: str, run: tuple, device: str = "cpu", trust_remote_code: bool = False,
                         why: str = "pickle") -> LoadedModel:
    """The whole model of ``source``, in ``run``'s dtype (``(dtype, note)`` of
    :func:`~vocablens.models.files.source.run_dtype`), for a partial ``mode`` of a checkpoint stored as
    ``pytorch_model*.bin`` only (``why="pickle"``: the partial reads need safetensors headers), or
    quantized by a transformers quantizer (``why="quantized"``: its tensors are stored quantized, under
    the quantizer's own names, and only the quantizer reads them), and a
    :class:`~vocablens.errors.VocabLensNote` saying so once it loaded (a hostile pickle fails first,
    with its own line)."""
    import warnings

    from vocablens.errors import VocabLensNote

    lm = load_whole(source, run, device, trust_remote_code)
    what = "the blocks that fit" if mode == "streaming" else "the borders"
    if why == "quantized":
        line = (f"{source.spec} is quantized ({lm.provenance.quantization}); reading just {what} needs the quantizer, "
                "so the whole model was loaded (its matrices read dequantized)")
    else:
        line = (f"{source.spec} holds its weights as pytorch_model.bin only; reading just {what} needs "
                "safetensors, so the whole model was loaded (read with weights_only=True)")
    warnings.warn(VocabLensNote(line), stacklevel=3)
    return lm


def _from_pretrained(spec: str, src: str, tdtype, kw: dict, placed: dict):
    """``from_pretrained`` of a directory or hub id (the causal-LM class, else the image-text-to-text
    one: :func:`~vocablens.models.files.auto_class.auto_model_class`). A checkpoint quantized by a
    transformers quantizer (its config's ``quantization_config``) loads through it too, placed by the
    quantizer (a quantized model cannot be moved after loading). ``kw``: the config's and the weights'
    keyword arguments (revision, trust_remote_code ...); ``placed``: the weights' alone (a device map's).

    Raises:
        UnsupportedQuantization: a quantized checkpoint transformers cannot load here (its quantizer's
            package or device missing), in one line.
    """
    from transformers import AutoConfig

    from vocablens.models.files.auto_class import auto_model_class

    config = AutoConfig.from_pretrained(src, **kw)  # the causal-LM mapping, else image-text-to-text
    try:
        return auto_model_class(config).from_pretrained(src, config=config, dtype=tdtype or "auto",
                                                        use_safetensors=None, **kw, **placed)
    except (ImportError, ValueError, RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
        qc = quantization_config(config)
        if qc is None:
            raise
        raise refused(spec, qc, exc) from None


@contextmanager
def _tp_failure(tp: bool, step: str):
    """Under ``tp``, an error of transformers' tensor-parallel code becomes one line naming the step
    (:class:`~vocablens.errors.UnsupportedArchitecture`), never a traceback nor a replicated load."""
    from vocablens.errors import UnsupportedArchitecture, VocabLensError

    try:
        yield
    except VocabLensError:
        raise
    except Exception as e:  # noqa: BLE001  (transformers' TP code raises many kinds)
        if not tp:
            raise
        first = (str(e).splitlines() or [""])[0][:160]
        raise UnsupportedArchitecture("tensor parallel", [type(e).__name__],
                                      f"--tp: {step} with the family's tensor-parallel plan failed: {first}") from None


def _tp_plan(src: str, kw: dict) -> str:
    """``"auto"`` for a family whose config has a tensor-parallel plan.

    Raises:
        BadInput: the family has none (one line; never loaded replicated instead)."""
    from transformers import AutoConfig

    from vocablens.models.tensor_parallel import plan_refusal

    why = plan_refusal(AutoConfig.from_pretrained(src, **kw))
    if why:
        raise BadInput(why)
    return "auto"


__all__ = ["load_whole", "loaded_whole_instead"]
