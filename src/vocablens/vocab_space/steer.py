"""Steer a model by scaling the FFN value vectors that promote (or suppress) a set of tokens.

Geva et al. (2022), "Transformer Feed-Forward Layers Build Predictions by Promoting Concepts in the
Vocabulary Space", §5.1: the value vectors whose top tokens belong to a concept are found by reading
them in vocabulary space, and turning their activations up changes what the model writes about that
concept (they cut GPT-2's toxicity by about half with 10 vectors).

Selection. A value vector v scores token t with s_t(v) = R[t]·v (R: the readout,
:meth:`~vocablens.models.unembed.Unembedding.readout`). For a set of tokens T the vector's *concept
score* is the z-score of their mean score among the vector's own logits over the vocabulary,

    z_T(v) = (mean_{t in T} s_t(v) - mean_w s_w(v)) / std_w s_w(v),

with both moments exact from :func:`vocablens.vocab_space.search.value_stats` (no [N, V] projection).
``promote`` tokens pick the ``top_n`` vectors with the largest z_T; ``suppress`` tokens pick the
``top_n`` vectors with the most negative z_T (the vectors that push the concept down) — or, with
``suppress_mode="ablate"``, the ``top_n`` that push it up most, to be switched off.

Intervention. A forward pre-hook on each chosen block's down projection multiplies the chosen
neurons' activations by ``scale`` (ablate: by 0). No weight is edited; :meth:`Steering.save_weights`
folds the same factors into the down projection's columns (an exact equivalent, the down projection
being linear in its input) for a model that reloads with plain transformers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from vocablens.errors import BadInput


@dataclass(frozen=True)
class SteerVector:
    """One chosen value vector.

    Attributes:
        role: ``"promote"`` (scaled up for the promote set), ``"suppress"`` (scaled up to push the
            suppress set down) or ``"ablate"`` (a promoter of the suppress set, switched off).
        block, neuron: where it lives (block index 0..L-1, row of W_out).
        z: its concept score z_T (see the module docstring).
        factor: what its activation is multiplied by.
    """

    role: str
    block: int
    neuron: int
    z: float
    factor: float


@dataclass(eq=False)
class Steering:
    """A set of activation factors on FFN neurons; a context manager around any forward or ``generate``.

    ``with steering: model(...)`` runs the model steered; outside the block it is unchanged.
    """

    borders: object
    vectors: list[SteerVector]
    _patch: object = field(default=None, repr=False)  # the hooks while active (vocablens.models.hooks)

    def factors(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per block: (neuron ids [n] int64, factors [n] float32)."""
        by: dict[int, list[SteerVector]] = {}
        for v in self.vectors:
            by.setdefault(v.block, []).append(v)
        # cpu: small host tensors; __enter__ moves them to each block's device once
        return {b: (torch.tensor([v.neuron for v in vs], dtype=torch.int64),  # cpu: see above
                    torch.tensor([v.factor for v in vs], dtype=torch.float32)) for b, vs in by.items()}

    def __enter__(self) -> "Steering":
        from vocablens.models.blocks import block_view
        from vocablens.models.hooks import ModelPatch

        if self._patch is not None:
            raise BadInput("this Steering is already active")
        patch = ModelPatch()
        try:
            for b, (idx, fac) in self.factors().items():
                mod = block_view(self.borders, b).mlp_out
                w = next(mod.parameters(), None)
                if w is not None:  # on the block's device once, not at every forward
                    idx, fac = idx.to(w.device), fac.to(w.device)

                def pre_hook(_mod, args, kwargs, idx=idx, fac=fac):
                    x = args[0] if args else kwargs["input"]
                    x = x.clone()
                    x[..., idx.to(x.device)] *= fac.to(x.device, x.dtype)
                    if args:
                        return (x, *args[1:]), kwargs
                    kwargs = dict(kwargs, input=x)
                    return args, kwargs

                patch.pre_hook(mod, pre_hook, with_kwargs=True)
        except BaseException:
            patch.close()  # a failed install leaves nothing behind
            raise
        self._patch = patch
        return self

    def __exit__(self, *exc) -> None:
        patch, self._patch = self._patch, None
        if patch is not None:
            patch.close()

    @contextlib.contextmanager
    def folded(self) -> Iterator[None]:
        """Fold the factors into the down projections' weights for the duration of the block (and put
        the original columns back afterwards, bit for bit): for saving an edited model.

        Raises:
            UnsupportedQuantization: a model quantized by a transformers quantizer (its down
                projections are read dequantized: a fold would not reach the weights saved).
        """
        from vocablens.models.blocks import block_view
        from vocablens.models.files.quantized import refuse_edit

        refuse_edit(self.borders.model, "saving a steered model")  # W_out would be a dequantized copy
        saved = []
        with torch.no_grad():
            try:
                for b, (idx, fac) in self.factors().items():
                    W = block_view(self.borders, b).W_out  # [d_ff, d]: a view of the down projection's weight
                    idx = idx.to(W.device)
                    rows = W[idx].clone()
                    saved.append((W, idx, rows))
                    W[idx] = rows * fac.to(W.device, W.dtype)[:, None]
                yield
            finally:
                for W, idx, rows in reversed(saved):
                    W[idx] = rows


def concept_scores(borders, token_ids: Sequence[int], apply_norm_gain: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """z_T(v) of every value vector for the token set T (module docstring).

    Returns:
        ``(blocks [N] int64, neurons [N] int64, z [N] float32)``, N = L · d_ff, block-major.

    Raises:
        BadInput: an empty set or a token outside the real vocabulary.
    """
    from vocablens.models.blocks import block_views
    from vocablens.vocab_space.search import value_stats

    ids = [int(t) for t in token_ids]
    if not ids:
        raise BadInput("no tokens: give at least one token to steer by")
    real = borders.real_vocab_size
    bad = [t for t in ids if not 0 <= t < real]
    if bad:
        raise BadInput(f"token ids {bad} are outside the real vocabulary 0..{real - 1}")
    st = value_stats(borders, apply_norm_gain)
    r = borders.unembedding.readout_rows(ids, apply_norm_gain, scaled=True).mean(0)  # [d]
    s = torch.cat([v.W_out.detach().float() @ r.to(v.W_out.device) for v in block_views(borders)])
    z = (s - st.mean) / st.std.clamp_min(1e-12)
    return st.blocks, st.neurons, z


def steer(borders, promote: Sequence[int] = (), suppress: Sequence[int] = (), top_n: int = 10,
          scale: float = 8.0, blocks: Sequence[int] | None = None, suppress_mode: str = "boost",
          apply_norm_gain: bool = True) -> Steering:
    """Choose value vectors for the promote / suppress token sets and return the :class:`Steering`.

    Args:
        borders: a :class:`~vocablens.models.Borders` (dense blocks).
        promote: token ids to promote (may be empty if ``suppress`` is not).
        suppress: token ids to suppress (may be empty if ``promote`` is not).
        top_n: vectors chosen per set (>= 1).
        scale: factor on a chosen vector's activation (> 0; "ablate" uses 0 for the suppress set).
        blocks: only vectors of these blocks (default: all).
        suppress_mode: ``"boost"`` (scale up the vectors that push the set down) or ``"ablate"``
            (switch off the vectors that push it up).

    Returns:
        A :class:`Steering`, inactive until used as a context manager.

    Raises:
        BadInput: both sets empty, top_n < 1 or not an int, scale not a positive finite number,
            a block out of range, an unknown suppress_mode.
    """
    import math

    if not promote and not suppress:
        raise BadInput("give tokens to promote or to suppress")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise BadInput(f"top_n must be an int >= 1; got {top_n!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise BadInput(f"scale must be a positive finite number; got {scale!r}")
    if suppress_mode not in ("boost", "ablate"):
        raise BadInput(f"suppress_mode must be boost or ablate; got {suppress_mode!r}")
    L = borders.n_layers
    allowed = None
    if blocks is not None:
        allowed = sorted({int(b) for b in blocks})
        if not allowed or allowed[0] < 0 or allowed[-1] >= L:
            raise BadInput(f"blocks must lie in 0..{L - 1}; got {list(blocks)}")
    chosen: list[SteerVector] = []
    taken: set[tuple[int, int]] = set()
    plan = []
    if promote:
        plan.append(("promote", promote, +1.0, float(scale)))
    if suppress:
        plan.append(("suppress", suppress, -1.0, float(scale)) if suppress_mode == "boost"
                    else ("ablate", suppress, +1.0, 0.0))
    for role, ids, sign, factor in plan:
        # cpu: the [N] scores, once per concept; choosing a few vectors below is a host loop
        layers, neurons, z = (t.cpu() for t in concept_scores(borders, ids, apply_norm_gain))
        key = sign * z
        if allowed is not None:
            keep = torch.isin(layers, torch.tensor(allowed))
            key = torch.where(keep, key, torch.full_like(key, -float("inf")))
        for i in torch.argsort(key, descending=True).tolist():
            if len([c for c in chosen if c.role == role]) >= top_n or not math.isfinite(float(key[i])):
                break
            b, n = int(layers[i]), int(neurons[i])
            if (b, n) in taken:
                continue
            taken.add((b, n))
            chosen.append(SteerVector(role=role, block=b, neuron=n, z=float(z[i]), factor=factor))
    return Steering(borders=borders, vectors=chosen)


def vector_top_tokens(borders, vectors: Sequence[SteerVector], k: int = 6, apply_norm_gain: bool = True
                      ) -> list[list[int]]:
    """What each chosen vector does to its target: the ``k`` real tokens it pushes up (promote, ablate)
    or down (suppress), by its scores R v over the real vocabulary (module docstring).

    All vectors are read in one streamed pass over the head (:meth:`Unembedding.scores` of [M, d]):
    never the [V, d] readout, and one read of W_U for all M vectors.

    Returns:
        One list of ``min(k, real)`` token ids per vector, strongest first.
    """
    from vocablens.models.blocks import block_view

    if not vectors:
        return []
    U, real = borders.unembedding, borders.real_vocab_size
    W = torch.stack([block_view(borders, v.block).W_out[v.neuron].detach().float().to(U.device) for v in vectors])
    S = U.scores(W, apply_norm_gain, rows=slice(0, real))  # [M, real]
    sign = torch.tensor([-1.0 if v.role == "suppress" else 1.0 for v in vectors], device=S.device)
    return (S * sign[:, None]).topk(min(k, real), dim=-1).indices.tolist()


__all__ = ["SteerVector", "Steering", "concept_scores", "steer", "vector_top_tokens"]
