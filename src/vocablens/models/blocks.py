"""One uniform view of a decoder block: where its attention and MLP weights live and how its updates
reach the residual stream.

This is the only place that knows each family's block layout. :func:`block_view` maps a block to a
:class:`BlockView` with

- the MLP: ``W_in`` [d_ff, d] (keys: rows of the up projection), ``W_gate`` [d_ff, d] or None (gated
  MLPs: llama, gemma, phi3's fused ``gate_up_proj`` ...), ``W_out`` [d_ff, d] (values: rows of the down
  projection's transpose), their biases and the activation function;
- the attention per head: ``W_Q`` [H, d, d_head], ``W_K``/``W_V`` [H_kv, d, d_head], ``W_O`` [H, d_head, d]
  and the grouped-query map ``kv_head(h) = h // (H / H_kv)``; fused projections (gpt2 ``c_attn``,
  gpt_neox/bloom/falcon ``query_key_value``, phi3 ``qkv_proj``) are split the way the model splits them;
- where the updates can be hooked: the attention's output projection (its input is the concatenated head
  outputs ``z`` [.., H·d_head]) and the MLP's down projection (its input is the activations [.., d_ff]),
  plus what the block does to those outputs before adding them to the stream (a post-norm as in
  gemma2/gemma3/olmo2, a residual multiplier as in granite);
- ``parallel``: attention and MLP read the same input (gpt_neox with ``use_parallel_residual``, gptj,
  phi, cohere, falcon with ``parallel_attn``); otherwise the MLP reads the stream after the attention.

:func:`capture_updates` records those tensors during one forward pass with hooks on the blocks'
submodules, and :func:`linearize_norm` writes a norm at its actual input as an affine map (the final norm
and post-norms, for direct logit attribution).

Blocks with no dense MLP of the expected shape (mixture-of-experts: mixtral, qwen3_moe ...) raise
:class:`~vocablens.errors.UnsupportedArchitecture` naming the family and the modules found.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

from vocablens.errors import UnsupportedArchitecture
from vocablens.models.borders import config_value as _cfg

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


def _children(mod: nn.Module) -> dict[str, str]:
    return {n: type(m).__name__ for n, m in mod.named_children()}


def _is_conv1d(mod: nn.Module) -> bool:
    return type(mod).__name__ == "Conv1D"


def linear_weight(mod: nn.Module) -> torch.Tensor:
    """The weight of a linear-like module as ``[out, in]`` (transformers' ``Conv1D`` stores ``[in, out]``)."""
    w = mod.weight
    return w.t() if _is_conv1d(mod) else w


def linear_bias(mod: nn.Module) -> torch.Tensor | None:
    b = getattr(mod, "bias", None)
    return b if isinstance(b, torch.Tensor) else None


def _get(mod: nn.Module, names) -> tuple[str | None, nn.Module | None]:
    for n in names:
        m = getattr(mod, n, None)
        if isinstance(m, nn.Module):
            return n, m
    return None, None




@dataclass(frozen=True)
class PostTransform:
    """What a block does to a sublayer's output before adding it to the residual stream.

    Attributes:
        norm: a post-norm module (gemma2/gemma3/olmo2), or None.
        scale: a constant multiplier applied after the norm (granite ``residual_multiplier``), else 1.0.
    """

    norm: nn.Module | None = None
    scale: float = 1.0

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            y = self.norm(y)
        return y * self.scale if self.scale != 1.0 else y


@dataclass(frozen=True, eq=False)
class BlockView:
    """The uniform view of one decoder block (see the module docstring).

    All weight accessors return the checkpoint's own tensors (views, no copies, no folding), in the
    model's dtype. ``d`` is the residual width d_model.

    Attributes:
        index: the block's position 0..L-1 (its output is residual-stream layer ``index + 1``).
        family: ``config.model_type``.
        block: the block module.
        parallel: attention and MLP read the same input.
        additive: the block's output is its input plus the two (post-transformed) updates; False for
            post-LN blocks (OPT with ``do_layer_norm_before=False``, bloom with
            ``apply_residual_connection_post_layernorm``), where updates cannot be summed.
        n_heads, n_kv_heads, d_head: attention shape; ``n_heads % n_kv_heads == 0``.
        attn_out: the attention's output projection (hook point: input z [.., H·d_head], output [.., d]).
        mlp_out: the MLP's down projection (hook point: input activations [.., d_ff], output [.., d]).
        attn_post, mlp_post: what the block applies to those outputs before the residual add.
        act: the MLP's activation function (callable on a tensor).
    """

    index: int
    family: str
    block: nn.Module
    parallel: bool
    additive: bool
    n_heads: int
    n_kv_heads: int
    d_head: int
    attn: nn.Module
    attn_out: nn.Module
    mlp_in: nn.Module
    mlp_gate: nn.Module | None
    mlp_out: nn.Module
    act: Callable[[torch.Tensor], torch.Tensor]
    attn_post: PostTransform = field(default_factory=PostTransform)
    mlp_post: PostTransform = field(default_factory=PostTransform)
    not_additive_reason: str = ""
    _qkv: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False)
    _gate_up_split: bool = False
    _qkv_bias: Callable[[], tuple] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ MLP
    @property
    def gated(self) -> bool:
        """True for gated MLPs: act(x·W_gate) * (x·W_in)."""
        return self.mlp_gate is not None or self._gate_up_split

    @property
    def d_ff(self) -> int:
        return int(self.W_out.shape[0])

    @property
    def W_out(self) -> torch.Tensor:
        """Value vectors [d_ff, d]: row i is what neuron i writes to the stream per unit of activation
        (Geva et al. 2022, §2; the transpose of the down projection's ``[d, d_ff]`` weight)."""
        return linear_weight(self.mlp_out).t()

    @property
    def b_out(self) -> torch.Tensor | None:
        """Down projection bias [d], or None."""
        return linear_bias(self.mlp_out)

    @property
    def W_in(self) -> torch.Tensor:
        """Key vectors [d_ff, d]: rows of the up projection (the linear branch of a gated MLP)."""
        w = linear_weight(self.mlp_in)
        if self._gate_up_split:
            return w[w.shape[0] // 2:]
        return w

    @property
    def W_gate(self) -> torch.Tensor | None:
        """Gate rows [d_ff, d] of a gated MLP (the branch that goes through the activation), or None."""
        if self._gate_up_split:
            w = linear_weight(self.mlp_in)
            return w[: w.shape[0] // 2]
        return linear_weight(self.mlp_gate) if self.mlp_gate is not None else None

    @property
    def keys(self) -> torch.Tensor:
        """The rows that decide whether a neuron fires [d_ff, d]: the gate rows of a gated MLP, else
        the up projection's rows (Geva et al. 2021 "keys")."""
        g = self.W_gate
        return g if g is not None else self.W_in

    # ------------------------------------------------------------------ attention
    def kv_head(self, h: int) -> int:
        """The key/value head that query head ``h`` reads (grouped-query attention)."""
        return h // (self.n_heads // self.n_kv_heads)

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head projections: W_Q [H, d, d_head], W_K [H_kv, d, d_head], W_V [H_kv, d, d_head]."""
        assert self._qkv is not None
        return self._qkv()

    def qkv_bias(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Per-head biases b_Q [H, d_head], b_K [H_kv, d_head], b_V [H_kv, d_head] (None where absent)."""
        assert self._qkv_bias is not None
        return self._qkv_bias()

    @property
    def W_O(self) -> torch.Tensor:
        """Per-head output projection [H, d_head, d]: head h writes ``z_h @ W_O[h]``."""
        w = linear_weight(self.attn_out)  # [d, H·d_head]
        return w.t().reshape(self.n_heads, self.d_head, -1)

    @property
    def b_O(self) -> torch.Tensor | None:
        """Output projection bias [d], or None (it belongs to no head)."""
        return linear_bias(self.attn_out)

    def W_OV(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The OV circuit of query head h as the factor pair ``(W_V[kv_head(h)] [d, d_head], W_O[h]
        [d_head, d])``; their product [d, d] is rank <= d_head, so callers keep it factored."""
        _, _, Wv = self.qkv()
        return Wv[self.kv_head(h)], self.W_O[h]

    def W_QK(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The QK circuit of query head h as ``(W_Q[h] [d, d_head], W_K[kv_head(h)] [d, d_head])``:
        the bilinear score is ``x_q W_Q W_Kᵀ x_kᵀ`` (positions, rotary and q/k norms not included)."""
        Wq, Wk, _ = self.qkv()
        return Wq[h], Wk[self.kv_head(h)]


# ---------------------------------------------------------------------------------------------- mapping
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
    _, act = _get(mlp, _ACT_NAMES)
    if act is None and mlp is not block:
        _, act = _get(block, _ACT_NAMES)
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
    found = _children(blk)
    an, attn = _get(blk, _ATTN_NAMES)
    if attn is None:
        raise UnsupportedArchitecture(family, found, f"block {index} has no attention module")
    found.update({f"{an}.{k}": v for k, v in _children(attn).items()})
    mn, mlp = _get(blk, _MLP_NAMES)
    if mlp is None:
        mlp = blk  # OPT keeps fc1/fc2 on the block itself
    else:
        found.update({f"{mn}.{k}": v for k, v in _children(mlp).items()})
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
    _, attn_out = _get(attn, _OUT_PROJ_NAMES)
    if attn_out is None:
        raise UnsupportedArchitecture(family, found, f"block {index}: no attention output projection")
    H, Hkv, dh = _heads(config, family, attn)
    if linear_weight(attn_out).shape[1] != H * dh or H % Hkv:
        raise UnsupportedArchitecture(family, found, f"block {index}: attention output reads "
                                      f"{linear_weight(attn_out).shape[1]} features, expected {H}x{dh}")

    def qkv():
        if all(isinstance(getattr(attn, n, None), nn.Module) for n in ("q_proj", "k_proj", "v_proj")):
            ws = [linear_weight(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")]
            q = ws[0].reshape(H, dh, -1).transpose(1, 2)
            k = ws[1].reshape(Hkv, dh, -1).transpose(1, 2)
            v = ws[2].reshape(Hkv, dh, -1).transpose(1, 2)
            return q, k, v
        for n, split in (("c_attn", _split_concat), ("qkv_proj", _split_concat), ("W_pack", _split_concat),
                         ("query_key_value", _split_grouped)):
            m = getattr(attn, n, None)
            if isinstance(m, nn.Module):
                return split(linear_weight(m), H, Hkv, dh)
        raise UnsupportedArchitecture(family, found, f"block {index}: no q/k/v projections found")

    def qkv_bias():
        if all(isinstance(getattr(attn, n, None), nn.Module) for n in ("q_proj", "k_proj", "v_proj")):
            bs = [linear_bias(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")]
            return tuple(None if bb is None else bb.reshape(n, dh) for bb, n in zip(bs, (H, Hkv, Hkv)))
        for n, split in (("c_attn", _split_concat), ("qkv_proj", _split_concat), ("W_pack", _split_concat),
                         ("query_key_value", _split_grouped)):
            m = getattr(attn, n, None)
            if isinstance(m, nn.Module):
                bb = linear_bias(m)
                if bb is None:
                    return None, None, None
                q, k, v = split(bb[:, None], H, Hkv, dh)  # [n, 1, dh]
                return q[:, 0], k[:, 0], v[:, 0]
        return None, None, None

    # What the block does to each sublayer's output before the residual add.
    attn_post, mlp_post = PostTransform(), PostTransform()
    if isinstance(getattr(blk, "post_feedforward_layernorm", None), nn.Module):
        # gemma2 / gemma3 / olmo2: the sublayer outputs are normed, then added
        attn_post = PostTransform(norm=blk.post_attention_layernorm)
        mlp_post = PostTransform(norm=blk.post_feedforward_layernorm)
    mult = getattr(blk, "residual_multiplier", None)
    if isinstance(mult, (int, float)) and float(mult) != 1.0:
        attn_post = PostTransform(attn_post.norm, float(mult))
        mlp_post = PostTransform(mlp_post.norm, float(mult))
    additive, why = True, ""
    if getattr(config, "do_layer_norm_before", True) is False:
        additive, why = False, "post-LN blocks (do_layer_norm_before=False) norm the sum, not the updates"
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        additive, why = False, "the residual connection reads the normed stream"
    return BlockView(
        index=index, family=family, block=blk, parallel=_parallel(config, family), additive=additive,
        n_heads=H, n_kv_heads=Hkv, d_head=dh, attn=attn, attn_out=attn_out, mlp_in=up, mlp_gate=gate,
        mlp_out=down, act=_activation(family, config, mlp, blk), attn_post=attn_post, mlp_post=mlp_post,
        not_additive_reason=why, _qkv=qkv, _gate_up_split=gate_up_split, _qkv_bias=qkv_bias,
    )


def block_views(borders) -> list[BlockView]:
    """:func:`block_view` for every block, in order (raises on the first unsupported block)."""
    return [block_view(borders, i) for i in range(borders.n_layers)]


# ---------------------------------------------------------------------------------------------- capture
@dataclass
class BlockCapture:
    """Tensors recorded for one block during a forward pass, at the selected positions.

    Attributes (all [B, P, ·], cloned, in the model dtype):
        z: attention head outputs, the output projection's input [B, P, H·d_head].
        attn_raw: the output projection's output [B, P, d].
        attn: the attention's update to the residual stream, ``attn_post(attn_raw)`` [B, P, d].
        act: MLP activations, the down projection's input [B, P, d_ff].
        mlp_raw: the down projection's output [B, P, d].
        mlp: the MLP's update to the residual stream [B, P, d].
    """

    z: torch.Tensor | None = None
    attn_raw: torch.Tensor | None = None
    attn: torch.Tensor | None = None
    act: torch.Tensor | None = None
    mlp_raw: torch.Tensor | None = None
    mlp: torch.Tensor | None = None


@contextlib.contextmanager
def capture_updates(views: list[BlockView], batch_shape: tuple[int, int], positions: torch.Tensor | None = None
                    ) -> Iterator[list[BlockCapture]]:
    """Hooks that record each block's attention and MLP updates during one forward pass.

    Args:
        views: from :func:`block_views`.
        batch_shape: (B, T) of the input ids (OPT flattens its MLP input to [B·T, ·]).
        positions: [P] int64 positions to keep (all when None), to bound memory.

    Yields:
        One :class:`BlockCapture` per block, filled as the model runs. Outputs are cloned (falcon adds
        the attention output into the MLP output in place).

    Raises:
        UnsupportedArchitecture: after the pass, when a hook never ran (e.g. bloom with
            ``pretraining_tp > 1`` bypasses its ``dense`` module).
    """
    caps = [BlockCapture() for _ in views]
    handles = []

    def sel(x: torch.Tensor) -> torch.Tensor:
        x = x[0] if isinstance(x, (tuple, list)) else x
        if x.dim() == 2:
            x = x.reshape(*batch_shape, x.shape[-1])
        return (x if positions is None else x[:, positions]).detach().clone()

    for v, c in zip(views, caps):
        def attn_pre(_m, args, c=c):
            c.z = sel(args[0])

        def attn_post(_m, _a, out, c=c, v=v):
            c.attn_raw = sel(out)
            c.attn = v.attn_post(c.attn_raw)

        def mlp_pre(_m, args, c=c):
            c.act = sel(args[0])

        def mlp_post(_m, _a, out, c=c, v=v):
            c.mlp_raw = sel(out)
            c.mlp = v.mlp_post(c.mlp_raw)

        handles += [v.attn_out.register_forward_pre_hook(attn_pre), v.attn_out.register_forward_hook(attn_post),
                    v.mlp_out.register_forward_pre_hook(mlp_pre), v.mlp_out.register_forward_hook(mlp_post)]
    try:
        yield caps
    finally:
        for h in handles:
            h.remove()
    for v, c in zip(views, caps):
        if c.z is None or c.act is None:
            raise UnsupportedArchitecture(v.family, _children(v.block),
                                          f"block {v.index}: the attention or MLP output projection never ran")


# ---------------------------------------------------------------------------------------------- norms
@dataclass(frozen=True)
class NormLinearization:
    """A norm written at its actual input x as an affine map: ``norm(x) = scale ⊙ (x - centered·mean(x)) + bias``.

    ``scale = gain / sigma(x)`` holds the per-position scale the norm actually applied, so the map is
    exact at x and linear in x for that fixed scale (the approximation used by direct logit
    attribution: each part of x is read at the scale of the whole).

    Attributes:
        scale: [..., d] float32, gain divided by the actual RMS / standard deviation.
        gain: [d] float32, the norm's elementwise gain (gemma's ``1 + w`` included).
        bias: [d] float32 (zeros when the norm has none).
        centered: True for LayerNorm-style norms that subtract the mean.
        sigma: [..., 1] float32, the actual RMS / standard deviation (eps included; 1 without a norm).
        max_abs_error: max |affine map - norm(x)| at the actual input (a check).
    """

    scale: torch.Tensor
    gain: torch.Tensor
    bias: torch.Tensor
    centered: bool
    sigma: torch.Tensor
    max_abs_error: float

    def linear(self, u: torch.Tensor) -> torch.Tensor:
        """The linear part applied to a piece u [..., d] of the input (no bias)."""
        u = u.float()
        if self.centered:
            u = u - u.mean(-1, keepdim=True)
        return self.scale * u

    def readout(self, r: torch.Tensor) -> torch.Tensor:
        """Pull a row vector r [..., d] on the output back to the input: ``r·linear(u) == readout(r)·u``."""
        r = self.scale * r.float()
        if self.centered:
            r = r - r.mean(-1, keepdim=True)
        return r


def _norm_eps(norm: nn.Module) -> float:
    for n in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
        v = getattr(norm, n, None)
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0


def norm_gain(norm: nn.Module | None, d: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The elementwise gain [d], bias [d] (float32) and centering of an RMS or Layer norm, by probing it.

    The module is evaluated on three probe vectors (zeros, ones, alternating ±1); no family knowledge.
    ``None`` (no norm) gives gain 1, bias 0, not centered.
    """
    if norm is None:
        return torch.ones(d), torch.zeros(d), False
    w = next((p for p in norm.parameters()), None)
    dtype = w.dtype if w is not None else torch.float32
    dev = w.device if w is not None else torch.device("cpu")
    eps = _norm_eps(norm)
    with torch.no_grad():
        zeros = torch.zeros(1, d, dtype=dtype, device=dev)
        ones = torch.ones(1, d, dtype=dtype, device=dev)
        alt = torch.ones(1, d, dtype=torch.float32)
        alt[:, 1::2] = -1.0
        b = norm(zeros).float().cpu()[0]
        f1 = norm(ones).float().cpu()[0] - b
        fa = norm(alt.to(dev, dtype)).float().cpu()[0] - b
        centered = bool(f1.abs().max() <= 1e-3 * max(float(fa.abs().max()), 1e-12))
        pc = alt[0] - (alt[0].mean() if centered else 0.0)
        sigma = math.sqrt(float((pc ** 2).mean()) + eps)
        gain = fa * sigma / pc
    return gain, b, centered


def linearize_norm(norm: nn.Module | None, x: torch.Tensor) -> NormLinearization:
    """Write ``norm`` at its actual input x [..., d] as an affine map (see :class:`NormLinearization`).

    Works for RMSNorm (llama, gemma's ``1 + w``), LayerNorm with or without bias (gpt2, cohere) and
    None (identity). Float32 throughout.

    Raises:
        UnsupportedArchitecture: the norm is not of the form gain ⊙ (x - c·mean) / sigma + bias (the
            affine map misses the module's output by more than 1e-3 relative).
    """
    d = x.shape[-1]
    gain, bias, centered = norm_gain(norm, d)
    xf = x.float().cpu()
    if norm is None:
        return NormLinearization(scale=torch.ones_like(xf), gain=gain, bias=bias, centered=False,
                                 sigma=torch.ones(*xf.shape[:-1], 1), max_abs_error=0.0)
    eps = _norm_eps(norm)
    xc = xf - xf.mean(-1, keepdim=True) if centered else xf
    sigma = torch.sqrt((xc ** 2).mean(-1, keepdim=True) + eps)
    lin = NormLinearization(scale=gain / sigma, gain=gain, bias=bias, centered=centered, sigma=sigma,
                            max_abs_error=0.0)
    w = next((q for q in norm.parameters()), None)
    with torch.no_grad():
        actual = norm(x.to(w.device) if w is not None else x).float().cpu()
    approx = lin.linear(xf) + bias
    err = float((approx - actual).abs().max())
    if err > 1e-3 * max(float(actual.abs().max()), 1.0):
        raise UnsupportedArchitecture(type(norm).__name__, [type(norm).__name__],
                                      f"the norm is not an RMS/Layer norm (affine fit misses by {err:.3g})")
    return NormLinearization(scale=lin.scale, gain=gain, bias=bias, centered=centered, sigma=sigma,
                             max_abs_error=err)
