"""A skipped block's cache, filled without running the block (early exit's state propagation).

CALM (Schuster et al. 2022, §5; google/flaxformer ``calm_t5``, ``only_propagate_state``) copies the
exit layer's state upward as the input of every skipped block; each skipped block then only has to
write its keys and values. For the llama-style attention of :data:`KV_ONLY_FAMILIES` that is its
input norm, K/V projections, K norm (Qwen3) and rotary embedding (transformers'
``apply_rotary_pos_emb`` on the keys, ``rotate_half`` convention); other families run the block
whole (the caller's fallback). Asked through :meth:`vocablens.models.Borders.fills_cache_only` and
:func:`fill_kv_only`, so no analysis keeps a family list.
"""

from __future__ import annotations

import torch

#: families whose skipped blocks fill their cache with K/V projections only (tested in test_generate)
KV_ONLY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def fill_kv_only(block, hidden: torch.Tensor, kwargs: dict) -> bool:
    """Write block ``block``'s keys and values for ``hidden`` [B, T, d] into the cache passed in
    ``kwargs`` (``cache`` or ``past_key_values``), running only its input norm, K/V projections,
    K norm (Qwen3) and rotary embedding (``position_embeddings`` = (cos, sin) [B, T, d_head]).
    Returns False (nothing written) when the block is not a llama-style one this function knows."""
    attn = getattr(block, "self_attn", None)
    norm = getattr(block, "input_layernorm", None)
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    pos = kwargs.get("position_embeddings")
    if attn is None or norm is None or cache is None or pos is None or not all(
            hasattr(attn, n) for n in ("k_proj", "v_proj", "layer_idx", "head_dim")):
        return False
    x = norm(hidden)
    B, T, _ = x.shape
    k = attn.k_proj(x).view(B, T, -1, attn.head_dim)
    if getattr(attn, "k_norm", None) is not None:
        k = attn.k_norm(k)
    k = k.transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
    cos, sin = pos
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    k = k * cos + _rotate_half(k) * sin
    cache.update(k, v, attn.layer_idx)
    return True


__all__ = ["KV_ONLY_FAMILIES", "fill_kv_only"]
