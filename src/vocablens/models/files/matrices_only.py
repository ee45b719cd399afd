"""A model read without transformers' modeling code: the two vocabulary matrices and the final norm.

:func:`read_matrices` reads the tensor names from the checkpoint's safetensors headers, the sizes
from ``config.json`` and the tokenizer with its own class (no ``Auto*`` lookup), so neither
transformers' model classes nor its config classes are imported: that import alone costs more
resident memory than the matrix of a 135M model (see ``benchmarks/memory.py``). The tensors are
read by the one tensor reader (:func:`vocablens.models.files.checkpoint_files.read_tensors`: copy-on-write
mapped) and held in :class:`MatricesOnly`, a module tree shaped as the family adapter
(:class:`~vocablens.models.Borders`) reads it. The final norm is the checkpoint's tensors computed by
the family's own module, built on first use (:mod:`vocablens.models.files.final_norm`). What is not read
raises instead of guessing: the blocks are placeholders whose use raises
:class:`~vocablens.errors.BadInput`, and the input scale is NaN (Gemma's sqrt(d) is a family default
this view does not know). A checkpoint this view cannot read exactly (sub-configs, remote code, a
head bias, OPT's projections, unknown tensor names) gives None: the caller
(:func:`vocablens.models.files.partial.materialize_parts`) reads it on the family's modules instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.files.checkpoint_files import matrix_keys, read_tensors, shard_files
from vocablens.models.files.final_norm import FamilyNorm, family_identity, final_norm_keys, skeleton_final_norm
from vocablens.models.files.tokenizer_files import light_tokenizer

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

    @classmethod
    def around(cls, config, W_E: torch.Tensor, W_U: torch.Tensor | None, n_layers: int,
               norm: nn.Module | None = None) -> MatricesOnly:
        """The tree around the tensors as they are: ``W_E`` [V, d], ``W_U`` [V, d] or None (tied: the
        head is the embedding's one tensor), in eval mode. The embedding's scale is a ``meta``
        placeholder (unknown here)."""
        V, dm = W_E.shape
        # modules around the tensors as they are (a meta-device init would import torch's meta kernels, tens of MB)
        emb = nn.Embedding.from_pretrained(W_E, freeze=True)
        emb.register_buffer("embed_scale", torch.empty((), device="meta"), persistent=False)
        head = nn.Linear(1, 1, bias=False)
        head.in_features, head.out_features = dm, V
        head.weight = emb.weight if W_U is None else nn.Parameter(W_U, requires_grad=False)
        return cls(config, emb, head, n_layers, norm).eval()

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
    it is the embedding is decided by its values (:mod:`vocablens.models.files.tie`)."""
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


def read_matrices(d: Path, prov, with_norm: bool, tdtype: torch.dtype | None, trust_remote_code: bool = False):
    """The two matrices of the safetensors directory ``d`` (and its final norm, ``with_norm``) in a
    :class:`MatricesOnly` tree, without transformers' modeling code (module docstring).

    Args:
        d: the directory (:func:`vocablens.models.files.sources.source_dir`); ``prov`` its provenance.
        with_norm: read the final norm too.
        tdtype: the dtype to convert to, or None for the checkpoint's (then the file's copy-on-write mapping).

    Returns:
        ``(model, tokenizer, provenance)``, the model a :class:`MatricesOnly` tree whose borders
        (:func:`vocablens.models.files.partial.materialize_parts` finds them) have ``W_E``, ``W_U`` [V, d]
        (one tensor when tied), no head bias, ``embed_scale`` NaN, and blocks (and a final norm, unless
        read) that raise :class:`~vocablens.errors.BadInput` when used; None when this view cannot
        read ``d`` exactly (the caller reads it on the family's modules).

    Raises:
        CorruptModelFile: a file or the tokenizer cannot be read.
    """
    from vocablens.models.files.tie import checkpoint_tied

    files = shard_files(d)
    plan = _plan(d, files)
    norm_keys = final_norm_keys(files) if with_norm else {}
    if plan is None or norm_keys is None:
        return None
    config, emb_key, head_key, config_tied = plan
    ts = read_tensors([emb_key] + ([head_key] if head_key else []) + list(norm_keys.values()), files, tdtype)
    tied = checkpoint_tied(config_tied, ts.get(head_key) if head_key else None, ts[emb_key])
    if tied and head_key:                     # a stored copy of the embedding: one matrix, as transformers
        head_key = None
    W_E = ts[emb_key]
    if W_E.dim() != 2 or (head_key and tuple(ts[head_key].shape) != tuple(W_E.shape)):
        return None
    V, dm = W_E.shape
    if any(isinstance(getattr(config, k, None), int) and getattr(config, k) != dm
           for k in ("hidden_size", "n_embd", "d_model")) and not hasattr(config, "embedding_size"):
        return None  # the config disagrees with the weights: the read on the modules names the tensor and both shapes
    if any(tuple(ts[k].shape) != (dm,) for k in norm_keys.values()):
        return None
    norm = FamilyNorm({n: ts[k] for n, k in norm_keys.items()},
                      lambda: skeleton_final_norm(d, trust_remote_code), family_identity(d)) if norm_keys else None
    n_layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0)
                   or getattr(config, "num_layers", 0) or 0)
    if n_layers < 1:
        return None
    model = MatricesOnly.around(config, W_E, None if tied else ts[head_key], n_layers, norm)
    return _with_tokenizer(model, d, prov, trust_remote_code)


def _with_tokenizer(model: MatricesOnly, d: Path, prov, trust_remote_code: bool):
    """``(model, tokenizer, provenance)`` of the tree ``model``.

    Raises:
        CorruptModelFile: the tokenizer cannot be read.
    """
    from vocablens.models.files.provenance import Provenance
    from vocablens.models.files.spec import file_errors, files_fault

    try:
        tok = light_tokenizer(d, trust_remote_code)
    except file_errors() as e:
        raise CorruptModelFile(files_fault(d, shapes=False) or f"cannot read the tokenizer in {d}: "
                               f"{str(e).splitlines()[0]}") from None
    W_E = model.get_input_embeddings().weight
    return model, tok, Provenance(**{**prov.__dict__, "dtype": str(W_E.dtype).replace("torch.", "")})


__all__ = ["MatricesOnly", "read_matrices"]
