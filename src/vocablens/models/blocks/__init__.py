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

Modules: :mod:`.view` (``BlockView``, ``linear_weight``), :mod:`.mapping` (``block_view``), :mod:`.capture`
(``capture_updates``), :mod:`.norms` (``norm_gain``, ``linearize_norm``).
"""

from vocablens.models.blocks.capture import BlockCapture, capture_updates
from vocablens.models.blocks.mapping import block_view, block_views
from vocablens.models.blocks.norms import NormLinearization, linearize_norm, norm_gain
from vocablens.models.blocks.view import BlockView, PostTransform, linear_bias, linear_weight

__all__ = [
    "BlockCapture", "BlockView", "NormLinearization", "PostTransform", "block_view", "block_views",
    "capture_updates", "linear_bias", "linear_weight", "linearize_norm", "norm_gain",
]
