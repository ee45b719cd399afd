"""Where a transformers causal LM keeps its decoder and blocks, and config values under their
several names; no family is named here (the lookups are by module and attribute names)."""

from __future__ import annotations

from torch import nn

_BLOCK_NAMES = ("layers", "h", "blocks", "block", "decoder_layers")


def named_children(mod: nn.Module) -> dict[str, str]:
    """child name -> class name (what an :class:`~vocablens.errors.UnsupportedArchitecture` lists)."""
    return {n: type(m).__name__ for n, m in mod.named_children()}


def find_decoder(model: nn.Module) -> nn.Module:
    """The module that holds the blocks (``model.model``, ``transformer``, ``gpt_neox``, ``model.decoder``)."""
    cand: list[nn.Module] = []
    for getter in ("get_decoder",):
        fn = getattr(model, getter, None)
        if callable(fn):
            try:
                dec = fn()
            except Exception:
                dec = None
            if isinstance(dec, nn.Module) and dec is not model:
                cand.append(dec)
    base = getattr(model, "base_model", None)
    if isinstance(base, nn.Module) and base is not model:
        cand.append(base)
        dec = getattr(base, "decoder", None)
        if isinstance(dec, nn.Module):
            cand.insert(0, dec)
    for c in cand:
        if any(isinstance(getattr(c, n, None), nn.ModuleList) for n in _BLOCK_NAMES):
            return c
    return cand[0] if cand else model


def find_blocks(decoder: nn.Module, n_layers: int | None) -> nn.ModuleList | None:
    """The decoder's list of blocks (by name, else the ``ModuleList`` of ``n_layers`` entries), or None."""
    for n in _BLOCK_NAMES:
        m = getattr(decoder, n, None)
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            return m
    lists = [m for m in decoder.children() if isinstance(m, nn.ModuleList)]
    if n_layers:
        lists = [m for m in lists if len(m) == n_layers] or lists
    return max(lists, key=len) if lists else None


def config_value(config, *names, default=None):
    """The first of ``names`` that the config sets (not None), else ``default``: families name the
    same thing differently (``hidden_size`` / ``n_embd`` / ``d_model``)."""
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def first_child(mod: nn.Module, names) -> tuple[str | None, nn.Module | None]:
    """``(name, module)`` of the first of ``names`` that is a submodule attribute of ``mod``, else ``(None, None)``."""
    for n in names:
        m = getattr(mod, n, None)
        if isinstance(m, nn.Module):
            return n, m
    return None, None
