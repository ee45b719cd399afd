"""Weights of a block that a device map offloaded (to CPU memory behind a GPU, or to disk), read as tensors.

accelerate keeps an offloaded module's parameters on ``meta`` and reads them from its store (a
CPU state dict or the checkpoint's safetensors files) into the device that runs the module at each of
its forwards. A forward therefore needs nothing of vocablens; an analysis that reads a block's weights
directly (value vectors, attention heads, a norm's gain) reads them through :func:`held`, which returns
the module's own tensor when it is real and the stored one, on the device that runs the module,
when it is offloaded (read from the store at each call: nothing stays resident).

Layer 1 (models): knows accelerate's hook attributes; analyses see plain tensors.
"""

from __future__ import annotations

import torch
from torch import nn


def _offload_hook(mod: nn.Module):
    """The module's accelerate hook that holds its weights elsewhere, or None."""
    hook = getattr(mod, "_hf_hook", None)
    for h in [hook, *getattr(hook, "hooks", ())]:
        if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None:
            return h
    return None


def held(mod: nn.Module, name: str = "weight") -> torch.Tensor | None:
    """``mod``'s tensor ``name`` (None when it has none): itself when real, else (offloaded by a
    device map) a copy read from accelerate's store onto the device that runs ``mod``, in the dtype
    the model runs in. Never written back: a write to it changes nothing in the model."""
    t = getattr(mod, name, None)
    if not isinstance(t, torch.Tensor) or not t.is_meta:
        return t
    hook = _offload_hook(mod)
    if hook is None:
        return t
    try:
        v = hook.weights_map[name]
    except KeyError:
        return t
    dev = getattr(hook, "execution_device", None)
    return v.to(device=dev if dev is not None else v.device, dtype=t.dtype)


def runs_on(mod: nn.Module) -> torch.device:
    """The device that runs ``mod``: that of its first real tensor, or for an offloaded module the
    device its hook brings the weights to (CPU when it has neither)."""
    for t in [*mod.parameters(), *mod.buffers()]:
        if not t.is_meta:
            return t.device
    hook = _offload_hook(mod)
    dev = getattr(hook, "execution_device", None) if hook is not None else None
    return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}") if dev is not None else torch.device("cpu")


__all__ = ["held", "runs_on"]
