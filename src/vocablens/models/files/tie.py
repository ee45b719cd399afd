"""Whether a checkpoint's LM head is its embedding: the rule transformers applies when it loads.

A config flag says what the model *should* do; the checkpoint says what it does. transformers 5
(``PreTrainedModel.tie_weights`` during ``from_pretrained``) ties the head to the embedding when

1. ``tie_word_embeddings`` is true (text config), and
2. the checkpoint stores no head tensor (``lm_head.weight``, ``embed_out.weight`` ...), or it stores
   one equal to the stored embedding bit for bit (``torch.equal``, in the dtype the model loads in).

A stored head with other values is *untied*: transformers keeps two matrices and the model's logits
use the stored head (it warns "both are present in the checkpoints with different values"). With
``tie_word_embeddings`` false nothing is tied, whatever the tensors hold. Every vocablens loader
(full, borders-only, head-only, matrices-only, streaming) and the config-only ``anatomy`` decide
"tied" with :func:`checkpoint_tied`, so all of them read the head the model itself uses.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vocablens.errors import VocabLensError
from vocablens.models.files.checkpoint_files import matrix_keys, read_tensors, shard_files


def same_matrix(a: torch.Tensor, b: torch.Tensor, chunk: int = 8192) -> bool:
    """``torch.equal(a, b)`` over [V, d] matrices, compared ``chunk`` rows at a time (memory-mapped
    tensors stay mostly unread when they differ early). NaN never equals itself, as in torch."""
    if a is b:
        return True
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    for s in range(0, int(a.shape[0]) if a.dim() else 1, chunk):
        if not torch.equal(a[s:s + chunk], b[s:s + chunk]):
            return False
    return True


def checkpoint_tied(config_tied: bool, head: torch.Tensor | None, embedding: torch.Tensor | None) -> bool:
    """The module docstring's rule: ``config_tied`` and (no stored ``head`` or ``head`` equal to
    ``embedding``). ``head``/``embedding``: the stored [V, d] tensors as the model will hold them
    (after any dtype conversion), or None when not stored."""
    if not config_tied:
        return False
    if head is None:
        return True
    return embedding is not None and same_matrix(head, embedding)


def stored_tie(files: dict[str, Path], config_tied: bool, emb_key: str | None, head_key: str | None,
               dtype: torch.dtype | None = None) -> bool:
    """:func:`checkpoint_tied` for a safetensors checkpoint, reading (memory-mapped) the two tensors
    only when the config ties and a head is stored. ``files``: tensor name -> file; ``emb_key``/
    ``head_key``: the checkpoint keys (None: not stored)."""
    if not config_tied or head_key is None or head_key not in files:
        return bool(config_tied)
    if emb_key is None or emb_key not in files:
        return True  # transformers then ties the embedding to the stored head (the "symmetric" case)
    ts = read_tensors([emb_key, head_key], files, dtype)
    return checkpoint_tied(True, ts[head_key], ts[emb_key])


def config_as_loaded(config, d: Path):
    """``config`` with ``tie_word_embeddings`` as the checkpoint in directory ``d`` makes it: set to
    False (on the text config, in place) when the config ties but ``d`` stores a head that differs
    from its embedding; unchanged otherwise (no safetensors, names not found, already untied).
    Reads the safetensors headers, and the two matrices only when a head is stored. Returns ``config``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "tie_word_embeddings", False):
        return config
    try:
        files = shard_files(Path(d))
    except VocabLensError:
        return config
    embs, heads = matrix_keys(files)
    if len(embs) == 1 and len(heads) == 1 and not stored_tie(files, True, embs[0], heads[0]):
        text.tie_word_embeddings = False
        if text is not config and hasattr(config, "tie_word_embeddings"):
            config.tie_word_embeddings = False
    return config


__all__ = ["checkpoint_tied", "config_as_loaded", "same_matrix", "stored_tie"]
