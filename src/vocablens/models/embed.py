"""The embedding: token ids -> residual stream, as one object every path that reads the input side takes.

token embedding W_E [V, d_emb] -> input scale -> input norm -> project_in -> (+ learned positions)
-> block 0. :class:`Embedding` holds those pieces for any family (built by
:meth:`Embedding.from_borders`, beside :class:`~vocablens.models.unembed.Unembedding`), found by module
and attribute names, never by a list of families. Where each family keeps them (transformers'
modeling code):

* input scale inside the embedding module: a buffer ``embed_scale`` multiplied in the module's own
  dtype (Gemma, Gemma 2, Gemma 3, VaultGemma: sqrt(hidden_size); MiniCPM3: ``scale_emb``), or a Python
  number (BioGPT, XGLM: sqrt(d) when ``scale_embedding``);
* input scale on the decoder, applied after the lookup: ``embedding_multiplier`` (Granite, GraniteMoE,
  Falcon-H1, HyperCLOVA X), ``embedding_scale`` (HRM-Text), the buffer ``normalizer`` (RecurrentGemma:
  sqrt(d) stored in bfloat16, cast to the stream's dtype);
* a norm of the embedding rows before block 0: ``word_embeddings_layernorm`` (BLOOM);
* ``project_in``: OPT's linear map d_emb -> d_model when ``word_embed_proj_dim != hidden_size``;
* learned absolute positions, added after all of the above: ``wpe`` (GPT-2, GPT-Neo, GPTBigCode),
  ``embed_positions`` (OPT). :meth:`Embedding.lookup` is the token part; block 0 reads it plus the
  position rows. Rotary and ALiBi families add nothing here.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vocablens.errors import BadInput
from vocablens.models.find import config_value, find_decoder

_OUTSIDE_SCALES = ("embedding_multiplier", "embedding_scale", "normalizer")
_INPUT_NORMS = ("word_embeddings_layernorm",)
_POSITIONS = ("wpe", "embed_positions")


def input_scale(embedding: nn.Module, decoder: nn.Module | None, config: Any = None
                ) -> tuple[float, bool, Any]:
    """The factor the model multiplies token-embedding rows by, where it is applied, and how.

    Args:
        embedding: the token embedding module (its weight W_E [V, d_emb]).
        decoder: the module that holds the blocks (where Granite keeps ``embedding_multiplier``), or None.
        config: the model's config (``embedding_multiplier`` when the decoder does not hold it), or None.

    Returns:
        ``(scale, in_module, factor)``: ``scale`` the value as the model multiplies by it (a buffer:
        rounded to W_E's dtype as the module casts it; a Python number: as is); NaN on a meta-device
        module (no value to read); 1.0 when the family has none. ``in_module``: whether the embedding
        module's own forward applies it. ``factor``: what to multiply the module's output by when it
        does not (a Python float, or the model's buffer, cast to the output's dtype at use), else None.
    """
    buf = getattr(embedding, "embed_scale", None)
    W = embedding.weight
    if isinstance(buf, torch.Tensor):
        if buf.is_meta:
            return float("nan"), True, None
        return float(buf.to(W.dtype)), True, None
    if isinstance(buf, (int, float)) and not isinstance(buf, bool):
        return float(buf), True, None
    for name in _OUTSIDE_SCALES:
        v = getattr(decoder, name, None) if decoder is not None else None
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            if v.is_meta:
                return float("nan"), False, None
            return float(v.to(W.dtype)), False, v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v), False, (float(v) if float(v) != 1.0 else None)
    m = getattr(config, "embedding_multiplier", None)  # Granite's; one name, no family spells it otherwise
    if m is not None and float(m) != 1.0:
        return float(m), False, float(m)
    return 1.0, False, None


def _module_named(decoder: nn.Module | None, names: tuple[str, ...]) -> nn.Module | None:
    for n in names:
        m = getattr(decoder, n, None) if decoder is not None else None
        if isinstance(m, nn.Module):
            return m
    return None


@dataclass(frozen=True, eq=False)
class Embedding:
    """The token embedding of one model and the path from it into the residual stream.

    Attributes:
        module: the model's token embedding module (its forward applies an in-module input scale).
        weight: W_E [V, d_emb], the module's own parameter (no copy, no scale; tied models share it
            with W_U).
        scale: the input scale as the model multiplies by it (Gemma: sqrt(d_model) rounded to W_E's
            dtype; Granite: ``embedding_multiplier``; 1.0 for most families; NaN when unknown, on a
            model without values).
        scale_in_module: whether ``module``'s forward applies ``scale`` itself.
        factor: what the model multiplies ``module``'s output by after it (a Python float or the
            model's own scalar buffer), or None.
        input_norm: a norm of the embedding rows before block 0 (BLOOM), or None.
        project_in: OPT-style projection d_emb -> d_model before block 0, or None.
        positions: the learned absolute position embedding the model adds before block 0 (GPT-2's
            ``wpe``, OPT's ``embed_positions``), or None; never applied here.
        d_model: width of the residual stream (differs from d_emb when project_in exists).
    """

    module: nn.Module
    weight: torch.Tensor
    scale: float = 1.0
    scale_in_module: bool = False
    factor: Any = None
    input_norm: nn.Module | None = None
    project_in: nn.Module | None = None
    positions: nn.Module | None = None
    d_model: int | None = None

    @classmethod
    def from_model(cls, model: nn.Module, embedding: nn.Module | None = None, decoder: nn.Module | None = None,
                   config: Any = None, d_model: int | None = None) -> "Embedding":
        """The embedding of a transformers causal LM (``embedding``: its token embedding module,
        default ``model.get_input_embeddings()``; ``decoder``: the module that holds the blocks,
        default :func:`~vocablens.models.find.find_decoder`; ``d_model``: the stream's width, default
        the config's ``hidden_size``)."""
        emb = embedding if embedding is not None else model.get_input_embeddings()
        dec = decoder if decoder is not None else find_decoder(model)
        cfg = config if config is not None else getattr(model, "config", None)
        scale, inside, factor = input_scale(emb, dec, cfg)
        from vocablens.models.quantized_weights import dequantized

        return cls(module=emb, weight=dequantized(emb.weight), scale=scale, scale_in_module=inside, factor=factor,
                   input_norm=_module_named(dec, _INPUT_NORMS), project_in=_module_named(dec, ("project_in",)),
                   positions=_module_named(dec, _POSITIONS),
                   d_model=d_model or config_value(cfg, "hidden_size", "n_embd", "d_model", default=None))

    @classmethod
    def from_borders(cls, borders) -> "Embedding":
        """The embedding of a :class:`~vocablens.models.Borders` (shares its modules and weights)."""
        return cls.from_model(borders.model, borders.embedding, find_decoder(borders.model), borders.config,
                              d_model=int(borders.d_model))

    # ------------------------------------------------------------------ shapes
    @property
    def vocab_size(self) -> int:
        """V, rows of W_E (padding included)."""
        return int(self.weight.shape[0])

    @property
    def d_emb(self) -> int:
        """Width of W_E's rows (d_model unless ``project_in`` exists)."""
        return int(self.weight.shape[1])

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def module_scale(self) -> float | None:
        """The input scale the embedding *module* applies in its own forward, or None (the model
        applies it elsewhere, or there is none): what a replacement of the module (the vocab-parallel
        embedding) must apply for the model to see the same rows."""
        return self.scale if self.scale_in_module and self.scale != 1.0 else None

    def _known(self) -> None:
        if math.isnan(self.scale):
            raise BadInput("the input scale was not read (this model was loaded with its matrices only): "
                           "load the borders or the whole model to read the input side")

    def _check(self, ids: torch.Tensor) -> torch.Tensor:
        self._known()
        ids = torch.as_tensor(ids, device=self.device)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise BadInput(f"token ids must be integers; got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise BadInput(f"token ids must lie in [0, {self.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
        return ids.long()

    # ------------------------------------------------------------------ the path
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> what block 0 reads from the token embedding, [..., d_model], in the
        model's dtype, computed by the model's own modules in its order (module, input scale, input
        norm, ``project_in``). Block 0's input is exactly this for every family without learned
        absolute positions; with them (:attr:`positions`) the model adds the position rows to it.
        Differentiable in the weights.

        Raises:
            BadInput: non-integer ids, an id outside [0, V), or an input scale this load did not read.
        """
        x = self.module(self._check(ids))
        if isinstance(self.factor, torch.Tensor):
            x = x * self.factor.type(x.dtype)  # RecurrentGemma: the stored buffer, cast as the model casts it
        elif self.factor is not None:
            x = x * self.factor  # a Python float, as Granite multiplies
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.project_in is not None:
            x = self.project_in(x)
        return x

    def rows(self, ids: torch.Tensor | slice | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Embedding rows as they enter the stream, computed in ``dtype`` from W_E: [R, d_model]
        (``ids``: a tensor of ids, gathered; a slice, a view of the block; None, all V rows).

        W_E[ids] cast to ``dtype`` first, times ``scale`` (a Python float), then the input norm and
        ``project_in`` run in ``dtype`` (copies of the modules when their dtype differs), no
        positions. For float32 or float64 analyses (direction alignment, vocabulary-space circuits)
        that must not inherit bfloat16 rounding past the stored weights; :meth:`lookup` is the
        model's own arithmetic. Detached.

        Raises:
            BadInput: an id outside [0, V), or an input scale this load did not read (NaN).
        """
        from vocablens.models.blocks.view import linear_bias, linear_weight

        self._known()
        W = self.weight.detach()
        if isinstance(ids, slice):
            W = W[ids]
        elif ids is not None:
            W = W[self._check(ids)]
        E = W.to(dtype)
        if self.scale != 1.0:
            E = E * float(self.scale)
        if self.input_norm is not None:
            norm = self.input_norm
            if any(p.dtype != dtype for p in norm.parameters()):
                norm = copy.deepcopy(norm).to(dtype)
            with torch.no_grad():
                E = norm(E)
        if self.project_in is not None:
            P = linear_weight(self.project_in).detach().to(E.device, dtype)
            E = E @ P.t()
            b = linear_bias(self.project_in)
            if b is not None:
                E = E + b.detach().to(E.device, dtype)
        return E

    def describe(self) -> dict[str, Any]:
        """Plain-data summary (for JSON)."""
        return {"vocab_size": self.vocab_size, "d_emb": self.d_emb, "d_model": self.d_model,
                "scale": self.scale, "scale_in_module": self.scale_in_module,
                "input_norm": type(self.input_norm).__name__ if self.input_norm is not None else None,
                "project_in": self.project_in is not None,
                "positions": type(self.positions).__name__ if self.positions is not None else None,
                "dtype": str(self.dtype).replace("torch.", "")}


__all__ = ["Embedding", "input_scale"]
