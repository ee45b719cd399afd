"""The residual stream kept in the autograd graph, rooted at one layer (a leaf there): what the
Jacobian lens's fit (:mod:`vocablens.lens.jacobian_fit`) and the backward lens
(:mod:`vocablens.lens.backward`) differentiate.

- :func:`stream_graph`: the whole sequence, and the model's own logits, in the graph.
- :func:`suffix_graph`: only positions ``start ..`` in the graph (the earlier ones run first,
  without grad, into the model's key/value cache), and no head: exact for every source position
  >= ``start`` by causality, and ``start`` of T positions cheaper in every backward pass.
- :func:`frozen`: the parameters' ``requires_grad`` off for the block (no weight gradient is
  formed), put back afterwards.

Everything installed on the model goes through :class:`~vocablens.models.hooks.ModelPatch`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from vocablens.models import Borders


@contextlib.contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """Parameters' ``requires_grad`` set to False for the block, each flag put back afterwards."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


def _output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def stream_graph(borders: Borders, ids: torch.Tensor, root: int, keep: Sequence[int]) -> dict[int, torch.Tensor]:
    """One forward of ``ids`` [N, T] with the stream at layer ``root`` made a leaf that requires grad;
    returns ``{layer: [N, T, d]}`` for the layers in ``keep`` (each >= root) and L, in the graph, and
    ``store["logits"]``: the model's own logits [N, T, V] (in the graph too)."""
    from vocablens.models.hooks import ModelPatch

    store: dict = {}
    wanted = set(keep) | {borders.n_layers}

    def make_leaf(x: torch.Tensor) -> torch.Tensor:
        return x.detach().requires_grad_(True)

    def pre_root(_mod, args, kwargs):
        if args:
            leaf = make_leaf(args[0])
            store[0] = leaf
            return (leaf, *args[1:]), kwargs
        leaf = make_leaf(kwargs["hidden_states"])
        store[0] = leaf
        return args, {**kwargs, "hidden_states": leaf}

    def make_post(i: int):
        def post(_mod, _args, output):
            if i == root:
                leaf = make_leaf(_output(output))
                store[i] = leaf
                return (leaf, *output[1:]) if isinstance(output, tuple) else leaf
            if i in wanted:
                store[i] = _output(output)
            return None

        return post

    with ModelPatch() as patch, torch.enable_grad():
        if root == 0:
            patch.pre_hook(borders.blocks[0], pre_root, with_kwargs=True)
        for i, blk in enumerate(borders.blocks, start=1):
            if i >= root:
                patch.post_hook(blk, make_post(i))
        out = borders.model(input_ids=ids.to(borders.device), use_cache=False)
    store["logits"] = out.logits
    return store


def _cache_kwarg(model: torch.nn.Module) -> str | None:
    """The name under which ``model``'s forward takes a key/value cache (``cache`` in transformers 5,
    ``past_key_values`` before), or None when it takes none."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in ("cache", "past_key_values") if n in params), None)


class _Stop(Exception):
    """Raised after the last block: the final norm and the LM head are not run (not differentiated)."""


def suffix_graph(borders: Borders, ids: torch.Tensor, root: int, keep: Sequence[int],
                 start: int) -> dict[int, torch.Tensor]:
    """The stream of positions ``start .. T-1`` of ``ids`` [N, T] in the graph, rooted at layer ``root``
    (a leaf there): ``{layer: [N, T - start, d]}`` for the layers in ``keep`` and L.

    Positions ``0 .. start-1`` run first, without grad, into the model's key/value cache; the rest
    then runs on that cache. By causality h_m[q] depends on h_l[p] only for q >= p, so for sources
    p >= start the earlier positions are constants at every layer: the Jacobian terms are the same,
    and the backward passes skip ``start`` of T positions. Falls back to the whole sequence
    (``start`` = 0) when the model's forward takes no cache. The head is never run.
    """
    from transformers import DynamicCache

    from vocablens.models.hooks import ModelPatch

    name = _cache_kwarg(borders.model)
    if name is None or start <= 0:
        start, extra = 0, {"use_cache": False}
    else:
        cache = DynamicCache(config=borders.model.config)
        with torch.no_grad(), ModelPatch() as patch:
            patch.post_hook(borders.blocks[-1], _raise_stop)
            with contextlib.suppress(_Stop):
                borders.model(input_ids=ids[:, :start].to(borders.device), **{name: cache}, use_cache=True)
        extra = {name: cache, "use_cache": True}
    store: dict[int, torch.Tensor] = {}
    wanted = set(keep) | {borders.n_layers}

    def make_post(i: int):
        def post(_mod, _args, output):
            h = _output(output)
            if i == root:  # root < L
                h = h.detach().requires_grad_(True)
                store[i] = h
                return (h, *output[1:]) if isinstance(output, tuple) else h
            if i in wanted:
                store[i] = h
            if i == borders.n_layers:
                raise _Stop
            return None

        return post

    with ModelPatch() as patch, torch.enable_grad():
        if root == 0:
            patch.pre_hook(borders.blocks[0], _pre_root(store), with_kwargs=True)
        for i, blk in enumerate(borders.blocks, start=1):
            if i >= root:
                patch.post_hook(blk, make_post(i))
        with contextlib.suppress(_Stop):
            borders.model(input_ids=ids[:, start:].to(borders.device), **extra)
    return store


def _raise_stop(*_args) -> None:
    raise _Stop


def _pre_root(store: dict):
    def pre_root(_mod, args, kwargs):
        if args:
            leaf = args[0].detach().requires_grad_(True)
            store[0] = leaf
            return (leaf, *args[1:]), kwargs
        leaf = kwargs["hidden_states"].detach().requires_grad_(True)
        store[0] = leaf
        return args, {**kwargs, "hidden_states": leaf}

    return pre_root


__all__ = ["frozen", "stream_graph", "suffix_graph"]
