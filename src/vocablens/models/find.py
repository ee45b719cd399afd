"""Where a transformers causal LM keeps its decoder and blocks, and config values under their
several names; no family is named here.

The blocks are found by structure (:func:`block_lists`): the outermost lists of repeated blocks,
nearest first to the token embedding in the module tree, so a text model inside a composite model
(Llama 4, Gemma 3, a vision-language model's language model) is found whatever its attributes are
called, and its vision tower's blocks are not taken for it; a whole load confirms the list by a probe
forward (:func:`vocablens.models.readout.find_readout`).
"""

from __future__ import annotations

from torch import nn


def named_children(mod: nn.Module) -> dict[str, str]:
    """child name -> class name (what an :class:`~vocablens.errors.UnsupportedArchitecture` lists)."""
    return {n: type(m).__name__ for n, m in mod.named_children()}


def _is_block_list(ml: nn.Module) -> bool:
    """A non-empty ``nn.ModuleList`` of modules that hold weights and are not torch's own layers
    (blocks with sublayers, or placeholders for blocks not read; not a list of single linear maps)."""
    return isinstance(ml, nn.ModuleList) and len(ml) > 0 and all(
        not isinstance(e, (nn.ModuleList, nn.ModuleDict)) and next(e.parameters(), None) is not None
        and (next(e.children(), None) is not None or not type(e).__module__.startswith("torch.nn"))
        for e in ml)


def _parts(path: str) -> list[str]:
    return path.split(".") if path else []


def _shared(a: str, b: str) -> int:
    """How many leading path components ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(_parts(a), _parts(b)):
        if x != y:
            break
        n += 1
    return n


def input_embedding_of(model: nn.Module) -> nn.Module | None:
    """``model.get_input_embeddings()``, or None where the model has none (or it raises)."""
    fn = getattr(model, "get_input_embeddings", None)
    try:
        emb = fn() if callable(fn) else None
    except Exception:  # noqa: BLE001  (a composite model without one: none found)
        return None
    return emb if isinstance(emb, nn.Module) else None


def block_lists(model: nn.Module, n_layers: int | None = None) -> list[tuple[str, nn.ModuleList]]:
    """Every list of repeated blocks in ``model`` (path, list), outermost only (a list of experts
    inside a block is not one), best first: nearest to the token embedding in the module tree (the
    text model of a composite model, not its vision tower), then ``n_layers`` entries, then the most
    weights. Structure only: no module or attribute name is looked up."""
    emb = input_embedding_of(model)
    paths = {id(m): p for p, m in model.named_modules()}
    epath = paths.get(id(emb), "") if emb is not None else ""
    eparent = ".".join(_parts(epath)[:-1])
    lists = [(p, m) for p, m in model.named_modules() if _is_block_list(m)]
    outer = [(p, m) for p, m in lists if not any(p != q and p.startswith(q + ".") for q, _ in lists)]

    def rank(item):
        p, m = item
        near = _shared(".".join(_parts(p)[:-1]), eparent) if emb is not None else 0
        return (near, n_layers is not None and len(m) == n_layers, sum(t.numel() for t in m.parameters()))

    return sorted(outer, key=rank, reverse=True)


def decoder_of(model: nn.Module, blocks_path: str) -> nn.Module:
    """The module that holds both the token embedding and the blocks at ``blocks_path`` (their nearest
    common ancestor: ``model.model``, ``transformer``, ``model.decoder``, a composite model's
    ``model.language_model``), where families keep the final norm, input scale and ``project_in``."""
    emb = input_embedding_of(model)
    paths = {id(m): p for p, m in model.named_modules()}
    parent = _parts(blocks_path)[:-1]
    if emb is not None and id(emb) in paths:
        parent = parent[: _shared(".".join(parent), ".".join(_parts(paths[id(emb)])[:-1]))]
    return model.get_submodule(".".join(parent)) if parent else model


def find_stream(model: nn.Module, n_layers: int | None = None) -> tuple[nn.Module, nn.ModuleList | None]:
    """``(decoder, blocks)`` found by structure (:func:`block_lists`, :func:`decoder_of`); blocks None
    when the model holds no list of blocks. A whole load confirms the choice by a probe forward
    (:func:`vocablens.models.readout.find_readout`)."""
    lists = block_lists(model, n_layers)
    if not lists:
        return model, None
    return decoder_of(model, lists[0][0]), lists[0][1]


def find_decoder(model: nn.Module) -> nn.Module:
    """The module that holds the blocks and the token embedding (:func:`find_stream`)."""
    return find_stream(model, text_config_value(model, "num_hidden_layers", "n_layer", "num_layers"))[0]


def text_config(model_or_config):
    """The config of the text model: ``get_text_config(decoder=True)`` of a composite config (Llama 4,
    Gemma 3, LLaVA: the ``text_config``), else the config itself; None without one."""
    cfg = getattr(model_or_config, "config", None) if isinstance(model_or_config, nn.Module) else model_or_config
    fn = getattr(cfg, "get_text_config", None)
    if callable(fn):
        try:
            return fn(decoder=True) or cfg
        except Exception:  # noqa: BLE001  (a config that cannot say: its own values)
            return cfg
    return cfg


def text_config_value(model_or_config, *names, default=None):
    """:func:`config_value` of :func:`text_config`."""
    cfg = text_config(model_or_config)
    return config_value(cfg, *names, default=default) if cfg is not None else default


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
