"""The two vocabulary borders of a causal LM, found once for every family.

:class:`Borders` is the only place that knows where each family keeps its embedding, blocks, final
norm and LM head. :meth:`Borders.from_model` finds the embedding and head through transformers'
accessors, the blocks by structure (:func:`vocablens.models.find.find_stream`; a composite model's
text model included, its config read through :func:`vocablens.models.find.text_config`) and the
final norm by names; a whole load then confirms the blocks and finds the readout by a probe forward
checked against the model's own logits (:func:`vocablens.models.readout.find_readout`). Analyses read
the residual stream and decode it through :attr:`Borders.unembedding` without an ``if`` on the model type.

Conventions (../shared/DESIGN.md): residual-stream layer 0 is the input of block 0 (embedding output,
after the input scale, learned positions or ``project_in``), layer i is the output of block i, layer L
is the last block's output *before* the final norm. ``unembedding(resid[L])`` equals the model's logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from vocablens.errors import BadInput, UnsupportedArchitecture
from vocablens.models.find import config_value, find_stream, input_embedding_of, named_children, text_config
from vocablens.models.embed import Embedding, input_scale
from vocablens.models.unembed import Unembedding

#: module names under which decoders keep their final norm (read by the two-matrix loads too)
FINAL_NORM_NAMES = ("norm", "final_layer_norm", "ln_f", "final_layernorm", "final_norm", "norm_f", "ln_out")

_cfg = config_value


@dataclass(frozen=True, eq=False)
class Borders:
    """The embedding and unembedding of one causal LM, and the path between them.

    Attributes:
        model: the transformers model (``*ForCausalLM``, or a vision-language ``*ForConditionalGeneration``).
        family: the model's ``config.model_type`` (``llama``, ``gemma3_text``, ``gpt2``, ``llava`` ...).
        embedding: the token embedding module; its weight is ``W_E`` [V, d_emb]. The input side as
            one object (scale, input norm, ``project_in``, lookup) is :attr:`input_embedding`.
        embed_scale: the factor the model multiplies embedding rows by (Gemma: sqrt(d_model) rounded
            to the weight dtype as the model computes it; Granite: ``embedding_multiplier``; else 1.0):
            :func:`vocablens.models.embed.input_scale`, the same value as ``input_embedding.scale``.
        blocks: the decoder blocks, in order (L of them).
        final_norm: the norm applied after the last block, or None (OPT-350m has none).
        project_in: OPT-style projection from d_emb to d_model before block 0, or None.
        project_out: OPT-style projection from d_model to d_emb after the final norm, or None.
        lm_head: the output linear layer; its weight is ``W_U`` [V, d_emb], bias optional.
        softcap: the final-logit soft cap c (Gemma 2), or None (see :mod:`vocablens.logit_transform`).
        logit_scale: factor applied to the head's output before the softcap (Cohere ``logit_scale``,
            Granite 1/``logits_scaling``); 1.0 for most families.
        tied: whether ``W_U`` and ``W_E`` are one matrix (share storage), decided by storage, not by
            config: every loader ties exactly when transformers does (config ties and the checkpoint
            stores no head, or one equal to the embedding bit for bit; :mod:`vocablens.models.files.tie`).
        vocab_size: V, rows of the matrices.
        tokenizer_vocab_size: tokens the tokenizer can produce (``len(tokenizer)``); rows at or
            beyond it are padding. None when no tokenizer was given.
    """

    model: nn.Module
    family: str
    embedding: nn.Module
    embed_scale: float
    blocks: nn.ModuleList
    final_norm: nn.Module | None
    project_in: nn.Module | None
    project_out: nn.Module | None
    lm_head: nn.Module
    softcap: float | None
    logit_scale: float
    tied: bool
    vocab_size: int
    tokenizer_vocab_size: int | None = None
    config: Any = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model: nn.Module, tokenizer=None) -> "Borders":
        """Find the borders of a transformers causal LM.

        Raises:
            UnsupportedArchitecture: naming the family and the modules found, when the embedding,
                the blocks or the LM head cannot be found.
        """
        family = str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))
        config = text_config(model)  # a composite model's text config: what its blocks and head read
        found = named_children(model)
        emb = input_embedding_of(model)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        decoder, blocks = find_stream(model, _cfg(config, "num_hidden_layers", "n_layer", "num_layers"))
        found.update({f"{type(decoder).__name__}.{k}": v for k, v in named_children(decoder).items()})
        if emb is None or getattr(emb, "weight", None) is None or emb.weight.dim() != 2:
            raise UnsupportedArchitecture(family, found, "no token embedding found")
        if head is None or getattr(head, "weight", None) is None or head.weight.dim() != 2:
            raise UnsupportedArchitecture(family, found, "no LM head found")
        if blocks is None:
            raise UnsupportedArchitecture(family, found, "no list of repeated blocks (an nn.ModuleList of modules "
                                          "with weights) anywhere in the model")
        if head.weight.shape[1] != emb.weight.shape[1] or head.weight.shape[0] != emb.weight.shape[0]:
            raise UnsupportedArchitecture(
                family, found,
                f"embedding {tuple(emb.weight.shape)} and LM head {tuple(head.weight.shape)} do not match",
            )
        final_norm = None
        for n in FINAL_NORM_NAMES:
            m = getattr(decoder, n, None)
            if isinstance(m, nn.Module):
                final_norm = m
                break
        project_in = getattr(decoder, "project_in", None)
        project_out = getattr(decoder, "project_out", None)
        embed_scale = input_scale(emb, decoder, config)[0]  # as the model computes it (models.embed)
        softcap = _cfg(config, "final_logit_softcapping", default=None)
        softcap = float(softcap) if softcap else None
        logit_scale = 1.0
        if family == "granite" or getattr(config, "logits_scaling", None) not in (None, 1, 1.0):
            ls = _cfg(config, "logits_scaling", default=1.0)
            logit_scale = 1.0 / float(ls)
        if getattr(model, "logit_scale", None) is not None and not isinstance(model.logit_scale, nn.Module):
            logit_scale *= float(model.logit_scale)
        # Meta tensors (built without storage to count parameters) all report data_ptr() == 0, so
        # only identity can tell that they are shared there; nor has a quantized weight its own storage.
        from vocablens.models.quantized_weights import is_quantized

        tied = head.weight is emb.weight or (
            not emb.weight.is_meta and not head.weight.is_meta and not is_quantized(emb.weight)
            and not is_quantized(head.weight)
            and head.weight.data_ptr() == emb.weight.data_ptr() and head.weight.shape == emb.weight.shape
        )
        V = int(emb.weight.shape[0])
        tvs = None
        if tokenizer is not None:
            tvs = int(len(tokenizer))
        return cls(
            model=model, family=family, embedding=emb, embed_scale=embed_scale, blocks=blocks,
            final_norm=final_norm,
            project_in=project_in if isinstance(project_in, nn.Module) else None,
            project_out=project_out if isinstance(project_out, nn.Module) else None,
            lm_head=head, softcap=softcap, logit_scale=logit_scale, tied=bool(tied), vocab_size=V,
            tokenizer_vocab_size=tvs, config=config,
        )

    def replace(self, **changes) -> "Borders":
        """A copy with ``changes`` (``final_norm``, ``project_out``, ``logit_scale`` ...) and fresh
        memos: what :func:`vocablens.models.readout.find_readout` found by structure."""
        return dataclasses.replace(self, _memo={}, **changes)

    # ------------------------------------------------------------------ matrices
    @property
    def W_E(self) -> torch.Tensor:
        """Embedding matrix [V, d_emb], the checkpoint's own weights (no scale applied); a quantized
        one read dequantized (:func:`vocablens.models.quantized_weights.dequantized`, once per weight)."""
        return self._plain(self.embedding.weight)

    def _plain(self, w: torch.Tensor) -> torch.Tensor:
        """``w`` itself, or its dequantized copy (:func:`vocablens.models.quantized_weights.kept_dequantized`)."""
        from vocablens.models.quantized_weights import kept_dequantized

        return kept_dequantized(self._memo, w)

    def _head_tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(W_U [V, d_emb], b_U [V] or None)`` as the head stores them (a quantized ``W_U`` read
        dequantized, a copy: the model's forward runs on the quantized weight): what
        :attr:`unembedding` and the weight checks are built from. Everything else reads the head
        through :attr:`unembedding` (``.weight``, ``.bias``)."""
        b = getattr(self.lm_head, "bias", None)
        return self._plain(self.lm_head.weight), (b if isinstance(b, torch.Tensor) else None)

    @property
    def d_model(self) -> int:
        """Width of the residual stream (differs from the matrices' width when project_in exists)."""
        cfg = self.config
        d = _cfg(cfg, "hidden_size", "n_embd", "d_model") if cfg is not None else None
        return int(d) if d else int(self.W_E.shape[1])

    @property
    def d_emb(self) -> int:
        """Width of the embedding and unembedding rows."""
        return int(self.W_E.shape[1])

    @property
    def n_layers(self) -> int:
        """L, the number of blocks; residual-stream layers run 0..L."""
        return len(self.blocks)

    def check_block(self, block: int) -> int:
        """``block`` as an int when it is a block index 0..L-1: the one rule every reader of one block
        applies (a partial read's ``blocks``, ``explain --block``).

        Raises:
            BadInput: ``block`` out of range (one line naming the range).
        """
        if not 0 <= int(block) < self.n_layers:
            raise BadInput(f"block {block} is out of range: this model has blocks 0..{self.n_layers - 1}")
        return int(block)

    @property
    def real_vocab_size(self) -> int:
        """Rows that are real tokens: min(V, tokenizer size); the rest are padding."""
        if self.tokenizer_vocab_size is None:
            return self.vocab_size
        return min(self.vocab_size, self.tokenizer_vocab_size)

    def real_token_mask(self, exclude_untrained: bool = False) -> torch.Tensor:
        """Bool [V]: True for rows that are real tokens (not padding beyond the tokenizer).

        With ``exclude_untrained``, also False for never-trained rows: all-zero rows of ``W_U``/
        ``W_E``, and groups of >= 8 rows that are bit-identical (an untouched initialization).
        """
        W_U = self._head_tensors()[0]
        key = ("real_token_mask", exclude_untrained, self.W_E._version, W_U._version, self.vocab_size)
        if key in self._memo:
            return self._memo[key].clone()
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[: self.real_vocab_size] = True
        bad = self.nonfinite_rows()
        if bad.numel():
            mask[bad] = False
        if exclude_untrained:
            from vocablens.models.weight_checks import untrained_rows

            mask &= ~untrained_rows(self.W_E).to(mask.device)
            if not self.tied:
                mask &= ~untrained_rows(W_U).to(mask.device)
        self._memo[key] = mask
        return mask.clone()

    @property
    def device(self) -> torch.device:
        """Where the token ids go: the embedding's device."""
        return self.W_E.device

    @property
    def read_device(self) -> torch.device:
        """Where the residual stream is read: the LM head's device. The embedding's (:attr:`device`)
        on a one-device load; a model placed over several devices (``device_map``) has every
        captured layer and every lens there."""
        return self.lm_head.weight.device

    # ------------------------------------------------------------------ non-finite weights
    def nonfinite(self) -> dict[str, int]:
        """Parameters holding NaN or ±inf: ``{name: count}`` (see :func:`vocablens.models.weight_checks.nonfinite`)."""
        from vocablens.models.weight_checks import nonfinite

        return nonfinite(self)

    def nonfinite_rows(self) -> torch.Tensor:
        """int64 ids of vocabulary rows whose embedding or LM-head row holds NaN or ±inf (sorted)."""
        from vocablens.models.weight_checks import nonfinite_rows

        return nonfinite_rows(self)

    def check_finite(self, ids: torch.Tensor | None = None) -> None:
        """Refuse a forward pass a non-finite weight would poison (:func:`vocablens.models.weight_checks.check_finite`).

        Raises:
            NonFiniteWeights: naming the tensor, how many values, and the matrices' rows.
        """
        from vocablens.models.weight_checks import check_finite

        check_finite(self, ids)

    @property
    def fills_cache_only(self) -> bool:
        """Whether a skipped block's K/V cache can be written without running the block (early
        exit's state propagation; :mod:`vocablens.models.blocks.cache_fill`)."""
        from vocablens.models.blocks.cache_fill import KV_ONLY_FAMILIES

        return self.family in KV_ONLY_FAMILIES

    # ------------------------------------------------------------------ computing through the borders
    @property
    def input_embedding(self) -> Embedding:
        """The :class:`~vocablens.models.embed.Embedding` (W_E, input scale, input norm, project_in,
        lookup) that every path reading the input side goes through: the counterpart of
        :attr:`unembedding`."""
        key = ("input_embedding", id(self.W_E))
        if key not in self._memo:
            self._memo[key] = Embedding.from_borders(self)
        return self._memo[key]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> what block 0 reads from the token embedding [..., d_model] (input
        scale, input norm, ``project_in``; no positions): :meth:`Embedding.lookup
        <vocablens.models.embed.Embedding.lookup>`.

        Raises:
            BadInput: an id outside [0, V).
        """
        return self.input_embedding.lookup(ids)

    @property
    def unembedding(self) -> Unembedding:
        """The :class:`~vocablens.models.unembed.Unembedding` (final norm, project_out, W_U, bias,
        scale, softcap, real-vocabulary mask) that every analysis and op reads logits through."""
        key = ("unembedding", self._head_tensors()[0]._version, self.tokenizer_vocab_size)
        if key not in self._memo:
            self._memo[key] = Unembedding.from_borders(self)
        return self._memo[key]

    @contextlib.contextmanager
    def capture(self) -> Iterator[dict[int, torch.Tensor]]:
        """Context manager: hooks that record the residual stream during one forward pass.

        Yields a dict filled as the model runs: ``{0: input of block 0, i: output of block i}``,
        tensors [B, T, d_model] (detached only if the forward runs without grad).
        """
        store: dict[int, torch.Tensor] = {}

        def pre_hook(_mod, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            store[0] = x

        def make_post(i):
            def post_hook(_mod, _args, output):
                out = output[0] if isinstance(output, (tuple, list)) else output
                store[i] = out

            return post_hook

        from vocablens.models.hooks import ModelPatch

        with ModelPatch() as patch:
            patch.pre_hook(self.blocks[0], pre_hook, with_kwargs=True)
            for i, blk in enumerate(self.blocks, start=1):
                patch.post_hook(blk, make_post(i))
            yield store

    def residual_stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        **inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the model once and capture the residual stream at every layer.

        Args:
            input_ids: [B, T] int64.
            attention_mask: [B, T] or None.
            inputs: further inputs of the model's forward, as its processor makes them (a
                vision-language model's ``pixel_values`` [N, C, H, W] ...: :mod:`vocablens.models.vision`).

        Returns:
            ``(resid, logits)``: resid [L+1, B, T, d_model] in the model dtype (layer 0 = input of
            block 0, layer L = last block's output before the final norm) and the model's own logits
            [B, T, V] float32.

        Raises:
            BadInput: empty input, or a token id outside the embedding's rows.
            NonFiniteActivations: a layer (or the logits) holds inf or NaN, named.
        """
        from vocablens.models.blocks_forward import check_forward_input, check_stream_finite

        input_ids = check_forward_input(self, input_ids)  # [B, T]; the checks every forward of ours passes
        with self.capture() as store:
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask,
                             use_cache=False, **inputs)
        L = self.n_layers
        missing = [i for i in range(L + 1) if i not in store]
        if missing:
            raise UnsupportedArchitecture(self.family, named_children(self.model),
                                          f"residual stream not captured at layers {missing}")
        resid = torch.stack([store[i].to(self.read_device) for i in range(L + 1)])  # read where the head is
        logits = out.logits.float()
        check_stream_finite(self, resid, logits, attention_mask)  # no figure is read from inf or NaN
        return resid, logits

    def describe(self) -> dict[str, Any]:
        """Plain-data summary of the borders (for JSON and tables)."""
        return {
            "family": self.family,
            "vocab_size": self.vocab_size,
            "tokenizer_vocab_size": self.tokenizer_vocab_size,
            "padding_rows": self.vocab_size - self.real_vocab_size,
            "d_model": self.d_model,
            "d_emb": self.d_emb,
            "n_layers": self.n_layers,
            "tied": self.tied,
            "embed_scale": self.embed_scale,
            "final_norm": type(self.final_norm).__name__ if self.final_norm is not None else None,
            "project_in": self.project_in is not None,
            "project_out": self.project_out is not None,
            "lm_head_bias": self._head_tensors()[1] is not None,
            "softcap": self.softcap,
            "logit_scale": self.logit_scale,
            "dtype": str(self.W_E.dtype).replace("torch.", ""),
        }
