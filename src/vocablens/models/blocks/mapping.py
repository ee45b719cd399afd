"""Mapping a family's block layout onto :class:`~vocablens.models.blocks.view.BlockView`.

The only place that knows each family's module names: attention and MLP containers, the up / gate /
down projections (phi3's fused ``gate_up_proj`` included), fused q/k/v projections (gpt2 ``c_attn``,
gpt_neox/bloom/falcon ``query_key_value``, phi3 ``qkv_proj``), post-norms (gemma2/gemma3/olmo2), the
granite residual multiplier, parallel attention + MLP, and post-LN blocks (not additive).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn

from vocablens.errors import UnsupportedArchitecture
from vocablens.models.blocks.view import BlockView, PostTransform, linear_bias, linear_weight
from vocablens.models.find import config_value as _cfg
from vocablens.models.find import first_child, named_children

_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
_MLP_NAMES = ("mlp", "feed_forward", "ffn")
_OUT_PROJ_NAMES = ("o_proj", "out_proj", "dense", "c_proj")
# (up, gate, down): the first triple that exists wins; gate None means a plain (non-gated) MLP.
_MLP_TRIPLES = (
    ("up_proj", "gate_proj", "down_proj"),
    ("w3", "w1", "w2"),
    ("c_fc", None, "c_proj"),
    ("dense_h_to_4h", None, "dense_4h_to_h"),
    ("fc1", None, "fc2"),
    ("fc_in", None, "fc_out"),
)
_ACT_NAMES = ("act_fn", "act", "activation_fn", "gelu_impl", "activation")
_MOE_MARKERS = ("experts", "router", "block_sparse_moe", "shared_expert")
# Families whose blocks read attention and MLP from the same input (when the config does not say).
_PARALLEL_FAMILIES = ("gptj", "phi", "cohere", "cohere2", "codegen")


def _split_concat(w: torch.Tensor, H: int, Hkv: int, dh: int):
    """Fused [q | k | v] rows (gpt2 ``c_attn``, phi3 ``qkv_proj``): w [(H+2Hkv)·dh, d]."""
    d = w.shape[1]
    q = w[: H * dh].reshape(H, dh, d).transpose(1, 2)
    k = w[H * dh: (H + Hkv) * dh].reshape(Hkv, dh, d).transpose(1, 2)
    v = w[(H + Hkv) * dh:].reshape(Hkv, dh, d).transpose(1, 2)
    return q, k, v


def _split_grouped(w: torch.Tensor, H: int, Hkv: int, dh: int):
    """Fused rows grouped per kv head: [Hkv, (H/Hkv q heads, k, v), dh] (gpt_neox and bloom with
    Hkv = H; falcon: multi-query Hkv = 1, new decoder architecture any Hkv)."""
    d = w.shape[1]
    g = H // Hkv
    x = w.reshape(Hkv, g + 2, dh, d)
    q = x[:, :g].reshape(H, dh, d).transpose(1, 2)
    k = x[:, g].transpose(1, 2)
    v = x[:, g + 1].transpose(1, 2)
    return q, k, v


def _heads(config, family: str, attn: nn.Module) -> tuple[int, int, int]:
    H = int(_cfg(config, "num_attention_heads", "n_head", "num_heads"))
    d = int(_cfg(config, "hidden_size", "n_embd", "d_model"))
    dh = _cfg(config, "head_dim", default=None)
    dh = int(getattr(attn, "head_dim", None) or dh or d // H)
    Hkv = _cfg(config, "num_key_value_heads", "num_kv_heads", default=None)
    if family == "falcon" and not getattr(config, "new_decoder_architecture", False):
        Hkv = 1 if getattr(config, "multi_query", False) else H
    Hkv = int(Hkv or H)
    return H, Hkv, dh


def _parallel(config, family: str) -> bool:
    for n in ("use_parallel_residual", "parallel_attn", "parallel_residual"):
        v = getattr(config, n, None)
        if v is not None:
            return bool(v) or bool(getattr(config, "new_decoder_architecture", False))
    return family in _PARALLEL_FAMILIES


def _activation(family, config, mlp, block) -> Callable:
    _, act = first_child(mlp, _ACT_NAMES)
    if act is None and mlp is not block:
        _, act = first_child(block, _ACT_NAMES)
    if act is None:
        name = _cfg(config, "hidden_act", "activation_function", "hidden_activation", default="gelu")
        from transformers.activations import ACT2FN

        act = ACT2FN[name]
    return act


def block_view(borders, index: int) -> BlockView:
    """The uniform view of block ``index`` of a model.

    Args:
        borders: the model's :class:`~vocablens.models.Borders`.
        index: 0..L-1.

    Raises:
        IndexError: index out of range (callers check ranges and raise BadInput first).
        UnsupportedArchitecture: no attention or no dense MLP of the expected shape (mixture of
            experts), naming the family and the block's modules.
    """
    blk = borders.blocks[index]
    family, config = borders.family, borders.config
    found = named_children(blk)
    an, attn = first_child(blk, _ATTN_NAMES)
    if attn is None:
        raise UnsupportedArchitecture(family, found, f"block {index} has no attention module")
    found.update({f"{an}.{k}": v for k, v in named_children(attn).items()})
    mn, mlp = first_child(blk, _MLP_NAMES)
    if mlp is None:
        mlp = blk  # OPT keeps fc1/fc2 on the block itself
    else:
        found.update({f"{mn}.{k}": v for k, v in named_children(mlp).items()})
    where = (family, found, index)
    up, gate, down, gate_up_split = _mlp_projections(mlp, where)
    _, attn_out = first_child(attn, _OUT_PROJ_NAMES)
    if attn_out is None:
        raise UnsupportedArchitecture(family, found, f"block {index}: no attention output projection")
    H, Hkv, dh = _heads(config, family, attn)
    if linear_weight(attn_out).shape[1] != H * dh or H % Hkv:
        raise UnsupportedArchitecture(family, found, f"block {index}: attention output reads "
                                      f"{linear_weight(attn_out).shape[1]} features, expected {H}x{dh}")
    attn_post, mlp_post = _post_transforms(blk)
    additive, why = _additive(config)
    return BlockView(
        index=index, family=family, block=blk, parallel=_parallel(config, family), additive=additive,
        n_heads=H, n_kv_heads=Hkv, d_head=dh, attn=attn, attn_out=attn_out, mlp_in=up, mlp_gate=gate,
        mlp_out=down, act=_activation(family, config, mlp, blk), attn_post=attn_post, mlp_post=mlp_post,
        not_additive_reason=why, _qkv=partial(_qkv, attn, (H, Hkv, dh), where), _gate_up_split=gate_up_split,
        _qkv_bias=partial(_qkv_bias, attn, (H, Hkv, dh)),
    )


def _mlp_projections(mlp: nn.Module, where: tuple) -> tuple:
    """``(up, gate or None, down, gate_up_split)`` of a dense MLP (phi3's fused ``gate_up_proj``:
    split True); ``where`` is ``(family, modules found, block index)`` for the errors.

    Raises:
        UnsupportedArchitecture: a mixture of experts, or no up/gate/down projections of matching shapes.
    """
    family, found, index = where
    if any(isinstance(getattr(mlp, m, None), nn.Module) for m in _MOE_MARKERS) or \
            isinstance(getattr(mlp, "gate", None), nn.Module) and not isinstance(getattr(mlp, "gate"), nn.Linear):
        raise UnsupportedArchitecture(family, found, f"block {index} has a mixture-of-experts MLP, not one "
                                      "dense MLP with one value vector per neuron")
    up = gate = down = None
    gate_up_split = False
    for u, g, dn in _MLP_TRIPLES:
        if isinstance(getattr(mlp, u, None), nn.Module) and isinstance(getattr(mlp, dn, None), nn.Module) and \
                (g is None or isinstance(getattr(mlp, g, None), nn.Module)):
            up, down = getattr(mlp, u), getattr(mlp, dn)
            gate = getattr(mlp, g) if g else None
            break
    if up is None and isinstance(getattr(mlp, "gate_up_proj", None), nn.Module) and \
            isinstance(getattr(mlp, "down_proj", None), nn.Module):
        up, down, gate_up_split = mlp.gate_up_proj, mlp.down_proj, True  # phi3: [gate | up]
    if up is None or not hasattr(down, "weight") or linear_weight(down).dim() != 2:
        raise UnsupportedArchitecture(family, found, f"block {index} has no MLP of the expected shape "
                                      "(up/gate/down projections)")
    d_ff = linear_weight(down).shape[1]
    n_up = linear_weight(up).shape[0]
    if n_up != (2 * d_ff if gate_up_split else d_ff):
        raise UnsupportedArchitecture(family, found, f"block {index}: up projection has {n_up} rows, "
                                      f"down projection reads {d_ff}")
    return up, gate, down, gate_up_split


_SEPARATE_QKV = ("q_proj", "k_proj", "v_proj")
#: fused q/k/v projections and how their rows are laid out
_FUSED_QKV = (("c_attn", _split_concat), ("qkv_proj", _split_concat), ("W_pack", _split_concat),
              ("query_key_value", _split_grouped))


def _qkv(attn: nn.Module, heads: tuple[int, int, int], where: tuple):
    """``(W_Q [H, d, dh], W_K [Hkv, d, dh], W_V [Hkv, d, dh])`` of an attention module; ``heads`` is
    ``(H, Hkv, dh)``.

    Raises:
        UnsupportedArchitecture: no q/k/v projections, separate or fused.
    """
    H, Hkv, dh = heads
    if all(isinstance(getattr(attn, n, None), nn.Module) for n in _SEPARATE_QKV):
        ws = [linear_weight(getattr(attn, n)) for n in _SEPARATE_QKV]
        q = ws[0].reshape(H, dh, -1).transpose(1, 2)
        k = ws[1].reshape(Hkv, dh, -1).transpose(1, 2)
        v = ws[2].reshape(Hkv, dh, -1).transpose(1, 2)
        return q, k, v
    for n, split in _FUSED_QKV:
        m = getattr(attn, n, None)
        if isinstance(m, nn.Module):
            return split(linear_weight(m), H, Hkv, dh)
    family, found, index = where
    raise UnsupportedArchitecture(family, found, f"block {index}: no q/k/v projections found")


def _qkv_bias(attn: nn.Module, heads: tuple[int, int, int]):
    """``(b_Q [H, dh], b_K [Hkv, dh], b_V [Hkv, dh])`` of an attention module, each None when not stored."""
    H, Hkv, dh = heads
    if all(isinstance(getattr(attn, n, None), nn.Module) for n in _SEPARATE_QKV):
        bs = [linear_bias(getattr(attn, n)) for n in _SEPARATE_QKV]
        return tuple(None if bb is None else bb.reshape(n, dh) for bb, n in zip(bs, (H, Hkv, Hkv)))
    for n, split in _FUSED_QKV:
        m = getattr(attn, n, None)
        if isinstance(m, nn.Module):
            bb = linear_bias(m)
            if bb is None:
                return None, None, None
            q, k, v = split(bb[:, None], H, Hkv, dh)  # [n, 1, dh]
            return q[:, 0], k[:, 0], v[:, 0]
    return None, None, None


def _post_transforms(blk: nn.Module) -> tuple[PostTransform, PostTransform]:
    """What the block does to its attention's and its MLP's output before the residual add."""
    attn_post, mlp_post = PostTransform(), PostTransform()
    if isinstance(getattr(blk, "post_feedforward_layernorm", None), nn.Module):
        # gemma2 / gemma3 / olmo2: the sublayer outputs are normed, then added
        attn_post = PostTransform(norm=blk.post_attention_layernorm)
        mlp_post = PostTransform(norm=blk.post_feedforward_layernorm)
    mult = getattr(blk, "residual_multiplier", None)
    if isinstance(mult, (int, float)) and float(mult) != 1.0:
        attn_post = PostTransform(attn_post.norm, float(mult))
        mlp_post = PostTransform(mlp_post.norm, float(mult))
    return attn_post, mlp_post


def _additive(config) -> tuple[bool, str]:
    """``(True, "")`` when each block adds its updates to the stream, else ``(False, why not)`` (post-LN)."""
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        return False, "the residual connection reads the normed stream"
    if getattr(config, "do_layer_norm_before", True) is False:
        return False, "post-LN blocks (do_layer_norm_before=False) norm the sum, not the updates"
    return True, ""


def block_views(borders) -> list[BlockView]:
    """:func:`block_view` for every block, in order (raises on the first unsupported block)."""
    return [block_view(borders, i) for i in range(borders.n_layers)]
