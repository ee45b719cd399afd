"""Attention shape and FLOP counts from a config: the one place that reads heads and head_dim.

FLOPs count one multiply-add as 2. Per token (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", Table 1): a weight matrix costs 2 FLOPs per parameter; the LM head ``2·V·d``;
attention against ``n_ctx`` earlier positions ``2·n_layer·n_ctx·d_attn`` (Kaplan's "Attention: Mask"
row, with ``d_attn`` = heads × head_dim). Counting the two context matmuls (QKᵀ and A·V) separately,
as Hoffmann et al. 2022 (Chinchilla, App. F) do, doubles the attention term: ``per_matmul=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

from vocablens.models.find import config_value


@dataclass(frozen=True)
class AttentionShape:
    """Heads of one attention layer.

    Attributes:
        heads: query heads H.
        kv_heads: key/value heads (H without grouped-query attention).
        head_dim: width of one head.
    """

    heads: int
    kv_heads: int
    head_dim: int

    @property
    def d_attn(self) -> int:
        """heads × head_dim, the width of the attention's context matmuls."""
        return self.heads * self.head_dim


def attention_shape(config, d_model: int) -> AttentionShape:
    """Heads, key/value heads and head width from a config (``head_dim`` or d_model / heads).

    A config without a head count (no attention found) counts as one head of width d_model.
    """
    heads = config_value(config, "num_attention_heads", "n_head", "num_heads")
    if not heads:
        return AttentionShape(1, 1, int(d_model))
    heads = int(heads)
    head_dim = int(config_value(config, "head_dim", default=None) or int(d_model) // heads)
    kv = int(config_value(config, "num_key_value_heads", "num_kv_heads", default=None) or heads)
    return AttentionShape(heads, kv, head_dim)


def head_flops(vocab_size: int, d: int) -> int:
    """FLOPs of the LM head for one position: 2·V·d (the same whether tied or not)."""
    return 2 * int(vocab_size) * int(d)


def attention_flops(n_layers: int, context: int, d_attn: int, per_matmul: bool = False) -> int:
    """FLOPs per token of attending to ``context`` earlier positions in ``n_layers`` layers.

    ``2·n_layers·context·d_attn`` (Kaplan et al. 2020, Table 1), or twice that with
    ``per_matmul=True`` (QKᵀ and A·V each ``2·context·d_attn``, Hoffmann et al. 2022 App. F).
    """
    return (4 if per_matmul else 2) * int(n_layers) * int(context) * int(d_attn)


def block_flops(borders, context: float) -> float:
    """Forward FLOPs of one average block of a loaded model for one token attending ``context``
    earlier positions: 2 per weight of its matrices plus the two context matmuls of every head,
    ``4·H·head_dim·context`` (:func:`attention_flops` with ``per_matmul=True``, one layer)."""
    L = borders.n_layers
    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2) / L
    shape = attention_shape(borders.config, borders.d_model)
    return 2.0 * weights + 4.0 * shape.d_attn * context


__all__ = ["AttentionShape", "attention_shape", "attention_flops", "block_flops", "head_flops"]
