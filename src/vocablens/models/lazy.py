"""Load only the two borders: the embedding, the LM head (and bias) and the final norm.

Analyses over the vocabulary matrices alone (neighbours, the tie check, argmax geometry, the softmax
bottleneck) need a few hundred MB of a multi-GB checkpoint. :func:`load_borders_only` builds the model
skeleton on the ``meta`` device (no storage, ``accelerate.init_empty_weights``), then reads just those
tensors from the checkpoint's safetensors files through ``safe_open`` (memory-mapped; one tensor at a
time; sharded checkpoints through their index), in the checkpoint's own dtype unless one is asked
for. The blocks stay on ``meta``: a forward pass is refused (:class:`~vocablens.errors.BadInput`).

A ``.gguf`` file is read from vocablens's safetensors cache of it when present (see
:func:`vocablens.models.load`); otherwise it is loaded whole once, which writes that cache.
"""

from __future__ import annotations

import os

import torch

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.models.checkpoint_files import checkpoint_name, materialize, shard_files
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
    from vocablens.models.loaded import LoadedModel
    from vocablens.models.provenance import Provenance
    from vocablens.models.spec import diagnose_dir, file_errors, missing_parts
    from vocablens.models.tie import stored_tie

    spec_s = str(spec)
    d, prov = source_dir(spec_s)
    tdtype, dtype_note = run_dtype(spec_s, dtype)  # a float16 checkpoint: float32 (the CPU's rule)
    try:
        config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
        tok = light_tokenizer(d, trust_remote_code, spec_s)   # AutoTokenizer parses tokenizer.json twice (~45 MiB kept)
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


__all__ = ["load_borders_only"]
