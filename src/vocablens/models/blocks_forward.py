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

from vocablens.errors import BadInput, NonFiniteActivations, UnsupportedArchitecture
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
    check_ids_fit(input_ids, borders.vocab_size)  # V, also on a vocab-parallel rank (W_E emptied)
    held = getattr(borders.model, "vocablens_streamed", False) or getattr(borders.model, "hf_device_map", None)
    if not held and any(p.is_meta for p in borders.blocks.parameters()):  # offloaded blocks: accelerate reads them
        raise BadInput("this model was loaded with its borders only (no blocks): load it whole for a "
                       "forward pass")
    borders.check_finite(input_ids)
    return input_ids


def nonfinite_message(borders, where: str) -> str:
    """The one line for inf or NaN found at ``where`` (``"layer 2 of the residual stream (block 1's
    output)"``): in half precision, the dtype's largest finite value and the way out."""
    dt = borders.W_E.dtype
    if dt in (torch.float16, torch.bfloat16):
        return (f"{where} holds inf or NaN: {str(dt).replace('torch.', '')} holds at most "
                f"{torch.finfo(dt).max:,.0f}; run the model in float32 (`dtype` float32)")
    return f"{where} holds inf or NaN (the weights are finite: the computation overflowed)"


def check_stream_finite(borders, resid: torch.Tensor, logits: torch.Tensor | None = None,
                        attention_mask: torch.Tensor | None = None) -> None:
    """Refuse a residual stream [L+1, B, T, d] (layer 0 = embedding output) or a model's logits
    [B, T, V] that hold inf or NaN, naming the first such layer: no figure is read from them.
    ``attention_mask`` [B, T]: only its positions of 1 are checked (padding is read by no one).

    Raises:
        NonFiniteActivations: the first non-finite layer (block i-1's output for layer i), or the
            logits when every layer is finite.
    """
    pad = None  # [B, T] True at padding (read by no one), when the mask fits
    if attention_mask is not None and resid.dim() == 4 and tuple(attention_mask.shape) == tuple(resid.shape[1:3]):
        pad = ~attention_mask.to(resid.device).bool()

    def finite(x: torch.Tensor) -> bool:  # x [B, T, n]; a bool per position, never a copy of x
        ok = torch.isfinite(x).all(dim=-1)
        return bool((ok | pad.to(ok.device)).all()) if pad is not None and ok.shape == pad.shape else bool(ok.all())

    for i in range(resid.shape[0]):  # layer by layer: the check holds one layer's flags at a time
        if not finite(resid[i]):
            what = "the embedding output" if i == 0 else f"block {i - 1}'s output"
            raise NonFiniteActivations(nonfinite_message(borders, f"layer {i} of the residual stream ({what})"))
    if logits is not None and not finite(logits):
        raise NonFiniteActivations(nonfinite_message(borders, "the model's logits (after the final norm and the head)"))


def locate_nonfinite(borders, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
    """Run the forward again capturing every layer and raise :class:`NonFiniteActivations` naming the
    first layer that holds inf or NaN (for a path that saw them only at its end); returns when the
    capture finds none."""
    borders.residual_stream(input_ids, attention_mask)


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
        NonFiniteActivations: a layer holds inf or NaN (a float16 stream past 65,504), named.
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
    if all_layers:
        resid = torch.stack([got[i].to(borders.read_device) for i in want])  # read where the head is
        check_stream_finite(borders, resid, attention_mask=attention_mask)
        return resid
    last = got[L] if attention_mask is None else got[L][attention_mask.to(got[L].device).bool()]
    if not bool(torch.isfinite(last).all()):
        locate_nonfinite(borders, input_ids, attention_mask)  # names the first layer that overflowed
        raise NonFiniteActivations(nonfinite_message(borders, f"layer {L} of the residual stream (block {L - 1}'s output)"))
    return got[L]


__all__ = ["blocks_forward", "check_forward_input", "check_stream_finite", "locate_nonfinite", "nonfinite_message"]
