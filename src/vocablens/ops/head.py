"""The LM head where it is needed: logits for the last (or chosen) positions only.

Generation needs the next-token distribution of the last position only, so inference engines
apply the head to ``hidden[:, -1]`` before the GEMM (vLLM's ``logits_indices = query_start_loc[1:] - 1``;
transformers' ``logits_to_keep``): T-1 of T head GEMMs saved during prefill.
"""

from __future__ import annotations

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import transform_logits
from vocablens.ops._checks import INT_DTYPES, check_head, check_head_transform, check_int


def _int_positions(positions):
    """Positions as ints or an integer tensor (a float, bool or str is a BadInput, not a silent truncation)."""
    if isinstance(positions, torch.Tensor):
        if positions.dtype not in INT_DTYPES:
            raise BadInput(f"positions must hold integers; got a {positions.dtype} tensor")
        return positions
    if isinstance(positions, (list, tuple)):
        return [check_int("positions", p) for p in positions]
    return check_int("positions", positions)


def lm_head_last(hidden: torch.Tensor, W_U: torch.Tensor, bias: torch.Tensor | None = None,
                 softcap: float | None = None, positions: torch.Tensor | list[int] | None = None, *,
                 attention_mask: torch.Tensor | None = None, logit_scale: float = 1.0) -> torch.Tensor:
    """Float32 logits at the last position of each row, or at given positions.

    Args:
        hidden: [B, T, d] (or [T, d], treated as B=1) normed hidden states.
        W_U: [V, d] unembedding, same dtype as hidden. bias: [V] or None.
        softcap: final-logit softcap c or None; logit_scale: factor before it (both applied by
            :func:`vocablens.logit_transform.transform_logits`).
        positions: None (the last position, or the last attended one per row when
            ``attention_mask`` is given), a list/1-D tensor of positions shared by every row (negative
            counts from the end), or a [B] tensor with one position per row.
        attention_mask: [B, T] 0/1; with positions=None picks each row's last attended token
            (right padding) — with left padding the last position is already the last token.

    Returns:
        [B, V] float32 (one position per row) or [B, P, V] for a list of P shared positions.

    Raises:
        ShapeMismatch: d / dtype / mask shape disagree.
        BadInput: empty sequence, position not an integer or out of [-T, T), a row with no attended
            token, bad logit_scale / softcap.
    """
    check_head(hidden, W_U, bias)
    logit_scale, softcap = check_head_transform(logit_scale, softcap)
    if hidden.dim() == 2:
        hidden = hidden[None]
        if attention_mask is not None and attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
    if hidden.dim() != 3:
        raise ShapeMismatch(f"hidden must be [B, T, d] or [T, d]; got {tuple(hidden.shape)}")
    B, T, _ = hidden.shape
    if B == 0 or T == 0:
        raise BadInput(f"hidden {tuple(hidden.shape)} is empty: no positions to read")
    rows = torch.arange(B, device=hidden.device)
    if positions is None:
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, T):
                raise ShapeMismatch(f"attention_mask {tuple(attention_mask.shape)} must be [B, T]=({B}, {T})")
            m = attention_mask.to(torch.bool)
            if not bool(m.any(1).all()):
                raise BadInput("attention_mask has a row with no attended token")
            idx = torch.arange(T, device=hidden.device).expand(B, T)
            last = torch.where(m, idx, torch.full_like(idx, -1)).amax(1)
            sel = hidden[rows, last]
        else:
            sel = hidden[:, -1]
    else:
        pos = torch.as_tensor(_int_positions(positions), dtype=torch.int64, device=hidden.device)
        if pos.numel() == 0:
            raise BadInput("positions is empty")
        if bool(((pos < -T) | (pos >= T)).any()):
            raise BadInput(f"positions {pos.tolist()} outside [-{T}, {T}) for hidden {tuple(hidden.shape)}")
        pos = pos % T
        if pos.dim() == 1 and pos.numel() == B and isinstance(positions, torch.Tensor) and B > 1:
            sel = hidden[rows, pos]
        elif pos.dim() == 0:
            sel = hidden[:, int(pos)]
        else:
            sel = hidden[:, pos]  # [B, P, d]
    return transform_logits(torch.nn.functional.linear(sel, W_U, bias).float(), logit_scale, softcap)
