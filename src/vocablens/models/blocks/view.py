"""The uniform view of one decoder block (:class:`BlockView`) and the linear-module helpers it uses.

``BlockView`` exposes the checkpoint's own tensors (no copies, no folding): the MLP's key, gate and
value vectors, the attention's per-head projections, and where the block's updates can be hooked.
:func:`~vocablens.models.blocks.mapping.block_view` builds one for any supported family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

def _is_conv1d(mod: nn.Module) -> bool:
    return type(mod).__name__ == "Conv1D"


def linear_weight(mod: nn.Module) -> torch.Tensor:
    """The weight of a linear-like module as ``[out, in]`` (transformers' ``Conv1D`` stores ``[in, out]``);
    a module a device map offloaded: its stored weight (:func:`vocablens.models.files.offload.held`); a quantized
    weight read dequantized (:func:`vocablens.models.quantized_weights.dequantized`)."""
    from vocablens.models.files.offload import held
    from vocablens.models.quantized_weights import dequantized

    w = dequantized(held(mod, "weight"))
    return w.t() if _is_conv1d(mod) else w


def linear_bias(mod: nn.Module) -> torch.Tensor | None:
    from vocablens.models.files.offload import held

    b = held(mod, "bias")
    return b if isinstance(b, torch.Tensor) else None


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
