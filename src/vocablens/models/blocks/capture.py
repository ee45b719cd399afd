"""Recording each block's attention and MLP updates during one forward pass (hooks, no model edits)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from vocablens.errors import UnsupportedArchitecture
from vocablens.models.blocks.view import BlockView
from vocablens.models.find import named_children


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
    from vocablens.models.hooks import ModelPatch

    patch = ModelPatch()  # undone in the finally below, also when installing one of the hooks fails

    def sel(x: torch.Tensor) -> torch.Tensor:
        x = x[0] if isinstance(x, (tuple, list)) else x
        if x.dim() == 2:
            x = x.reshape(*batch_shape, x.shape[-1])
        return (x if positions is None else x[:, positions]).detach().clone()

    try:
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

            patch.pre_hook(v.attn_out, attn_pre)
            patch.post_hook(v.attn_out, attn_post)
            patch.pre_hook(v.mlp_out, mlp_pre)
            patch.post_hook(v.mlp_out, mlp_post)
        yield caps
    finally:
        patch.close()
    for v, c in zip(views, caps):
        if c.z is None or c.act is None:
            raise UnsupportedArchitecture(v.family, named_children(v.block),
                                          f"block {v.index}: the attention or MLP output projection never ran")
