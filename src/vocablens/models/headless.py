"""The model's blocks without its LM head: the residual stream of a forward pass stopped after the last block.

``model(ids)`` ends in the final norm and the LM head, i.e. [B, T, V] float32 logits (805 MB at
T = 4,096 and V = 49,152) that a caller reading the head on the chunked path
(:func:`vocablens.ops.token_logprobs`) would throw away. :func:`blocks_forward` runs the same forward
with a hook on the last block that records its output and stops the pass there (an exception caught
here), so neither the final norm nor the head runs, and only the layers asked for are kept.

Layer 1: knows the model (its blocks, through :class:`~vocablens.models.Borders`).
"""

from __future__ import annotations

import torch

from vocablens.errors import BadInput, UnsupportedArchitecture
from vocablens.models.hooks import ModelPatch
from vocablens.models.tokens import check_ids_fit


class _Stop(Exception):
    """Raised by the hook on the last block: the rest of the forward (final norm, head) does not run."""


def check_forward_input(borders, input_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids`` as [B, T] after the checks every forward of vocablens passes first
    (:meth:`Borders.residual_stream`, :func:`blocks_forward`).

    Raises:
        BadInput: empty input, a borders-only load. TokenNotInVocabulary (a BadInput): a token id
            with no row in the embedding (:func:`~vocablens.models.tokens.check_ids_fit`).
        NonFiniteWeights: a weight the forward would read holds NaN or inf.
    """
    if input_ids.numel() == 0:
        raise BadInput("empty input: no tokens to run")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    check_ids_fit(input_ids, borders.W_E.shape[0])
    if not getattr(borders.model, "vocablens_streamed", False) and any(p.is_meta for p in borders.blocks.parameters()):
        raise BadInput("this model was loaded with its borders only (no blocks): load it whole for a "
                       "forward pass")
    borders.check_finite(input_ids)
    return input_ids


def blocks_forward(borders, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   all_layers: bool = False) -> torch.Tensor:
    """Run the model's blocks on ``input_ids`` and stop after the last one (no final norm, no LM head).

    Args:
        borders: a :class:`~vocablens.models.Borders` of a fully loaded (or streamed) model.
        input_ids: [B, T] (or [T]) int64. attention_mask: [B, T] or None.
        all_layers: keep every stream layer 0..L (as :meth:`Borders.residual_stream`), else only layer L.

    Returns:
        layer L, the last block's output before the final norm, [B, T, d_model] in the model's dtype;
        with ``all_layers``, [L+1, B, T, d_model] (layer 0 = input of block 0). The same tensors as
        ``borders.residual_stream(ids)[0]`` (the forward is the same up to the last block).

    Raises:
        BadInput / NonFiniteWeights: as :func:`check_forward_input`.
        UnsupportedArchitecture: a layer's hook never ran.
    """
    input_ids = check_forward_input(borders, input_ids)
    L = borders.n_layers

    def stop(_mod, _args, output):
        store[L] = output[0] if isinstance(output, (tuple, list)) else output
        raise _Stop

    import contextlib

    ctx = borders.capture() if all_layers else contextlib.nullcontext({})
    with ctx as store:  # only layer L is kept unless every layer is asked for
        with ModelPatch() as patch:  # after capture's own hook on that block; taken off again
            patch.post_hook(borders.blocks[-1], stop)
            try:
                borders.model(input_ids=input_ids.to(borders.device), attention_mask=attention_mask, use_cache=False)
            except _Stop:
                pass
        got = dict(store)
    want = range(L + 1) if all_layers else (L,)
    missing = [i for i in want if i not in got]
    if missing:
        from vocablens.models.find import named_children

        raise UnsupportedArchitecture(borders.family, named_children(borders.model),
                                      f"residual stream not captured at layers {missing}")
    return torch.stack([got[i] for i in want]) if all_layers else got[L]


__all__ = ["blocks_forward", "check_forward_input"]
