"""The two vocabulary matrices alone, read without transformers' modeling code.

:func:`load_matrices_only` serves analyses that read nothing but the embedding ``W_E`` [V, d] and
the LM head ``W_U`` [V, d] (cosine neighbours). It reads the tensor names from the checkpoint
(``safe_open`` headers), the sizes from ``config.json`` and the tokenizer with its own class (no
``Auto*`` lookup), so neither transformers' model classes nor its config classes are imported: that
import alone is ~140 MB of resident memory, more than the matrix of a 135M model (see
``benchmarks/memory.py``). The matrices stay memory-mapped in the checkpoint's dtype.

:func:`load_head_only` adds the final norm for the families whose final norm is transformers'
``LlamaRMSNorm`` (``argmax`` reads the head and the norm) and maps the matrices read-only, so
``argmax`` can hand their pages back after each pass (:mod:`vocablens.models.pages`).

What is not read raises instead of guessing: the final norm and the blocks are placeholders whose
use raises :class:`~vocablens.errors.BadInput`, and the input scale is NaN (Gemma's sqrt(d) is a
family default this view does not know). Any checkpoint the view cannot read exactly (sub-configs,
remote code, a head bias, OPT's projections, unknown tensor names) is loaded by
:func:`vocablens.models.lazy.load_borders_only` instead, so callers always get the same matrices.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.checkpoint_files import matrix_keys, read_tensors, shard_files
from vocablens.models.sources import light_tokenizer, source_dir

_REFUSE = ("project_in", "project_out", "lm_head.bias", "embed_out.bias")


class _NotRead(nn.Module):
    """A part of the checkpoint this view did not read: using it raises."""

    def __init__(self, what: str, shape: tuple[int, ...] = (0,)):
        super().__init__()
        self.what = what
        self.weight = nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)

    def forward(self, *args, **kwargs):
        raise BadInput(f"{self.what} was not read (this model was loaded with its two matrices only): "
                       "load the borders or the whole model for this analysis")


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, computed in float32 and cast back before the gain:
    transformers' ``LlamaRMSNorm`` line for line (also Mistral's, Mixtral's, Qwen2/3's, Phi-3's),
    so the probes of :mod:`vocablens.argmax.norm` see the same numbers. Shape [..., d] -> [..., d]."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class _Decoder(nn.Module):
    def __init__(self, emb: nn.Module, n_layers: int, d: int, norm: nn.Module | None = None):
        super().__init__()
        self.embed_tokens = emb
        self.layers = nn.ModuleList(_NotRead(f"block {i}") for i in range(n_layers))
        self.norm = norm if norm is not None else _NotRead("the final norm", (d,))


class MatricesOnly(nn.Module):
    """Module tree of the view: ``model.embed_tokens``, ``model.layers`` (placeholders),
    ``model.norm`` (placeholder) and ``lm_head``, which :meth:`Borders.from_model` reads."""

    def __init__(self, config, emb: nn.Embedding, head: nn.Linear, n_layers: int, norm: nn.Module | None = None):
        super().__init__()
        self.config = config
        self.model = _Decoder(emb, n_layers, int(emb.weight.shape[1]), norm)
        self.lm_head = head

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.model


class _Config(SimpleNamespace):
    """``config.json`` as attributes (no transformers config class: its import is the cost avoided)."""

    def get_text_config(self, *args, **kwargs):
        return self

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _plan(d: Path, files: dict[str, Path]):
    """``(config, emb_key, head_key or None, config_tied)`` when this view can read ``d`` exactly, else
    None. ``head_key`` is the stored head whenever there is one, also under a tying config: whether
    it is the embedding is decided by its values (:mod:`vocablens.models.tie`)."""
    p = d / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or "auto_map" in cfg or "model_type" not in cfg or \
            any(k.endswith("_config") and isinstance(v, dict) for k, v in cfg.items()) or \
            not isinstance(cfg.get("tie_word_embeddings"), bool) or \
            any(r in k for k in files for r in _REFUSE):
        return None
    embs, heads = matrix_keys(files)
    tied = cfg["tie_word_embeddings"]
    if len(embs) != 1 or len(heads) > 1 or (not tied and not heads):
        return None
    return _Config(**cfg), embs[0], (heads[0] if heads else None), tied


def load_matrices_only(spec: str | os.PathLike = "smollm2", dtype=None, trust_remote_code: bool = False):
    """The model's embedding and LM head only, read without transformers' modeling code.

    Args:
        spec: as :func:`vocablens.models.load`.
        dtype: torch dtype or name, ``"auto"`` for the checkpoint's own; default: the checkpoint's
            own (bf16 stays bf16), except float16, which loads as float32 (a provenance note).
        trust_remote_code: passed to the tokenizer (and the fallback).

    Returns:
        :class:`~vocablens.models.LoadedModel` whose ``borders`` has ``W_E`` and ``W_U`` [V, d]
        (memory-mapped; one matrix when tied), no head bias, ``embed_scale`` NaN, and a final norm
        and blocks that raise :class:`~vocablens.errors.BadInput` when used. Peak memory: the
        matrices plus the tokenizer. A checkpoint this view cannot read exactly is loaded by
        :func:`vocablens.models.lazy.load_borders_only` (same matrices, more memory).

    Raises:
        As :func:`vocablens.models.lazy.load_borders_only`.
    """
    return _load(str(spec), dtype, trust_remote_code, head=False)


def load_head_only(spec: str | os.PathLike = "smollm2", dtype=None, trust_remote_code: bool = False):
    """The LM head and the final norm (what ``argmax`` reads), without transformers' modeling code.

    As :func:`load_matrices_only`, plus the final norm, for the families whose final norm is
    transformers' ``LlamaRMSNorm`` (:data:`RMS_FAMILIES`; rebuilt as :class:`RMSNorm` from the
    checkpoint's gain and ``rms_norm_eps``); in the checkpoint's dtype the matrices are mapped
    read-only from the safetensors file, so a pass over them can hand their pages back to the
    page cache (:mod:`vocablens.models.pages`). Writing into them raises SIGSEGV: this view is for
    read-only analyses. Any other checkpoint (a head bias, another family, a config without
    ``rms_norm_eps``) is loaded by :func:`vocablens.models.lazy.load_borders_only`: the same
    tensors and norm outputs, more memory.

    Returns:
        :class:`~vocablens.models.LoadedModel` whose ``borders`` has ``W_U`` [V, d], no bias, the
        final norm, and blocks that raise :class:`~vocablens.errors.BadInput` when used.

    Raises:
        As :func:`vocablens.models.lazy.load_borders_only`.
    """
    return _load(str(spec), dtype, trust_remote_code, head=True)


#: model types whose final norm ``model.norm`` is transformers' ``LlamaRMSNorm`` (same forward)
RMS_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3")
_NORM_KEYS = ("model.norm.weight", "norm.weight")
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def mapped_read_only(f: Path, key: str) -> torch.Tensor | None:
    """Tensor ``key`` of the safetensors file ``f``, mapped read-only (``PROT_READ``, shared): its
    pages are the page cache's, never copied. None when the header cannot be read or the dtype
    is not a float one (the caller then reads it through ``safe_open``)."""
    import warnings

    import numpy as np

    try:
        with open(f, "rb") as h:
            n = int.from_bytes(h.read(8), "little")
            info = json.loads(h.read(n))[key]
        dt = _ST_DTYPES[info["dtype"]]
        s, e = (int(x) for x in info["data_offsets"])
        shape = [int(x) for x in info["shape"]]
        if e - s != math.prod(shape) * dt.itemsize or e <= s or (8 + n + s) % dt.itemsize:
            return None
        arr = np.memmap(f, dtype=np.uint8, mode="r", offset=8 + n + s, shape=(e - s,))
        with warnings.catch_warnings():       # "not writable": by design (see load_head_only)
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(arr).view(dt).reshape(shape)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None


def _load(spec: str, dtype, trust_remote_code: bool, head: bool):
    from vocablens.models.borders import Borders
    from vocablens.models.lazy import load_borders_only
    from vocablens.models.loaded import LoadedModel
    from vocablens.models.provenance import Provenance
    from vocablens.models.spec import diagnose_dir, file_errors, missing_parts
    from vocablens.models.tie import checkpoint_tied

    fallback = lambda: load_borders_only(spec, dtype=dtype, trust_remote_code=trust_remote_code)  # noqa: E731
    d, prov = source_dir(spec)
    files = shard_files(d)
    plan = _plan(d, files)
    norm_key = None
    if plan is not None and head:
        cfg = plan[0]
        norms = [k for k in _NORM_KEYS if k in files]
        if getattr(cfg, "model_type", None) not in RMS_FAMILIES or len(norms) != 1 or \
                not isinstance(getattr(cfg, "rms_norm_eps", None), (int, float)):
            plan = None
        else:
            norm_key = norms[0]
    if plan is None:
        return fallback()
    config, emb_key, head_key, config_tied = plan
    from vocablens.models.run_dtype import run_dtype, with_note

    tdtype, dtype_note = run_dtype(spec, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    keys = [emb_key] + ([head_key] if head_key else [])
    ts = read_tensors(keys + ([norm_key] if norm_key else []), files, tdtype)
    tied = checkpoint_tied(config_tied, ts.get(head_key) if head_key else None, ts[emb_key])
    if tied and head_key:                     # a stored copy of the embedding: one matrix, as transformers
        keys, head_key = [emb_key], None
    if head and tdtype is None:               # read-only mappings of the same bytes
        for k in keys:
            t = mapped_read_only(files[k], k)
            if t is not None and t.dtype == ts[k].dtype and t.shape == ts[k].shape:
                ts[k] = t
    W_E = ts[emb_key]
    if W_E.dim() != 2 or (head_key and tuple(ts[head_key].shape) != tuple(W_E.shape)):
        return fallback()
    V, dm = W_E.shape
    if any(isinstance(getattr(config, k, None), int) and getattr(config, k) != dm
           for k in ("hidden_size", "n_embd", "d_model")) and not hasattr(config, "embedding_size"):
        # the config disagrees with the weights: the borders-only load names the tensor and both shapes
        return fallback()
    norm = None
    if norm_key is not None:
        if tuple(ts[norm_key].shape) != (dm,):
            return fallback()
        norm = RMSNorm(ts[norm_key], float(config.rms_norm_eps))
    # modules around the tensors as they are (a meta-device init would import torch's meta kernels: ~70 MB)
    emb = nn.Embedding.from_pretrained(W_E, freeze=True)
    emb.register_buffer("embed_scale", torch.empty((), device="meta"), persistent=False)  # unknown here
    lm_head = nn.Linear(1, 1, bias=False)
    lm_head.in_features, lm_head.out_features = dm, V
    lm_head.weight = emb.weight if tied else nn.Parameter(ts[head_key], requires_grad=False)
    n_layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0)
                   or getattr(config, "num_layers", 0) or 0)
    if n_layers < 1:
        return fallback()
    model = MatricesOnly(config, emb, lm_head, n_layers, norm).eval()
    try:
        tok = light_tokenizer(d, trust_remote_code)
    except file_errors() as e:
        raise CorruptModelFile(diagnose_dir(d, shapes=False) or missing_parts(d) or f"cannot read the tokenizer in {d}: "
                               f"{str(e).splitlines()[0]}") from None
    prov = Provenance(**{**prov.__dict__, "dtype": str(W_E.dtype).replace("torch.", "")})
    return with_note(LoadedModel(model, tok, Borders.from_model(model, tokenizer=tok), prov), dtype_note)


__all__ = ["RMS_FAMILIES", "MatricesOnly", "RMSNorm", "load_head_only", "load_matrices_only", "mapped_read_only"]
