"""Loads that read only some of a checkpoint's tensors: the borders, the head, the two matrices.

Analyses over the vocabulary matrices alone (neighbours, the tie check, argmax geometry, the softmax
bottleneck) need a few hundred MB of a multi-GB checkpoint. Every load here reads its tensors from
the checkpoint's safetensors files through ``safe_open`` (:mod:`vocablens.models.checkpoint_files`:
memory-mapped copy-on-write, so a write into a tensor changes this process's copy, never the file;
one tensor at a time; sharded checkpoints through their index), in the checkpoint's own dtype
unless one is asked for.

- :func:`load_borders_only` builds the model skeleton on the ``meta`` device (no storage,
  ``accelerate.init_empty_weights``) and reads the embedding, the LM head (and bias), the final norm
  and any blocks asked for; the other blocks stay on ``meta``: a forward pass is refused
  (:class:`~vocablens.errors.BadInput`).
- :func:`load_matrices_only` and :func:`load_head_only` build no model: they read the tensor names
  from the checkpoint's headers, the sizes from ``config.json`` and the tokenizer with its own class
  (no ``Auto*`` lookup), so neither transformers' model classes nor its config classes are imported:
  that import alone costs more resident memory than the matrix of a 135M model (see
  ``benchmarks/memory.py``). :func:`load_head_only` adds the final norm (``argmax`` reads the head and
  the norm): the checkpoint's tensors, computed by the family's own transformers module, built on
  first use (:mod:`vocablens.models.final_norm`). What is not read raises instead of guessing: the
  blocks are placeholders whose use raises :class:`~vocablens.errors.BadInput`, and the input scale
  is NaN (Gemma's sqrt(d) is a family default this view does not know). Any checkpoint this view
  cannot read exactly (sub-configs, remote code, a head bias, OPT's projections, unknown tensor
  names) is loaded by :func:`load_borders_only` instead, so callers always get the same matrices.

A ``.gguf`` file is read from vocablens's safetensors cache of it when present (see
:func:`vocablens.models.load`); otherwise it is loaded whole once, which writes that cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.checkpoint_files import checkpoint_name, matrix_keys, materialize, read_tensors, shard_files
from vocablens.models.final_norm import FamilyNorm, family_identity, final_norm_keys, skeleton_final_norm
from vocablens.models.sources import light_tokenizer, source_dir


def load_borders_only(spec: str | os.PathLike = "smollm2", dtype=None, trust_remote_code: bool = False,
                      blocks=None, value_vectors: bool = False):
    """The model with only its embedding, LM head (+ bias) and final norm in memory.

    Args:
        spec: as :func:`vocablens.models.load` (``smollm2``, a directory, a ``.gguf`` file, a hub id).
        dtype: torch dtype or name, ``"auto"`` for the checkpoint's own; default: the checkpoint's
            own (float32 for a dequantized GGUF), except float16, which loads as float32 (a note
            in the provenance; :mod:`vocablens.models.run_dtype`).
        blocks: block indices (0..L-1) whose weights are read too (``project --block N``: one block
            plus the head and final norm); the other blocks stay on ``meta``.
        value_vectors: also read every block's MLP output projection (the FFN value vectors that
            ``project --token`` / ``--interpretable`` rank), nothing else of the blocks.

    Returns:
        :class:`~vocablens.models.LoadedModel` whose ``borders`` has real ``W_E``, ``W_U``, ``b_U``
        and final norm, and blocks on the ``meta`` device. The tensors stay memory-mapped: a page
        becomes resident when an analysis reads it. Peak memory: about the bytes of those tensors
        (one [V, d] matrix when tied) plus the tokenizer; less for a command that lets read pages go
        (:mod:`vocablens.models.pages`) and the tokenizer too
        (:meth:`~vocablens.models.LoadedModel.without_tokenizer`), as ``project`` does.

    Raises:
        ModelNotFound, CorruptModelFile: as :func:`vocablens.models.load`; CorruptModelFile also when
            the config and the weights disagree. BadInput: a checkpoint without safetensors, or a
            block index out of range.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from vocablens.models.borders import Borders
    from vocablens.models.run_dtype import run_dtype, with_note
    from vocablens.models.loaded_model import LoadedModel
    from vocablens.models.provenance import Provenance
    from vocablens.models.spec import diagnose_dir, file_errors, missing_parts
    from vocablens.models.tie import stored_tie

    spec_s = str(spec)
    d, prov = source_dir(spec_s)
    tdtype, dtype_note = run_dtype(spec_s, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    try:
        config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
        tok = light_tokenizer(d, trust_remote_code, spec_s)   # AutoTokenizer parses tokenizer.json twice (both copies kept)
    except file_errors() as e:
        raise CorruptModelFile(diagnose_dir(d) or missing_parts(d) or f"cannot read the config or tokenizer in {d}: "
                               f"{str(e).splitlines()[0]}") from None
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    files = shard_files(d)
    skel = Borders.from_model(model)
    E = skel.input_embedding  # the input side: the token embedding, its norm (BLOOM), project_in
    wanted = [E.module, E.input_norm, E.project_in, skel.lm_head, skel.final_norm, skel.project_out]
    for i in blocks or ():
        if not 0 <= int(i) < skel.n_layers:
            raise BadInput(f"block {i} is out of range: this model has blocks 0..{skel.n_layers - 1}")
        wanted.append(skel.blocks[int(i)])
    if value_vectors:
        from vocablens.models.blocks import block_views

        wanted += [v.mlp_out for v in block_views(skel)]
    ids = {id(p) for m in wanted if m is not None for p in m.parameters()}
    # named_parameters lists a tied matrix once (under the embedding's name): read it once, then let
    # the head share the new tensor again
    # "tied" by what the checkpoint stores, as transformers decides it (vocablens.models.tie): the
    # skeleton may share one meta matrix whatever the checkpoint holds
    mod_names = {id(m): n for n, m in model.named_modules()}
    head_name = f"{mod_names[id(skel.lm_head)]}.weight".lstrip(".")
    emb_name = f"{mod_names[id(skel.embedding)]}.weight".lstrip(".")
    tie_cfg = bool(getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                           "tie_word_embeddings", False))
    prefix = getattr(model, "base_model_prefix", "") or ""
    tied = stored_tie(files, tie_cfg, checkpoint_name(emb_name, files, prefix),
                      checkpoint_name(head_name, files, prefix), tdtype)
    if not tied and skel.lm_head.weight is skel.embedding.weight:
        skel.lm_head.weight = torch.nn.Parameter(torch.empty(skel.lm_head.weight.shape, device="meta"),
                                                 requires_grad=False)
        ids.add(id(skel.lm_head.weight))
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids]
    names = list(dict.fromkeys(n for n in names if not (tied and n == head_name)))
    materialize(model, names, files, tdtype)
    if tied:
        skel.lm_head.weight = model.get_input_embeddings().weight
    for mod in (skel.final_norm,):  # non-persistent buffers (e.g. rotary) stay on meta; norms have none
        if mod is not None:
            for n, b in list(mod.named_buffers()):
                if b.is_meta:
                    raise CorruptModelFile(f"the final norm's buffer {n} is not in the checkpoint")
    model.eval()
    pdtype = model.get_input_embeddings().weight.dtype
    prov = Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})
    return with_note(LoadedModel(model, tok, Borders.from_model(model, tokenizer=tok), prov), dtype_note)


# ------------------------------------------------------------ without the modeling code
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


class _Decoder(nn.Module):
    def __init__(self, emb: nn.Module, n_layers: int, d: int, norm: nn.Module | None = None):
        super().__init__()
        self.embed_tokens = emb
        self.layers = nn.ModuleList(_NotRead(f"block {i}") for i in range(n_layers))
        self.norm = norm if norm is not None else _NotRead("the final norm", (d,))


class MatricesOnly(nn.Module):
    """Module tree of the view: ``model.embed_tokens``, ``model.layers`` (placeholders),
    ``model.norm`` (the final norm, or a placeholder), ``lm_head`` and the config's ``logit_scale``
    when it has one (as the model holds it), which :meth:`Borders.from_model` reads."""

    def __init__(self, config, emb: nn.Embedding, head: nn.Linear, n_layers: int, norm: nn.Module | None = None):
        super().__init__()
        self.config = config
        self.model = _Decoder(emb, n_layers, int(emb.weight.shape[1]), norm)
        self.lm_head = head
        ls = getattr(config, "logit_scale", None)  # a number the model multiplies its logits by (Cohere)
        if isinstance(ls, (int, float)) and not isinstance(ls, bool):
            self.logit_scale = float(ls)

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
        :func:`load_borders_only` (same matrices, more memory).

    Raises:
        As :func:`load_borders_only`.
    """
    return _load(str(spec), dtype, trust_remote_code, head=False)


def load_head_only(spec: str | os.PathLike = "smollm2", dtype=None, trust_remote_code: bool = False):
    """The LM head and the final norm (what ``argmax`` reads), without transformers' modeling code.

    As :func:`load_matrices_only`, plus the final norm: the checkpoint's tensors in a
    :class:`~vocablens.models.final_norm.FamilyNorm`, which computes with the family's own
    transformers module (built from a meta-device skeleton at its first call, so the modeling
    code is imported only by a caller that uses the norm). In the checkpoint's dtype the matrices
    stay the file's copy-on-write mapping: a pass over them can hand their pages back to the page
    cache (:mod:`vocablens.models.pages`), and writing into them changes this process's copy, never
    the file. A checkpoint whose final norm cannot be named from its tensors, or that this view
    cannot read exactly (a head bias, OPT's projections ...), is loaded by
    :func:`load_borders_only`: the same tensors and norm outputs, more memory.

    Returns:
        :class:`~vocablens.models.LoadedModel` whose ``borders`` has ``W_U`` [V, d], no bias, the
        final norm, and blocks that raise :class:`~vocablens.errors.BadInput` when used.

    Raises:
        As :func:`load_borders_only`.
    """
    return _load(str(spec), dtype, trust_remote_code, head=True)


def _load(spec: str, dtype, trust_remote_code: bool, head: bool):
    from vocablens.models.borders import Borders
    from vocablens.models.loaded_model import LoadedModel
    from vocablens.models.provenance import Provenance
    from vocablens.models.spec import diagnose_dir, file_errors, missing_parts
    from vocablens.models.tie import checkpoint_tied

    fallback = lambda: load_borders_only(spec, dtype=dtype, trust_remote_code=trust_remote_code)  # noqa: E731
    d, prov = source_dir(spec)
    files = shard_files(d)
    plan = _plan(d, files)
    norm_keys = final_norm_keys(files) if head else {}
    if plan is None or norm_keys is None:
        return fallback()
    config, emb_key, head_key, config_tied = plan
    from vocablens.models.run_dtype import run_dtype, with_note

    tdtype, dtype_note = run_dtype(spec, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    keys = [emb_key] + ([head_key] if head_key else [])
    ts = read_tensors(keys + list(norm_keys.values()), files, tdtype)
    tied = checkpoint_tied(config_tied, ts.get(head_key) if head_key else None, ts[emb_key])
    if tied and head_key:                     # a stored copy of the embedding: one matrix, as transformers
        keys, head_key = [emb_key], None
    W_E = ts[emb_key]
    if W_E.dim() != 2 or (head_key and tuple(ts[head_key].shape) != tuple(W_E.shape)):
        return fallback()
    V, dm = W_E.shape
    if any(isinstance(getattr(config, k, None), int) and getattr(config, k) != dm
           for k in ("hidden_size", "n_embd", "d_model")) and not hasattr(config, "embedding_size"):
        # the config disagrees with the weights: the borders-only load names the tensor and both shapes
        return fallback()
    norm = None
    if head:
        if any(tuple(ts[k].shape) != (dm,) for k in norm_keys.values()):
            return fallback()
        norm = FamilyNorm({n: ts[k] for n, k in norm_keys.items()},
                          lambda: skeleton_final_norm(d, trust_remote_code), family_identity(d))
    # modules around the tensors as they are (a meta-device init would import torch's meta kernels, tens of MB)
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


__all__ = ["MatricesOnly", "load_borders_only", "load_head_only", "load_matrices_only"]
