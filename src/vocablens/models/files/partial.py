"""What a partial load reads (:class:`Parts`) and the one materializer that reads it (:func:`materialize_parts`).

Analyses over the vocabulary matrices alone (neighbours, the tie check, argmax geometry, the softmax
bottleneck) need a few hundred MB of a multi-GB checkpoint. :func:`read_parts` (a spec's directory
and dtype, then :func:`materialize_parts`) reads the parts a caller names from the checkpoint's safetensors files with the one tensor reader
(:func:`vocablens.models.files.checkpoint_files.read_tensors`: memory-mapped copy-on-write, so a write into
a tensor changes this process's copy, never the file; sharded checkpoints through their index), in
the checkpoint's own dtype unless one is asked for, and builds the
:class:`~vocablens.models.LoadedModel` around them in one of two ways:

- **on the family's modules**: the model skeleton on the ``meta`` device (no storage,
  ``accelerate.init_empty_weights``), its embedding (input norm, ``project_in``), LM head (bias,
  ``project_out``), final norm and the blocks or value vectors asked for replaced by the checkpoint's
  tensors; the other blocks stay on ``meta``, so a forward pass is refused
  (:class:`~vocablens.errors.BadInput`). Any read of the input side, a block or the value vectors.
- **without the modeling code**: for the two matrices and the final norm alone
  (:func:`vocablens.models.files.matrices_only.read_matrices`: no transformers model or config class is
  imported, the input scale is NaN, the blocks raise when used). A checkpoint that view cannot read
  exactly (sub-configs, remote code, a head bias, OPT's projections, unknown tensor names) is read on
  the family's modules instead, so callers always get the same matrices.

:func:`load_borders_only`, :func:`load_head_only` and :func:`load_matrices_only` name three reads
(the ``borders``, ``head`` and ``matrices`` modes of :func:`vocablens.models.files.loader.load_mode`).
A ``.gguf`` file is read from vocablens's safetensors cache of it when present (see
:func:`vocablens.models.load`); otherwise it is loaded whole once, which writes that cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.files.checkpoint_files import checkpoint_name, materialize, shard_files
from vocablens.models.files.loaded_model import LoadedModel, with_note
from vocablens.models.files.matrices_only import read_matrices
from vocablens.models.files.sources import source_dir
from vocablens.models.files.tokenizer_files import light_tokenizer
from vocablens.models.files.spec import DEFAULT_MODEL

#: the parts a load can read besides whole blocks (``vocablens.models.load(read=...)``; :class:`Parts`)
PARTS = ("embedding", "input_embedding", "head", "final_norm", "value_vectors")
#: the borders: the input side, the head and the final norm (the ``borders`` mode)
BORDERS = ("input_embedding", "head", "final_norm")


@dataclass(frozen=True)
class Parts:
    """What a partial load reads: some of :data:`PARTS` and some whole blocks.

    - ``embedding``: the embedding matrix ``W_E`` [V, d] alone (its input scale NaN when no other
      part builds the family's modules).
    - ``input_embedding``: the input side as the model computes it: ``W_E``, its input scale
      (Gemma's sqrt(d)), input norm (BLOOM) and ``project_in`` (OPT).
    - ``head``: ``W_U`` [V, d] with its bias, ``project_out`` and softcap. Tied or not is decided
      by what the checkpoint stores (:mod:`vocablens.models.files.tie`), so the embedding matrix is read
      with it (one tensor when tied).
    - ``final_norm``: the final norm, computed by the family's own module.
    - ``value_vectors``: every block's FFN output projection, nothing else of the blocks.
    - ``blocks``: indices 0..L-1 of blocks read whole (``project --block N``).

    A read that builds the family's modules (:attr:`on_modules`) reads the borders too (the family
    adapter, :class:`~vocablens.models.Borders`, needs them; mapped, so a page costs memory only
    when read); one without them maps the two matrices.
    """

    names: frozenset[str]
    blocks: tuple[int, ...] = ()

    @classmethod
    def of(cls, read, blocks=None) -> Parts:
        """``read`` (a name of :data:`PARTS` or several) and ``blocks`` (block indices) as :class:`Parts`.

        Raises:
            BadInput: nothing named, a name not in :data:`PARTS`, a block index that is not an integer.
        """
        names = (read,) if isinstance(read, str) else tuple(read or ())
        bad = [n for n in names if n not in PARTS]
        if bad or not (names or blocks):
            raise BadInput(f"read takes parts of {', '.join(PARTS)} (and blocks=[indices]); got {list(names)!r}")
        try:
            idx = tuple(int(i) for i in (blocks or ()))
        except (TypeError, ValueError):
            raise BadInput(f"blocks takes block indices (integers); got {blocks!r}") from None
        return cls(frozenset(names), idx)

    @property
    def on_modules(self) -> bool:
        """True when the read builds the family's modules: the input side, a block or the value vectors."""
        return bool(self.blocks) or bool(self.names & {"input_embedding", "value_vectors"})


def read_parts(spec: str | os.PathLike, parts: Parts, dtype=None, trust_remote_code: bool = False):
    """Read ``parts`` of ``spec``: its safetensors directory and dtype, then :func:`materialize_parts`.

    Args:
        spec: as :func:`vocablens.models.load` (``smollm2``, a directory, a ``.gguf`` file, a hub id).
        parts: what to read (:class:`Parts`).
        dtype: torch dtype or name, ``"auto"`` for the checkpoint's own; default: the checkpoint's
            own (float32 for a dequantized GGUF), except float16, which loads as float32 (a note
            in the provenance; :func:`vocablens.models.files.source.run_dtype`).
        trust_remote_code: passed to transformers (config, tokenizer).

    Returns:
        :class:`~vocablens.models.LoadedModel` on the CPU whose ``borders`` has the parts read as
        real tensors (memory-mapped in the checkpoint's dtype: a page becomes resident when an
        analysis reads it) and the rest on ``meta`` or as placeholders that raise when used. Peak
        memory: about the bytes of those tensors (one [V, d] matrix when tied) plus the tokenizer.

    Raises:
        ModelNotFound, CorruptModelFile: as :func:`vocablens.models.load`; CorruptModelFile also when
            the config and the weights disagree. NoSafetensors (a BadInput): a checkpoint without
            safetensors. BadInput: a block index out of range.
    """
    from vocablens.models.files.source import resolve_source, run_dtype

    source = resolve_source(spec)
    d, prov = source_dir(source)
    tdtype, dtype_note = run_dtype(source, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    return with_note(materialize_parts(source.spec, d, prov, parts, tdtype, trust_remote_code), dtype_note)


def materialize_parts(spec: str, d: Path, prov, parts: Parts, tdtype: torch.dtype | None,
                      trust_remote_code: bool = False, device: str = "cpu"):
    """The one materializer: ``parts`` of the safetensors directory ``d`` read, without the modeling
    code when the parts allow it, else on the family's modules (module docstring), their real
    tensors moved to ``device`` (read on the CPU first; the blocks left on ``meta`` stay there; a
    tied matrix stays one tensor), then the borders found once, in a
    :class:`~vocablens.models.LoadedModel`.

    Args:
        spec: what the user named (for messages); ``d`` and ``prov``: its directory and provenance
            (:func:`~vocablens.models.files.sources.source_dir`).
        parts: what to read (:class:`Parts`).
        tdtype: the dtype to convert to, or None for the checkpoint's own (then the file's
            copy-on-write mapping).
        device: where the real tensors go once read on the CPU.

    Returns and raises: as :func:`read_parts`.
    """
    from vocablens.models.borders import Borders

    read = None if parts.on_modules else read_matrices(d, prov, "final_norm" in parts.names, tdtype, trust_remote_code)
    model, tok, prov = read if read is not None else _on_family_modules(spec, d, prov, parts, tdtype, trust_remote_code)
    dev = torch.device(device)
    moved: dict[int, tuple] = {}  # id -> (old, new): the old tensor is kept alive so ids stay unique
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for name, t in list(store.items()):
                if t is None or t.is_meta or t.device == dev:
                    continue
                if id(t) not in moved:
                    new = t.detach().to(dev)
                    moved[id(t)] = (t, torch.nn.Parameter(new, requires_grad=False)
                                    if isinstance(t, torch.nn.Parameter) else new)
                store[name] = moved[id(t)][1]
    return LoadedModel(model, tok, Borders.from_model(model, tokenizer=tok), prov)


# ------------------------------------------------------------ on the family's modules
def _on_family_modules(spec: str, d: Path, prov, parts: Parts, tdtype, trust_remote_code: bool):
    """``(model, tokenizer, provenance)``: the skeleton's borders (and ``parts``' blocks or value
    vectors) replaced by the checkpoint's tensors, on the CPU (:func:`materialize_parts` places them)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    from vocablens.models.files.auto_class import auto_model_class
    from vocablens.models.files.checkpoint_files import renamed_files
    from vocablens.models.borders import Borders
    from vocablens.models.files.provenance import Provenance
    from vocablens.models.files.spec import file_errors, files_fault

    try:
        config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
        tok = light_tokenizer(d, trust_remote_code, spec)   # AutoTokenizer parses tokenizer.json twice (both copies kept)
    except file_errors() as e:
        raise CorruptModelFile(files_fault(d) or f"cannot read the config or tokenizer in {d}: "
                               f"{str(e).splitlines()[0]}") from None
    with init_empty_weights():  # the causal-LM class, else a vision-language model's (models.files.auto_class)
        model = auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    files = renamed_files(model, shard_files(d))  # the checkpoint's keys as the model names them
    skel = Borders.from_model(model)
    wanted = _modules_read(skel, parts)
    tied = _stored_tie(model, skel, config, files, tdtype)
    ids = {id(p) for m in wanted if m is not None for p in m.parameters()}
    if not tied and skel.lm_head.weight is skel.embedding.weight:
        # "tied" by what the checkpoint stores (vocablens.models.files.tie): the skeleton may share one
        # meta matrix whatever the checkpoint holds
        skel.lm_head.weight = torch.nn.Parameter(torch.empty(skel.lm_head.weight.shape, device="meta"),
                                                 requires_grad=False)
        ids.add(id(skel.lm_head.weight))
    # named_parameters lists a tied matrix once (under the embedding's name): read it once, then let
    # the head share the new tensor again
    head_name = _param_name(model, skel.lm_head)
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids]
    materialize(model, list(dict.fromkeys(n for n in names if not (tied and n == head_name))), files, tdtype)
    if tied:
        skel.lm_head.weight = model.get_input_embeddings().weight
    if skel.final_norm is not None:  # non-persistent buffers (e.g. rotary) stay on meta; norms have none
        lost = [n for n, b in skel.final_norm.named_buffers() if b.is_meta]
        if lost:
            raise CorruptModelFile(f"the final norm's buffer {lost[0]} is not in the checkpoint")
    model.eval()
    pdtype = model.get_input_embeddings().weight.dtype
    return model, tok, Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})


def _modules_read(skel, parts: Parts) -> list:
    """The skeleton's modules whose tensors a read of ``parts`` takes: the borders, then its blocks
    and value vectors.

    Raises:
        BadInput: a block index out of range.
    """
    E = skel.input_embedding  # the input side: the token embedding, its norm (BLOOM), project_in
    wanted = [E.module, E.input_norm, E.project_in, skel.lm_head, skel.final_norm, skel.project_out]
    for i in parts.blocks:
        wanted.append(skel.blocks[skel.check_block(i)])
    if "value_vectors" in parts.names:
        from vocablens.models.blocks import block_views

        wanted += [v.mlp_out for v in block_views(skel)]
    return wanted


def _param_name(model: nn.Module, module: nn.Module) -> str:
    """The name of ``module.weight`` in ``model.named_parameters()``."""
    name = next(n for n, m in model.named_modules() if m is module)
    return f"{name}.weight".lstrip(".")


def _stored_tie(model: nn.Module, skel, config, files: dict[str, Path], tdtype) -> bool:
    """Whether the checkpoint's head is its embedding, as transformers decides it (:mod:`vocablens.models.files.tie`)."""
    from vocablens.models.files.tie import stored_tie

    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    prefix = getattr(model, "base_model_prefix", "") or ""
    return stored_tie(files, bool(getattr(text_config, "tie_word_embeddings", False)),
                      checkpoint_name(_param_name(model, skel.embedding), files, prefix),
                      checkpoint_name(_param_name(model, skel.lm_head), files, prefix), tdtype)


# ------------------------------------------------------------ the three named reads
def load_borders_only(spec: str | os.PathLike = DEFAULT_MODEL, dtype=None, trust_remote_code: bool = False,
                      blocks=None, value_vectors: bool = False):
    """The model with only its borders in memory (the ``borders`` mode): :func:`read_parts` of
    :data:`BORDERS`, plus ``blocks`` (block indices read whole) and, with ``value_vectors``, every
    block's FFN value vectors. Arguments, returns and errors as :func:`read_parts`; the embedding,
    LM head (+ bias) and final norm are real, the other blocks on the ``meta`` device."""
    read = BORDERS + (("value_vectors",) if value_vectors else ())
    return read_parts(spec, Parts.of(read, blocks), dtype, trust_remote_code)


def load_matrices_only(spec: str | os.PathLike = DEFAULT_MODEL, dtype=None, trust_remote_code: bool = False):
    """The embedding and LM head only (the ``matrices`` mode), read without transformers' modeling
    code when the checkpoint allows: :func:`read_parts` of ``("embedding", "head")``. ``borders``
    has ``W_E`` and ``W_U`` [V, d] (memory-mapped; one matrix when tied), ``embed_scale`` NaN, and
    a final norm and blocks that raise :class:`~vocablens.errors.BadInput` when used. Arguments and
    errors as :func:`read_parts`."""
    return read_parts(spec, Parts.of(("embedding", "head")), dtype, trust_remote_code)


def load_head_only(spec: str | os.PathLike = DEFAULT_MODEL, dtype=None, trust_remote_code: bool = False):
    """The LM head and the final norm (the ``head`` mode, what ``argmax`` reads): :func:`read_parts`
    of ``("head", "final_norm")``. ``borders`` has ``W_U`` [V, d], no bias, the final norm (the
    checkpoint's tensors computed by the family's own module,
    :class:`~vocablens.models.files.final_norm.FamilyNorm`), and blocks that raise
    :class:`~vocablens.errors.BadInput` when used. In the checkpoint's dtype the matrices stay the
    file's copy-on-write mapping: a pass over them can hand their pages back to the page cache
    (:mod:`vocablens.models.files.pages`). Arguments and errors as :func:`read_parts`."""
    return read_parts(spec, Parts.of(("head", "final_norm")), dtype, trust_remote_code)


__all__ = ["BORDERS", "PARTS", "Parts", "load_borders_only", "load_head_only", "load_matrices_only",
           "materialize_parts", "read_parts"]
