"""The whole model through transformers, on one device, placed by a device map, split by tensor
parallel or loaded by a quantizer (:func:`load_whole`, the loader's full read: :func:`vocablens.models.load`
with no ``read``), ending with the readout check
(:func:`~vocablens.models.files.readout_store.checked_readout`).

A GGUF file loads through its float32 cache (:mod:`vocablens.models.files.gguf_cache`); a directory or hub
id through transformers' ``from_pretrained`` (:mod:`vocablens.models.files.pretrained`: the device map's
arguments, the tensor-parallel plan or the checkpoint's own quantizer); then the model is placed on
the device (a quantized one where its quantizer put it: :func:`~vocablens.models.files.quantized.placed_on`),
its provenance read, its borders found and its readout checked.
"""

from __future__ import annotations

from vocablens.models.files.gguf_cache import load_gguf
from vocablens.models.files.loaded_model import LoadedModel, with_note
from vocablens.models.files.pretrained import load_pretrained, tp_failure
from vocablens.models.files.provenance import Provenance, dir_provenance
from vocablens.models.files.quantized import placed_on, quantized_provenance
from vocablens.models.files.source import Source
from vocablens.models.files.spec import reading


def load_whole(source: Source, run: tuple, device: str, trust_remote_code: bool, placement: tuple | None = None,
               tp: bool = False, files: tuple | None = None, instead: tuple[str, str] | None = None) -> LoadedModel:
    """The whole model of ``source`` (:class:`~vocablens.models.files.source.Source`) in ``run``'s dtype
    (``(dtype, note)`` of :func:`~vocablens.models.files.source.run_dtype`) through transformers (a GGUF file through its float32 cache), its readout checked against the
    model's own logits (:func:`~vocablens.models.files.readout_store.checked_readout`); ``placement``: ``(device map, max_memory, offload
    folder)`` of :mod:`vocablens.models.files.placement`, or None (all on ``device``); ``tp``: split over the
    torchrun ranks by the family's tensor-parallel plan (``tp_plan="auto"``, placed by transformers);
    ``files``: the safetensors directory and provenance of :func:`~vocablens.models.files.sources.source_dir`,
    read in place of a GGUF file (its float32 cache: a device map reads it as a directory); ``instead``:
    ``(mode, why)`` when a partial ``mode`` (``borders``, ``streaming``) of a checkpoint stored as
    ``pytorch_model*.bin`` only (``why="pickle"``: the partial reads need safetensors headers), or
    quantized by a transformers quantizer (``why="quantized"``: its tensors are stored quantized, under
    the quantizer's own names, and only the quantizer reads them), loads the whole model instead: a
    :class:`~vocablens.errors.VocabLensNote` says so once it loaded (a hostile pickle fails first, with
    its own line)."""
    from vocablens.models.files import placement as P
    from vocablens.models.files.readout_store import checked_readout

    spec, kind, path, hub = source.spec, source.kind, source.path, source.hub
    tdtype, dtype_note = run
    prov, scratch = None, None
    if files is not None and kind == "gguf":  # a device map reads the float32 cache as a directory
        (path, prov), kind = files, "dir"  # the provenance names the GGUF file, as a whole load's does
    with reading(spec, kind, hub, "load", path):
        if kind == "gguf":
            tok, model, prov = load_gguf(source, tdtype)
        else:
            tok, model, scratch = load_pretrained(source, path if kind == "dir" else None, tdtype, trust_remote_code,
                                                  placement, tp)
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
    with tp_failure(tp, "running the probe forward"):  # tensor parallel: the same check, the probe's logits gathered
        borders, line = checked_readout(found, source)
    if tp:
        from vocablens.models.tensor_parallel import check_split, world_size

        check_split(borders)
        line += f", tensor parallel over {world_size()} ranks"
    lm = with_note(LoadedModel(model, tok, borders, Provenance(**{**prov.__dict__, "readout": line})), dtype_note)
    if instead is not None:
        import warnings

        from vocablens.errors import VocabLensNote

        mode, why = instead
        what = "the blocks that fit" if mode == "streaming" else "the borders"
        line = (f"{spec} is quantized ({lm.provenance.quantization}); reading just {what} needs the quantizer, so the "
                "whole model was loaded (its matrices read dequantized)") if why == "quantized" else (
            f"{spec} holds its weights as pytorch_model.bin only; reading just {what} needs safetensors, so the whole "
            "model was loaded (read with weights_only=True)")
        warnings.warn(VocabLensNote(line), stacklevel=2)
    return lm if placement is None else with_note(lm, P.placement_line(found))


__all__ = ["load_whole"]
