"""A model directory or hub id read through transformers' ``from_pretrained`` (:func:`load_pretrained`),
as :func:`vocablens.models.files.gguf_cache.load_gguf` reads a GGUF file: the tokenizer, then the
model of the causal-LM class, else the image-text-to-text one
(:mod:`vocablens.models.files.auto_class`), with the device map's arguments
(:mod:`vocablens.models.files.placement`), the tensor-parallel plan (:mod:`vocablens.models.tensor_parallel`)
or the checkpoint's own quantizer (:mod:`vocablens.models.files.quantized`). The whole load around it
(placement on the device, provenance, borders, readout check) is :func:`vocablens.models.files.whole.load_whole`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vocablens.errors import BadInput


def load_pretrained(source, path: Path | None, tdtype, trust_remote_code: bool, placement: tuple | None = None,
                    tp: bool = False) -> tuple[Any, Any, str | None]:
    """``(tokenizer, model, scratch folder or None)`` of ``source`` (a
    :class:`~vocablens.models.files.source.Source`) read from the directory ``path`` (its own, or a GGUF
    file's float32 cache under a device map), or from its hub id when ``path`` is None, in ``tdtype``
    (None: the checkpoint's own, ``dtype="auto"``); ``placement``: ``(device map, max_memory, offload
    folder)`` of :mod:`vocablens.models.files.placement` (the scratch folder it made for the offloaded
    weights, if any, is returned), or None; ``tp``: the family's tensor-parallel plan
    (``tp_plan="auto"``). A checkpoint quantized by a transformers quantizer (its config's
    ``quantization_config``) loads through it too, placed by the quantizer. The caller turns what the
    readers raise into one line (:func:`vocablens.models.files.spec.reading`).

    Raises:
        CorruptModelFile: a tokenizer that cannot be built
            (:func:`vocablens.models.files.tokenizer_files.building_tokenizer`).
        UnsupportedQuantization: a quantized checkpoint transformers cannot load here (its quantizer's
            package or device missing), in one line.
        BadInput: ``tp`` for a family without a tensor-parallel plan (one line; never loaded replicated
            instead).
        UnsupportedArchitecture: under ``tp``, transformers' tensor-parallel code failed (:func:`tp_failure`).
    """
    from transformers import AutoConfig, AutoTokenizer

    from vocablens.models.files import placement as P
    from vocablens.models.files.auto_class import auto_model_class
    from vocablens.models.files.quantized import quantization_config, refused
    from vocablens.models.files.source import hub_kwargs
    from vocablens.models.files.tokenizer_files import building_tokenizer, hub_tokenizer_problem, json_tokenizer_problem
    from vocablens.models.tensor_parallel import plan_refusal

    spec, hub = source.spec, source.hub
    src = str(path) if path is not None else hub
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if path is None:
        kw.update(hub_kwargs(hub))
    with building_tokenizer(spec, lambda: json_tokenizer_problem(Path(src)) if path is not None
                            else hub_tokenizer_problem(src)):
        tok = AutoTokenizer.from_pretrained(src, **kw)
    placed = {} if placement is None else P.placed_kwargs(src, kw, tdtype, *placement)
    scratch = placed.pop("scratch", None)
    config = AutoConfig.from_pretrained(src, **kw)  # the causal-LM mapping, else image-text-to-text
    if tp:
        why = plan_refusal(config)
        if why:
            raise BadInput(why)
        placed["tp_plan"] = "auto"
    with tp_failure(tp, "loading"):
        try:
            model = auto_model_class(config).from_pretrained(src, config=config, dtype=tdtype or "auto",
                                                             use_safetensors=None, **kw, **placed)
        except (ImportError, ValueError, RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
            qc = quantization_config(config)
            if qc is None:
                raise
            raise refused(spec, qc, exc) from None
    return tok, model, scratch


@contextmanager
def tp_failure(tp: bool, step: str):
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
                                      f"`tp`: {step} with the family's tensor-parallel plan failed: {first}") from None


__all__ = ["load_pretrained", "tp_failure"]
