"""Anatomy of the two vocabulary borders: parameters, bytes and FLOPs of the embedding and LM head.

Everything here is counted, never estimated from a rule of thumb, and needs no weights: a model can
be described from its config alone by building it on the meta device (``with torch.device("meta")``),
which allocates no storage and keeps tied heads tied. (accelerate's ``init_empty_weights`` does not:
in transformers 5.x it leaves ``lm_head`` untied, and Qwen3-0.6B would count 751,632,384 parameters
instead of 596,049,920.)

Conventions:

* Shared storage is counted once (a tied head adds 0 parameters).
* *Non-embedding* parameters follow Kaplan et al. 2020 (§2.1, "Scaling Laws for Neural Language
  Models"): total minus the token embedding, minus an untied LM head (weight and bias), minus learned
  position embeddings (GPT-2's ``wpe``, OPT's ``embed_positions``). This is the number Qwen's model
  cards give ("0.6B, 0.44B non-embedding") and the one to compare models by.
* FLOPs per token (one multiply-add = 2 FLOPs), Kaplan et al. 2020, Table 1:
  ``C_forward = 2·N + 2·n_layer·n_ctx·d_attn`` with N the non-embedding parameters, plus the LM head,
  ``2·V·d`` per position (the head's matmul costs the same whether or not it is tied), which Kaplan
  leaves out of N. The attention term is Kaplan's "Attention: Mask" row (QKᵀ and A·V against
  ``n_ctx`` earlier positions); ``d_attn`` = heads × head_dim.
* Bytes: fp32 4, bf16 2, fp8 1, int4 0.5 bytes per parameter (rounded up to whole bytes), weights
  only (no scales, KV cache or activations). A loaded model's ``stored_bytes`` is what its weights
  hold as stored: a quantized weight its values, scales and zero points
  (:func:`vocablens.models.quantized_weights.stored_bytes`); its parameters are the logical count.

Layer 3: pure functions, a :class:`~vocablens.models.Borders` (or a model) in, a frozen dataclass out.
Resolving a config (catalogue, file, directory, GGUF, hub cache) goes through ``vocablens.models``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from vocablens.errors import BadInput, CorruptModelFile, VocabLensError
from vocablens.models.find import config_value as _cfg
from vocablens.models.files.catalogue import catalogue_entry
from vocablens.models.files.config import meta_model, resolve_config
from vocablens.models.files.dtypes import canonical_dtype, dtype_bytes
from vocablens.models.flops import attention_flops, attention_shape, head_flops
from vocablens.models.quantized_weights import is_quantized, logical_numel, weights_stored_bytes

#: Bytes per parameter for the weight formats :class:`Anatomy` reports.
WEIGHT_FORMATS: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "int4": 0.5}

DEFAULT_CONTEXT = 4096


# ---------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class LogitsMemory:
    """Size of one logits tensor [batch, context, V].

    Attributes:
        batch, context: B and T.
        dtype: element dtype name (``float32``, ``bfloat16`` ...).
        bytes_per_position: V × element size, bytes.
        bytes_all_positions: B·T·V·element size, bytes (training, or full-sequence logprobs).
        bytes_last_position: B·V·element size, bytes (prefill computing the head at the last position).
        bytes_saved: the difference, bytes.
        saving: bytes_saved / bytes_all_positions = 1 - 1/T.
    """

    batch: int
    context: int
    dtype: str
    bytes_per_position: int
    bytes_all_positions: int
    bytes_last_position: int
    bytes_saved: int
    saving: float


@dataclass(frozen=True)
class Anatomy:
    """Parameters, bytes and FLOPs of one model's embedding, LM head and the rest.

    Attributes:
        name: what the model was called (hub id, path, ``smollm2``).
        family: ``config.model_type``.
        vocab_size: V, rows of the embedding matrix.
        d_model: width of the residual stream.
        d_emb: width of the embedding / head rows (differs from d_model with OPT's project_in/out).
        n_layers: number of blocks.
        tokenizer_vocab_size: tokens the tokenizer has, when known (rows beyond it are padding).
        tied: the LM head shares the embedding's storage.
        params_total: all parameters, shared storage counted once.
        params_embedding: V × d_emb, the token embedding.
        params_unembedding: parameters the LM head adds: 0 when tied, V × d_emb (+ bias V) when not.
        params_position: learned position embeddings (GPT-2 ``wpe``, OPT), 0 for rotary models.
        params_non_embedding: total − embedding − unembedding − position (Kaplan et al. 2020), the
            language model's; a vision-language model's vision tower and projector are counted apart.
        params_vision: a vision-language model's vision tower (0 for a text model).
        params_projector: the projector from the vision tower into the language model's stream (0 for a
            text model; :func:`vocablens.models.vision.vision_parts`).
        embedding_share: params_embedding / params_total.
        vocab_share: (params_embedding + params_unembedding) / params_total, the two borders together.
        matrix_bytes: bytes of one V × d_emb matrix per weight format (``fp32``, ``bf16``, ``fp8``, ``int4``).
        model_bytes: bytes of all params_total parameters per weight format.
        d_attn: heads × head_dim, the width used by the attention term.
        flops_head: 2·V·d_emb FLOPs, the LM head for one position.
        flops_non_embedding: 2·params_non_embedding FLOPs (Kaplan's 2N).
        flops_attention: 2·n_layers·context·d_attn FLOPs (Kaplan's attention term) at ``context``.
        flops_forward: flops_non_embedding + flops_head + flops_attention, FLOPs per token.
        head_share: flops_head / flops_forward.
        head_share_no_attention: flops_head / (flops_non_embedding + flops_head) (short contexts).
        logits: size of the logits tensor for the batch, context and dtype asked for.
        source: where the numbers came from (``catalogue``, ``config``, ``gguf``, ``loaded model``).
        notes: caveats (mixture-of-experts FLOPs count every expert, tokenizer size unknown ...).
        stored_bytes: bytes the loaded weights hold as stored (parameters and persistent buffers,
            shared storage once; a quantized weight: its quantized values, scales and zero points);
            None when built from a config (no weights read).
        stored_as: the storage those bytes are in: the parameters' dtype (``float32``), or the
            quantization (``torchao Int8WeightOnlyConfig``); empty when built from a config.
    """

    name: str
    family: str
    vocab_size: int
    d_model: int
    d_emb: int
    n_layers: int
    tokenizer_vocab_size: int | None
    tied: bool
    params_total: int
    params_embedding: int
    params_unembedding: int
    params_position: int
    params_non_embedding: int
    embedding_share: float
    vocab_share: float
    matrix_bytes: dict[str, int]
    model_bytes: dict[str, int]
    d_attn: int
    flops_head: int
    flops_non_embedding: int
    flops_attention: int
    flops_forward: int
    head_share: float
    head_share_no_attention: float
    logits: LogitsMemory
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    params_vision: int = 0
    params_projector: int = 0
    stored_bytes: int | None = None
    stored_as: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (the field names are the CLI's ``--json`` keys)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


# ---------------------------------------------------------------------------------------- counting
def _storage_key(p: torch.Tensor) -> tuple:
    """Identity of a tensor's memory: storage pointer, offset, shape, stride (meta, or a quantized
    weight, which has no storage of its own: the object)."""
    if p.is_meta or is_quantized(p):
        return ("object", id(p))
    return (p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape), tuple(p.stride()))


def count_parameters(model: nn.Module) -> int:
    """Parameters of a model with shared storage counted once.

    Two parameters are the same when they are one object, or (for real tensors) view the same memory
    with the same offset, shape and stride — so a head tied by assigning ``.data`` counts once too.
    Works on meta-device models (no storage; identity only). A quantized weight counts the
    parameters it stands for (:func:`~vocablens.models.quantized_weights.logical_numel`), not its packing.

    Args:
        model: any ``nn.Module``.

    Returns:
        int, number of scalar parameters.
    """
    seen: set = set()
    n = 0
    for p in model.parameters():
        key = _storage_key(p)
        if key in seen:
            continue
        seen.add(key)
        n += logical_numel(p)
    return n


def _position_embeddings(model: nn.Module, token_embedding: nn.Module, head: nn.Module,
                         other: list[torch.Tensor] = ()) -> list[torch.Tensor]:
    """Weights of every ``nn.Embedding`` other than the token embedding, the head and ``other`` (a vision
    tower's own): learned positions."""
    skip = {_storage_key(token_embedding.weight), _storage_key(head.weight), *(_storage_key(p) for p in other)}
    out, seen = [], set()
    for m in model.modules():
        if m is token_embedding or m is head or not isinstance(m, nn.Embedding):
            continue
        k = _storage_key(m.weight)
        if k in skip or k in seen:
            continue
        seen.add(k)
        out.append(m.weight)
    return out


def _count(params: list[torch.Tensor]) -> int:
    """Scalars in ``params``, shared storage counted once."""
    return sum(p.numel() for p in {_storage_key(p): p for p in params}.values())


def _bytes(n: int, per: float) -> int:
    return int(math.ceil(n * per))


def logits_memory(vocab_size: int, batch: int = 1, context: int = DEFAULT_CONTEXT,
                  dtype: str = "float32") -> LogitsMemory:
    """Bytes of a logits tensor [batch, context, V] vs the last position only [batch, V].

    Prefill needs the next-token distribution at the last position only, so inference engines run the
    head there alone; training (and full-sequence logprobs) materialise every position.

    Args:
        vocab_size: V.
        batch: B >= 1.
        context: T >= 1.
        dtype: ``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``, ``float64``.

    Raises:
        BadInput: batch or context below 1, or an unknown dtype.
    """
    if batch < 1 or context < 1:
        raise BadInput(f"`batch` and `context` must be at least 1; got batch={batch}, context={context}")
    canon = canonical_dtype(dtype, "logits dtype")
    el = dtype_bytes(canon)
    per = vocab_size * el
    all_ = batch * context * per
    last = batch * per
    return LogitsMemory(batch=batch, context=context, dtype=canon, bytes_per_position=per,
                        bytes_all_positions=all_, bytes_last_position=last, bytes_saved=all_ - last,
                        saving=(all_ - last) / all_)


def lookup_bytes(n_tokens: int, d: int, fmt: str = "bf16") -> int:
    """Bytes an embedding lookup of ``n_tokens`` reads: n rows of d numbers (a gather, no matmul).

    The LM head, by contrast, reads the whole V × d matrix for every position batch
    (:attr:`Anatomy.matrix_bytes`). Example: 64 tokens of a bf16 d=1024 matrix read 131,072 bytes.

    Args:
        n_tokens: rows read (repeated ids read again), >= 0.
        d: row width.
        fmt: ``fp32``, ``bf16``, ``fp8`` or ``int4``.

    Raises:
        BadInput: negative n_tokens or an unknown format.
    """
    if n_tokens < 0 or fmt not in WEIGHT_FORMATS:
        raise BadInput(f"n_tokens must be >= 0 and fmt one of {', '.join(WEIGHT_FORMATS)}")
    return _bytes(n_tokens * d, WEIGHT_FORMATS[fmt])


def anatomy(borders, name: str | None = None, batch: int = 1, context: int = DEFAULT_CONTEXT,
            logits_dtype: str = "float32", tokenizer_vocab_size: int | None = None,
            source: str = "loaded model", notes: tuple[str, ...] = ()) -> Anatomy:
    """Count the parameters, bytes and FLOPs of a model's two borders and of the rest.

    Works on a loaded model and on a meta-device model alike (nothing is read from the weights but
    their shapes and which of them share storage).

    Args:
        borders: :class:`vocablens.models.Borders` of the model.
        name: label for tables (default: ``config.name_or_path`` or the family).
        batch: B of the logits tensor.
        context: T of the logits tensor, also the attention context for FLOPs.
        logits_dtype: dtype of the logits tensor (``float32``, ``bfloat16`` ...).
        tokenizer_vocab_size: overrides ``borders.tokenizer_vocab_size`` when given.
        source: where the model came from, for the reader.
        notes: notes about the files, put first (e.g. a GGUF file's metadata that disagrees with its
            tensors: :attr:`vocablens.models.Provenance.notes`).

    Returns:
        :class:`Anatomy`.

    Raises:
        BadInput: batch/context below 1 or an unknown dtype.
    """
    model, cfg = borders.model, borders.config
    W_E, W_U = borders.input_embedding.weight, borders.unembedding.weight
    V, d_emb = int(W_E.shape[0]), int(W_E.shape[1])
    total = count_parameters(model)
    emb = W_E.numel()
    tied = bool(borders.tied)
    unemb = 0 if tied else W_U.numel()
    b_U = borders.unembedding.bias
    if b_U is not None:
        unemb += b_U.numel()
    from vocablens.models.vision import vision_parts

    tower, projector = vision_parts(model)
    vision, proj = _count(tower), _count(projector)
    pos = sum(w.numel() for w in _position_embeddings(model, borders.input_embedding.module, borders.lm_head,
                                                      tower + projector))
    non_emb = total - emb - unemb - pos - vision - proj
    n_layers = borders.n_layers
    d_model = borders.d_model
    d_attn = attention_shape(cfg, d_model).d_attn
    flops_head = head_flops(V, d_emb)
    flops_ne = 2 * non_emb
    flops_attn = attention_flops(n_layers, context, d_attn)
    fwd = flops_ne + flops_head + flops_attn
    notes: list[str] = list(notes)
    n_experts = _cfg(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    if n_experts and int(n_experts) > 1:
        notes.append(f"mixture of experts ({n_experts} experts): non-embedding FLOPs count every expert, "
                     "not only the active ones")
    tvs = tokenizer_vocab_size if tokenizer_vocab_size is not None else borders.tokenizer_vocab_size
    if tvs is not None and tvs < V:
        notes.append(f"{V - tvs:,} rows beyond the tokenizer's {tvs:,} tokens are padding")
    if pos:
        notes.append(f"learned position embeddings ({pos:,} parameters) excluded from non-embedding")
    if vision or proj:
        notes.append(f"vision tower ({vision:,} parameters) and projector ({proj:,}) counted in the total, not in "
                     "non-embedding: they run once per image, not per text token")
    if name is None:
        name = str(_cfg(cfg, "name_or_path", "_name_or_path", default="") or borders.family)
    return Anatomy(
        name=name, family=borders.family, vocab_size=V, d_model=int(d_model), d_emb=d_emb,
        n_layers=n_layers, tokenizer_vocab_size=tvs, tied=tied, params_total=total,
        params_embedding=emb, params_unembedding=unemb, params_position=pos,
        params_non_embedding=non_emb, embedding_share=emb / total, vocab_share=(emb + unemb) / total,
        matrix_bytes={k: _bytes(V * d_emb, b) for k, b in WEIGHT_FORMATS.items()},
        model_bytes={k: _bytes(total, b) for k, b in WEIGHT_FORMATS.items()},
        d_attn=d_attn, flops_head=flops_head, flops_non_embedding=flops_ne, flops_attention=flops_attn,
        flops_forward=fwd, head_share=flops_head / fwd,
        head_share_no_attention=flops_head / (flops_ne + flops_head),
        logits=logits_memory(V, batch, context, logits_dtype), source=source, notes=tuple(notes),
        params_vision=vision, params_projector=proj, **_stored(model),
    )


def _stored(model: nn.Module) -> dict[str, Any]:
    """``stored_bytes`` and ``stored_as`` of :class:`Anatomy`: counted on a loaded model's weights
    (:func:`~vocablens.models.quantized_weights.weights_stored_bytes`), None and empty for a model built on the meta device from its config."""
    from vocablens.models.files.quantized import quantization_config, quantization_name

    params = list(model.parameters())
    if not params or any(p.is_meta for p in params):
        return {"stored_bytes": None, "stored_as": ""}
    qc = quantization_config(model)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params if not is_quantized(p)})
    return {"stored_bytes": weights_stored_bytes(model), "stored_as": quantization_name(qc) if qc else "/".join(dtypes)}


def anatomy_of(spec: str | os.PathLike, batch: int = 1, context: int = DEFAULT_CONTEXT,
               logits_dtype: str = "float32", trust_remote_code: bool = False) -> Anatomy:
    """:func:`anatomy` of a model named by a spec, from its config alone (no weights allocated).

    Args:
        spec: a catalogue hub id or alias (``Qwen/Qwen3-0.6B``, ``qwen3-0.6b``), ``smollm2``, a
            ``config.json`` path, a model directory, a ``.gguf`` file, or a hub id in the local cache.
        batch: as for :func:`anatomy`.
        context: as for :func:`anatomy`.
        logits_dtype: as for :func:`anatomy`.
        trust_remote_code: let transformers import the model's own code (``auto_map``); off, such a
            model is :class:`BadInput`.

    Raises:
        ModelNotFound: no such model.
        CorruptModelFile: a damaged config or file.
        UnsupportedArchitecture: a model vocablens cannot read.
        BadInput: a bad option.
    """
    from vocablens.models.borders import Borders

    cfg, tvs, source, file_notes = resolve_config(spec, trust_remote_code=trust_remote_code)
    try:
        model = meta_model(cfg, trust_remote_code=trust_remote_code)
        borders = Borders.from_model(model)
    except VocabLensError:
        raise
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CorruptModelFile(f"cannot build {spec} from its config: {exc}".splitlines()[0]) from None
    if tvs is not None:
        borders = replace(borders, tokenizer_vocab_size=tvs)
    entry = catalogue_entry(str(spec))
    name = entry.hub_id if entry is not None else str(spec)
    return anatomy(borders, name=name, batch=batch, context=context, logits_dtype=logits_dtype, source=source,
                   notes=file_notes)


__all__ = [
    "Anatomy", "LogitsMemory", "WEIGHT_FORMATS", "DEFAULT_CONTEXT",
    "anatomy", "anatomy_of", "count_parameters", "logits_memory", "lookup_bytes",
]
