"""Parameters and residual-stream updates read in vocabulary space (analysis layer).

Three readings, for every family :class:`~vocablens.models.Borders` and
:mod:`vocablens.models.blocks` support, with no family ``if``:

1. **Parameters** (no forward pass). Dar et al. 2022, "Analyzing Transformers in Embedding Space",
   §2-3: a parameter vector in the residual space is read by multiplying it with the unembedding.
   - :func:`project_vectors`: FFN value vectors (row i of the down projection's transpose: what neuron i
     writes) projected through the unembedding, top and bottom tokens; key vectors (the rows that decide
     whether a neuron fires: gate rows of a gated MLP, else up-projection rows) are read through the
     *input* embedding, because they are compared with the stream entering the block.
   - :func:`search_token`: the reverse direction, the value vectors that most promote or suppress one
     token across all layers (Geva et al. 2022, "Transformer Feed-Forward Layers Build Predictions by
     Promoting Concepts in the Vocabulary Space", §3).
   - :func:`head_circuit`: one attention head's OV circuit ``E W_V W_O U`` (what a token attended to
     makes the head write, read as tokens; Dar et al. §2.2, Elhage et al. 2021) or QK circuit
     ``E W_Q W_Kᵀ Eᵀ``, its top token pairs; the grouped-query head a query head reads is mapped with
     ``kv_head(h)``.

   **The final norm's gain.** The unembedding reads the stream *after* the final norm, which multiplies
   each coordinate by a learned gain (and divides by a per-position scale that does not change which
   token wins). With ``apply_norm_gain=True`` (the default) a vector v is read as ``U (g ⊙ v)``, the
   map the model applies up to that positive scale, so rankings match what v would do to the model's
   logits; ``False`` reads ``U v`` as Dar et al. do. The norm's bias and mean-centering are not applied
   (they do not depend on v, or are a fixed projection the paper omits), and nothing is folded into the
   checkpoint.

   **Memory.** Reading all value vectors is layers x d_ff x V numbers (SmolLM2-135M: 30 x 1536 x 49152
   = 9 GB in float32); nothing here materializes more than one chunk of rows x V at a time
   (``chunk_rows``), keeping only the top-k.

2. **Updates** (:func:`explain`, one forward pass). Geva et al. 2022 §2: each block adds an attention
   update and an FFN update to the stream; the FFN update is a sum of sub-updates ``a_i · v_i``
   (activation times value vector). For one position: per layer, the change in log-probability of the
   final top-1 and of a chosen token under the logit lens after the attention and after the FFN; the
   FFN sub-updates with the largest direct effect, with the tokens each promotes; and direct logit
   attribution (DLA) per head and per FFN to the logit difference between a target and a contrast
   token.

   **The approximation.** The final norm is linearized at its actual input ``x_L``: every part u of the
   stream is read as ``U P (s ⊙ (u - c·mean(u)))`` with s = gain / sigma(x_L), the scale the model
   actually applied (c = 1 for LayerNorm-style centering). Because sigma is the one of the whole stream,
   the parts sum *exactly* (up to float error) to the model's pre-softcap logits; what is approximate is
   reading each part alone at that shared scale (removing a part would change sigma). Post-norms of
   gemma2/gemma3/olmo2 blocks are linearized the same way at their actual inputs. A final-logit
   softcap is not linear: attributions sum to the logit *before* the softcap.

3. **Settling** (:func:`settle`). For each position of a corpus, the first layer from which the lens's
   top-1 equals the model's final top-1 and stays equal; its distribution; and an early exit that stops
   at the first layer whose lens top-1 probability reaches a threshold (Geva et al. 2022 §5.2; they
   reported ~20% of layers saved): the fraction of blocks saved, the net fraction of FLOPs saved once
   the lens's own cost at every checked layer is paid, and the agreement with the full model kept.
   Any :class:`~vocablens.lens.logit.Translator` (a tuned lens) can be used instead of the plain logit
   lens.

All results are frozen dataclasses of tensors and numbers; scores are logits (nats of unnormalized
log-probability) per unit of the vector read, log-probabilities are in nats, all math is float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from vocablens.errors import BadInput, UnsupportedArchitecture
from vocablens.lens.logit import Translator, layer_logprobs
from vocablens.models import Borders
from vocablens.models.blocks import (
    BlockView, block_view, block_views, capture_updates, linear_bias, linear_weight, linearize_norm, norm_gain,
)

#: default early-exit confidence thresholds (lens top-1 probability)
DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
_CHUNK_ELEMS = 1 << 24  # at most 16M float32 scores (64 MiB) per chunk


# ---------------------------------------------------------------------------------------------- readout
def _chunk_rows(V: int, chunk_rows: int | None) -> int:
    return max(1, chunk_rows or _CHUNK_ELEMS // max(V, 1))


def _head_weights(borders: Borders) -> torch.Tensor:
    """Unembedding rows pulled back to the residual width: ``logit_scale · W_U P_out`` [V, d_model] float32."""
    W = borders.W_U.detach().float()
    if borders.project_out is not None:
        W = W @ linear_weight(borders.project_out).detach().float()  # [V, d_emb] @ [d_emb, d_model]
    return W * borders.logit_scale


def _input_embedding(borders: Borders, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Token embeddings as they enter the residual stream (input scale, project_in; no positions)
    [V or n, d_model] float32."""
    W = borders.W_E.detach() if ids is None else borders.W_E.detach()[ids]
    E = W.float() * borders.embed_scale
    if borders.project_in is not None:
        E = E @ linear_weight(borders.project_in).detach().float().t()
    return E


@dataclass(frozen=True)
class _Readout:
    """Maps residual-space vectors u [n, d_model] to vocabulary scores [n, V] (float32)."""

    U: torch.Tensor  # [V, d_model] float32, rows already multiplied by the gain
    real: int

    @classmethod
    def of(cls, borders: Borders, apply_norm_gain: bool) -> "_Readout":
        U = _head_weights(borders)
        if apply_norm_gain and borders.final_norm is not None:
            gain, _, _ = norm_gain(borders.final_norm, borders.d_model)
            U = U * gain
        return cls(U=U, real=borders.real_vocab_size)

    def scores(self, u: torch.Tensor) -> torch.Tensor:
        return u.float() @ self.U[: self.real].t()


def _top_bottom(scores: torch.Tensor, k: int):
    top = torch.topk(scores, k, dim=-1)
    bot = torch.topk(scores, k, dim=-1, largest=False)
    return top.indices, top.values, bot.indices, bot.values


def _check_k(k: int, V: int) -> None:
    if not 1 <= k <= V:
        raise BadInput(f"-k must be between 1 and the vocabulary size {V}; got {k}")


def _check_layer(borders: Borders, layer: int) -> None:
    L = borders.n_layers
    if not 0 <= int(layer) < L:
        raise BadInput(f"layer {layer} is out of range: this model has blocks 0..{L - 1}")


# ---------------------------------------------------------------------------------------------- 1. parameters
@dataclass(frozen=True)
class VectorProjection:
    """FFN value (or key) vectors read in vocabulary space.

    Attributes:
        kind: ``value`` (read through the unembedding) or ``key`` (read through the input embedding).
        layers: [n] int64 block index of each vector.
        neurons: [n] int64 neuron index within its layer.
        norms: [n] float32, L2 norm of each vector.
        top_ids, top_scores: [n, k] tokens the vector promotes most, and their scores (logits per unit).
        bottom_ids, bottom_scores: [n, k] tokens it suppresses most (most negative scores).
        apply_norm_gain: whether the final norm's gain was applied (values only).
    """

    kind: str
    layers: torch.Tensor
    neurons: torch.Tensor
    norms: torch.Tensor
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    bottom_ids: torch.Tensor
    bottom_scores: torch.Tensor
    apply_norm_gain: bool


def project_vectors(borders: Borders, layers: Sequence[int], neurons: Sequence[int], k: int = 10,
                    kind: str = "value", apply_norm_gain: bool = True, chunk_rows: int | None = None
                    ) -> VectorProjection:
    """Project FFN value (or key) vectors into vocabulary space (Dar et al. 2022 §2; Geva et al. 2022 §3).

    Args:
        borders: the model's borders.
        layers, neurons: equal-length sequences; vector j is neuron ``neurons[j]`` of block ``layers[j]``.
        k: tokens kept at each end (1..V).
        kind: ``value``: row i of ``W_out`` [d_ff, d] read as ``U (g ⊙ v)`` (see the module docstring);
            ``key``: row i of the gate (gated MLPs) or up projection read against the input embedding
            ``E k`` (embedding scale and ``project_in`` applied).
        apply_norm_gain: apply the final norm's gain before the unembedding (values only).
        chunk_rows: vectors scored per chunk (default: 64 MiB of scores).

    Returns:
        :class:`VectorProjection` with n = len(layers) rows, in the order given.

    Raises:
        BadInput: unequal lengths, a layer or neuron out of range, bad k or kind.
        UnsupportedArchitecture: a block without a dense MLP (mixture of experts).
    """
    if kind not in ("value", "key"):
        raise BadInput(f"kind must be 'value' or 'key'; got {kind!r}")
    if len(layers) != len(neurons):
        raise BadInput(f"{len(layers)} layers but {len(neurons)} neurons")
    if len(layers) == 0:
        raise BadInput("no vectors to project: give at least one layer and neuron")
    real = borders.real_vocab_size
    _check_k(k, real)
    views: dict[int, BlockView] = {}
    vecs = []
    for ly, n in zip(layers, neurons):
        ly, n = int(ly), int(n)
        _check_layer(borders, ly)
        v = views.get(ly) or views.setdefault(ly, block_view(borders, ly))
        if not 0 <= n < v.d_ff:
            raise BadInput(f"neuron {n} is out of range: layer {ly} has neurons 0..{v.d_ff - 1}")
        vecs.append((v.W_out[n] if kind == "value" else v.keys[n]).detach().float())
    X = torch.stack(vecs)  # [n, d_model]
    if kind == "value":
        R = _Readout.of(borders, apply_norm_gain)
        score = R.scores
    else:
        E = _input_embedding(borders)[:real]

        def score(u):
            return u @ E.t()
    step = _chunk_rows(real, chunk_rows)
    parts = [_top_bottom(score(X[i:i + step]), k) for i in range(0, len(X), step)]
    ti, tv, bi, bv = (torch.cat([p[j] for p in parts]) for j in range(4))
    return VectorProjection(kind=kind, layers=torch.tensor([int(x) for x in layers]),
                            neurons=torch.tensor([int(x) for x in neurons]), norms=X.norm(dim=-1),
                            top_ids=ti, top_scores=tv, bottom_ids=bi, bottom_scores=bv,
                            apply_norm_gain=bool(apply_norm_gain and kind == "value"))


def sample_neurons(borders: Borders, per_layer: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """``per_layer`` distinct neurons drawn uniformly from every block (deterministic for a seed).

    Returns:
        ``(layers, neurons)`` lists of length L·per_layer, layer-major, neurons sorted in a layer.

    Raises:
        BadInput: per_layer < 1. UnsupportedArchitecture: a block without a dense MLP.
    """
    if per_layer < 1:
        raise BadInput(f"--sample must be at least 1; got {per_layer}")
    g = torch.Generator().manual_seed(int(seed))
    layers, neurons = [], []
    for v in block_views(borders):
        idx = torch.randperm(v.d_ff, generator=g)[: min(per_layer, v.d_ff)].sort().values
        layers += [v.index] * len(idx)
        neurons += idx.tolist()
    return layers, neurons


@dataclass(frozen=True)
class TokenSearch:
    """The value vectors that most promote and most suppress one token, over all layers.

    Attributes:
        token_id: the token searched.
        promote_layers, promote_neurons, promote_scores: [k] the largest scores ``U[t]·(g ⊙ v)``.
        suppress_layers, suppress_neurons, suppress_scores: [k] the most negative scores.
        apply_norm_gain: whether the final norm's gain was applied.
    """

    token_id: int
    promote_layers: torch.Tensor
    promote_neurons: torch.Tensor
    promote_scores: torch.Tensor
    suppress_layers: torch.Tensor
    suppress_neurons: torch.Tensor
    suppress_scores: torch.Tensor
    apply_norm_gain: bool


def search_token(borders: Borders, token_id: int, k: int = 10, apply_norm_gain: bool = True) -> TokenSearch:
    """Which FFN value vectors most promote (or suppress) ``token_id`` (Geva et al. 2022 §3, reverse).

    Streams block by block: one [d_ff] score vector per layer, a running top-k at each end; memory
    O(d_ff + k). Score = the token's logit per unit of the value vector, ``U[t]·(g ⊙ v)``.

    Raises:
        BadInput: token id outside the real vocabulary, bad k.
        UnsupportedArchitecture: a block without a dense MLP.
    """
    real = borders.real_vocab_size
    if not 0 <= int(token_id) < real:
        raise BadInput(f"token id {token_id} is outside the vocabulary 0..{real - 1}")
    if k < 1:
        raise BadInput(f"-k must be at least 1; got {k}")
    R = _Readout.of(borders, apply_norm_gain)
    r = R.U[int(token_id)]  # [d_model]
    best_hi = (torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
    best_lo = best_hi
    for v in block_views(borders):
        s = v.W_out.detach().float() @ r  # [d_ff]
        lay = torch.full_like(s, v.index, dtype=torch.long)
        neu = torch.arange(len(s))
        for which, largest in (("hi", True), ("lo", False)):
            cur = best_hi if which == "hi" else best_lo
            sc = torch.cat([cur[0], s])
            la = torch.cat([cur[1], lay])
            ne = torch.cat([cur[2], neu])
            kk = min(k, len(sc))
            t = torch.topk(sc, kk, largest=largest)
            new = (t.values, la[t.indices], ne[t.indices])
            if which == "hi":
                best_hi = new
            else:
                best_lo = new
    return TokenSearch(token_id=int(token_id), promote_layers=best_hi[1], promote_neurons=best_hi[2],
                       promote_scores=best_hi[0], suppress_layers=best_lo[1], suppress_neurons=best_lo[2],
                       suppress_scores=best_lo[0], apply_norm_gain=apply_norm_gain)


@dataclass(frozen=True)
class HeadCircuit:
    """One attention head's OV or QK circuit read token to token.

    Attributes:
        layer, head: the query head read; ``kv_head`` the key/value head it shares (GQA).
        circuit: ``ov`` (source token attended to -> token the head's output promotes; scores are logits
            per unit attention) or ``qk`` (query token -> key token; scores are attention logits
            before softmax, divided by sqrt(d_head)).
        src_ids, tgt_ids, scores: [k] the top pairs over all source x target tokens.
        self_top1_fraction: fraction of source tokens whose top target is the token itself (a copying
            head for OV, a same-token-attending head for QK).
        n_sources: source tokens scanned.
        apply_norm_gain: final norm gain applied (OV only).
    """

    layer: int
    head: int
    kv_head: int
    circuit: str
    src_ids: torch.Tensor
    tgt_ids: torch.Tensor
    scores: torch.Tensor
    self_top1_fraction: float
    n_sources: int
    apply_norm_gain: bool


def head_circuit(borders: Borders, layer: int, head: int, circuit: str = "ov", k: int = 20,
                 apply_norm_gain: bool = True, max_sources: int | None = None, chunk_rows: int | None = None
                 ) -> HeadCircuit:
    """Top token pairs of one head's OV circuit ``E W_V W_O (g ⊙ U)ᵀ`` or QK circuit ``E W_Q W_Kᵀ Eᵀ``.

    Dar et al. 2022 §2.2 (attention parameters in embedding space); Elhage et al. 2021 ("A Mathematical
    Framework for Transformer Circuits", the OV and QK circuits). E is the input embedding (input scale,
    ``project_in``; no positions, no norm before the attention), so the circuits ignore positions,
    rotary embeddings, q/k norms and biases. The [V, V] matrix is never built: it has rank <= d_head,
    so sources are streamed in chunks of ``[c, d_head] @ [d_head, V]``; cost 2·n_sources·V·d_head FLOPs.

    Args:
        layer, head: block 0..L-1 and query head 0..H-1.
        circuit: ``ov`` or ``qk``.
        k: pairs kept.
        max_sources: scan only the first n source token ids (default: the whole real vocabulary).

    Raises:
        BadInput: layer/head out of range, bad circuit, k or max_sources.
        UnsupportedArchitecture: no attention of the expected shape.
    """
    if circuit not in ("ov", "qk"):
        raise BadInput(f"circuit must be 'ov' or 'qk'; got {circuit!r}")
    _check_layer(borders, layer)
    v = block_view(borders, int(layer))
    if not 0 <= int(head) < v.n_heads:
        raise BadInput(f"head {head} is out of range: layer {layer} has heads 0..{v.n_heads - 1}")
    real = borders.real_vocab_size
    n_src = real if max_sources is None else int(max_sources)
    if not 1 <= n_src <= real:
        raise BadInput(f"max_sources must be between 1 and {real}; got {max_sources}")
    _check_k(k, n_src * real)
    E = _input_embedding(borders)[:real]
    with torch.no_grad():
        if circuit == "ov":
            Wv, Wo = (w.detach().float() for w in v.W_OV(int(head)))
            A = E[:n_src] @ Wv  # [n, dh]
            B = _Readout.of(borders, apply_norm_gain).scores(Wo)  # [dh, V]: what each head dim promotes
        else:
            Wq, Wk = (w.detach().float() for w in v.W_QK(int(head)))
            A = E[:n_src] @ Wq / math.sqrt(v.d_head)
            B = (E @ Wk).t().contiguous()  # [dh, V]
    step = _chunk_rows(real, chunk_rows)
    best_s = torch.empty(0)
    best_i = torch.empty(0, dtype=torch.long)
    self_top = 0
    with torch.no_grad():
        for i in range(0, n_src, step):
            S = A[i:i + step] @ B  # [c, V]
            rows = torch.arange(i, i + S.shape[0])
            self_top += int((S.argmax(dim=1) == rows).sum())
            kk = min(k, S.numel())
            t = torch.topk(S.flatten(), kk)
            flat = (t.indices // S.shape[1] + i) * real + t.indices % S.shape[1]
            s = torch.cat([best_s, t.values])
            f = torch.cat([best_i, flat])
            t2 = torch.topk(s, min(k, len(s)))
            best_s, best_i = t2.values, f[t2.indices]
    return HeadCircuit(layer=int(layer), head=int(head), kv_head=v.kv_head(int(head)), circuit=circuit,
                       src_ids=best_i // real, tgt_ids=best_i % real, scores=best_s,
                       self_top1_fraction=self_top / n_src, n_sources=n_src,
                       apply_norm_gain=bool(apply_norm_gain and circuit == "ov"))


# ---------------------------------------------------------------------------------------------- 2. explain
APPROXIMATION = (
    "direct logit attribution reads every part of the residual stream through the final norm linearized "
    "at the actual stream (its scale 1/sigma(x_L) held fixed); the parts sum exactly to the model's "
    "pre-softcap logits, but each part alone is read at the scale of the whole"
)


@dataclass(frozen=True)
class SubUpdate:
    """One FFN sub-update ``a_i · v_i`` (Geva et al. 2022 §2).

    Attributes:
        layer, neuron: where it is.
        activation: a_i, the neuron's activation at the position.
        dla: its direct effect on the logit difference target - contrast (logits).
        dla_target: its direct effect on the target's logit.
        top_ids: [k] tokens the sub-update promotes most (its direct effect on all logits).
    """

    layer: int
    neuron: int
    activation: float
    dla: float
    dla_target: float
    top_ids: list[int]


@dataclass(frozen=True)
class LayerExplanation:
    """One block's updates at the explained position, in vocabulary space.

    Attributes:
        layer: block index 0..L-1 (it reads stream layer ``layer`` and writes ``layer + 1``).
        attn_dlogprob_top1, mlp_dlogprob_top1: change in the logit-lens log-probability (nats) of the
            final top-1 when the attention update, then the FFN update, are added.
        attn_dlogprob_token, mlp_dlogprob_token: the same for the user's token (None without one).
        attn_dla, mlp_dla: direct effect of each update on the logit difference target - contrast.
        head_dla: [H] float32, per-head share of ``attn_dla``; ``attn_bias_dla`` is the rest (the output
            projection's bias and a post-norm's bias), so ``head_dla.sum() + attn_bias_dla == attn_dla``.
        mlp_bias_dla: the down projection's (and post-norm's) bias part of ``mlp_dla``.
        attn_top_ids, mlp_top_ids: [k] tokens each update promotes most.
        sub_updates: the FFN sub-updates with the largest |dla|, largest first.
        sub_update_error: max |Σ_i a_i v_i + b_out - FFN output| (a check, ~0).
    """

    layer: int
    attn_dlogprob_top1: float
    mlp_dlogprob_top1: float
    attn_dlogprob_token: float | None
    mlp_dlogprob_token: float | None
    attn_dla: float
    mlp_dla: float
    head_dla: torch.Tensor
    attn_bias_dla: float
    mlp_bias_dla: float
    attn_top_ids: list[int]
    mlp_top_ids: list[int]
    sub_updates: list[SubUpdate]
    sub_update_error: float


@dataclass(frozen=True)
class Explanation:
    """What built the prediction at one position (see :func:`explain`).

    Attributes:
        input_ids: [T] int64 prompt; position: the explained position.
        top1: the model's top-1 token there; token: the user's token or None.
        target, contrast: DLA explains ``logit[target] - logit[contrast]`` (target = token or top-1;
            contrast = top-1 when the target is not the top-1, else the runner-up).
        top1_logprob, token_logprob: final log-probabilities (nats).
        embed_dla: direct effect of the embedding (stream layer 0) on the logit difference.
        const_dla: the final norm's bias and the head's bias (same for every prompt).
        layers: one :class:`LayerExplanation` per block.
        logit_diff_model: the model's pre-softcap ``logit[target] - logit[contrast]``.
        logit_diff_sum: ``embed_dla + Σ (attn_dla + mlp_dla) + const_dla``; equals the model's up to
            float error (see :data:`APPROXIMATION`).
        logit_target_model, logit_target_sum: the same for the target's logit alone.
        resid_error: max |x_0 + Σ updates - x_L| (a check that the updates are the whole stream).
        final_sigma: the final norm's actual RMS/std at the position (the scale held fixed).
        softcap: the final-logit softcap, if any (attributions are before it).
        approximation: the approximation, in words.
    """

    input_ids: torch.Tensor
    position: int
    top1: int
    token: int | None
    target: int
    contrast: int
    top1_logprob: float
    token_logprob: float | None
    embed_dla: float
    const_dla: float
    layers: list[LayerExplanation]
    logit_diff_model: float
    logit_diff_sum: float
    logit_target_model: float
    logit_target_sum: float
    resid_error: float
    final_sigma: float
    softcap: float | None
    approximation: str = APPROXIMATION


def explain(borders: Borders, input_ids: torch.Tensor, position: int = -1, token_id: int | None = None,
            k: int = 5, n_sub: int = 5) -> Explanation:
    """Per-layer attention and FFN updates, FFN sub-updates and per-head direct logit attribution.

    Geva et al. 2022 §2 (updates and sub-updates in vocabulary space); direct logit attribution as in
    Elhage et al. 2021 §"direct path", with the final norm linearized at the actual scale (see the module
    docstring and :data:`APPROXIMATION`).

    Args:
        borders: the model's borders.
        input_ids: [T] or [1, T] int64.
        position: the position explained (negative counts from the end).
        token_id: a token to follow (log-probability changes, and the DLA target); None = top-1 only.
        k: tokens listed per update and sub-update.
        n_sub: sub-updates listed per layer.

    Returns:
        :class:`Explanation`. Memory: one position's activations per layer ([d_ff] floats).

    Raises:
        BadInput: empty prompt, bad position, token id or k.
        UnsupportedArchitecture: a block without a dense MLP, or whose output is not its input plus
            its two updates (post-LN blocks).
    """
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise BadInput(f"explain reads one prompt; got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    T = int(input_ids.numel())
    if T == 0:
        raise BadInput("empty prompt: give some text")
    if not -T <= int(position) < T:
        raise BadInput(f"position {position} is outside the prompt's {T} tokens")
    p = int(position) % T
    real = borders.real_vocab_size
    _check_k(k, real)
    if n_sub < 0:
        raise BadInput(f"the number of sub-updates must be >= 0; got {n_sub}")
    if token_id is not None and not 0 <= int(token_id) < real:
        raise BadInput(f"token id {token_id} is outside the vocabulary 0..{real - 1}")
    views = block_views(borders)
    for v in views:
        if not v.additive:
            raise UnsupportedArchitecture(borders.family, {"block": type(v.block).__name__},
                                          f"cannot split block {v.index} into updates: {v.not_additive_reason}")
    L = borders.n_layers
    with torch.no_grad():
        with capture_updates(views, (1, T), positions=torch.tensor([p])) as caps:
            resid, model_logits = borders.residual_stream(input_ids[None])
        # everything below is float32 on the CPU, whatever the model's device and dtype
        x = resid[:, 0, p].float().cpu()  # [L+1, d]
        attn_u = torch.stack([c.attn[0, 0].float().cpu() for c in caps])  # [L, d]
        mlp_u = torch.stack([c.mlp[0, 0].float().cpu() for c in caps])
        recon = x[0] + (attn_u + mlp_u).sum(0)
        resid_error = float((recon - x[L]).abs().max())
        step_err = (x[:-1] + attn_u + mlp_u - x[1:]).abs().max()
        if float(step_err) > 1e-3 * max(float(x.abs().max()), 1.0):
            raise UnsupportedArchitecture(borders.family, {"block": type(views[0].block).__name__},
                                          f"block outputs are not input + attention + MLP updates "
                                          f"(off by {float(step_err):.3g})")

        final_lp = torch.log_softmax(model_logits[0, p].float().cpu(), -1)
        top2 = torch.topk(final_lp[:real], 2).indices.tolist()
        top1 = top2[0]
        target = int(token_id) if token_id is not None else top1
        contrast = top1 if target != top1 else top2[1]

        # Lens log-probs at x_l, x_l + attn_l, x_{l+1}.
        states = torch.empty(2 * L + 1, x.shape[1])
        states[0::2] = x
        states[1::2] = x[:-1] + attn_u
        lp = torch.log_softmax(borders.unembed(states.to(resid.device, resid.dtype)).float().cpu(), -1)  # [2L+1, V]
        lp_top1 = lp[:, top1]
        lp_tok = lp[:, int(token_id)] if token_id is not None else None

        # Final norm linearized at x_L; readout rows for target and contrast.
        fl = linearize_norm(borders.final_norm, x[L])
        Uh = _head_weights(borders).cpu()  # [V, d]
        r2 = fl.readout(Uh[[target, contrast]])  # [2, d]
        const = Uh[[target, contrast]] @ fl.bias
        if borders.project_out is not None and linear_bias(borders.project_out) is not None:
            W_U2 = borders.W_U.detach().float().cpu()[[target, contrast]]
            const = const + borders.logit_scale * (W_U2 @ linear_bias(borders.project_out).detach().float().cpu())
        if borders.b_U is not None:
            const = const + borders.b_U.detach().float().cpu()[[target, contrast]] * borders.logit_scale
        pre_logits = (borders.lm_head(borders.normed(resid[L, 0, p][None]).to(borders.W_U.dtype)).float()[0]
                      .cpu() * borders.logit_scale)
        logit_t, logit_c = float(pre_logits[target]), float(pre_logits[contrast])
        Ufull = fl.readout(Uh[:real])  # [V, d]: direct effect of any part on every logit

        def top_tokens(u: torch.Tensor) -> list[list[int]]:
            """Tokens each row of u [n, d] promotes most, in one pass over the vocabulary."""
            return torch.topk(u.float() @ Ufull.t(), k, dim=-1).indices.tolist()

        embed = r2 @ x[0]
        total = embed.clone() + const
        layers: list[LayerExplanation] = []
        sub_vecs: list[torch.Tensor] = []
        for i, (v, c) in enumerate(zip(views, caps)):
            # attention: heads, bias, post-transform
            a_lin = linearize_norm(v.attn_post.norm, c.attn_raw[0, 0]) if v.attn_post.norm is not None else None
            ra = r2 * v.attn_post.scale
            a_const = torch.zeros(2)
            if a_lin is not None:
                a_const = ra @ a_lin.bias
                ra = a_lin.readout(ra)
            z = c.z[0, 0].float().cpu().view(v.n_heads, v.d_head)
            WO = v.W_O.detach().float().cpu()  # [H, dh, d]
            head_out = torch.einsum("hk,hkd->hd", z, WO)  # [H, d]
            head_dla = head_out @ ra.t()  # [H, 2]
            bO = v.b_O
            a_bias = (ra @ bO.detach().float().cpu() if bO is not None else torch.zeros(2)) + a_const
            attn_dla = head_dla.sum(0) + a_bias
            # MLP: sub-updates, bias, post-transform
            m_lin = linearize_norm(v.mlp_post.norm, c.mlp_raw[0, 0]) if v.mlp_post.norm is not None else None
            rm = r2 * v.mlp_post.scale
            m_const = torch.zeros(2)
            if m_lin is not None:
                m_const = rm @ m_lin.bias
                rm = m_lin.readout(rm)
            act = c.act[0, 0].float().cpu()  # [d_ff]
            Wout = v.W_out.detach().float().cpu()  # [d_ff, d]
            sub = act[:, None] * (Wout @ rm.t())  # [d_ff, 2]
            bout = v.b_out
            m_bias = (rm @ bout.detach().float().cpu() if bout is not None else torch.zeros(2)) + m_const
            mlp_dla = sub.sum(0) + m_bias
            raw = act @ Wout + (bout.detach().float().cpu() if bout is not None else 0.0)
            sub_err = float((raw - c.mlp_raw[0, 0].float().cpu()).abs().max())
            diff = sub[:, 0] - sub[:, 1]
            subs: list[dict] = []
            if n_sub:
                idx = torch.topk(diff.abs(), min(n_sub, len(diff))).indices
                contrib = act[idx, None] * Wout[idx]  # [n, d] raw sub-updates
                if m_lin is not None:
                    contrib = m_lin.linear(contrib)
                sub_vecs.append(contrib * v.mlp_post.scale)
                subs = [dict(layer=i, neuron=int(j), activation=float(act[j]), dla=float(diff[j]),
                             dla_target=float(sub[j, 0])) for j in idx.tolist()]
            total = total + attn_dla + mlp_dla
            layers.append(LayerExplanation(
                layer=i,
                attn_dlogprob_top1=float(lp_top1[2 * i + 1] - lp_top1[2 * i]),
                mlp_dlogprob_top1=float(lp_top1[2 * i + 2] - lp_top1[2 * i + 1]),
                attn_dlogprob_token=None if lp_tok is None else float(lp_tok[2 * i + 1] - lp_tok[2 * i]),
                mlp_dlogprob_token=None if lp_tok is None else float(lp_tok[2 * i + 2] - lp_tok[2 * i + 1]),
                attn_dla=float(attn_dla[0] - attn_dla[1]), mlp_dla=float(mlp_dla[0] - mlp_dla[1]),
                head_dla=(head_dla[:, 0] - head_dla[:, 1]).contiguous(),
                attn_bias_dla=float(a_bias[0] - a_bias[1]), mlp_bias_dla=float(m_bias[0] - m_bias[1]),
                attn_top_ids=[], mlp_top_ids=[], sub_updates=subs, sub_update_error=sub_err,
            ))
        # the tokens every update and listed sub-update promotes, in one matmul
        tops = top_tokens(torch.cat([attn_u, mlp_u, *sub_vecs]))
        n = len(layers)
        at = 2 * n
        for i, ly in enumerate(layers):
            ly.attn_top_ids.extend(tops[i])
            ly.mlp_top_ids.extend(tops[n + i])
            made = []
            for sd in ly.sub_updates:
                made.append(SubUpdate(top_ids=tops[at], **sd))
                at += 1
            ly.sub_updates[:] = made
    sigma = float(fl.sigma.flatten()[0])
    return Explanation(
        input_ids=input_ids.detach().cpu(), position=p, top1=top1,
        token=None if token_id is None else int(token_id), target=target, contrast=contrast,
        top1_logprob=float(final_lp[top1]),
        token_logprob=None if token_id is None else float(final_lp[int(token_id)]),
        embed_dla=float(embed[0] - embed[1]), const_dla=float(const[0] - const[1]), layers=layers,
        logit_diff_model=logit_t - logit_c, logit_diff_sum=float(total[0] - total[1]),
        logit_target_model=logit_t, logit_target_sum=float(total[0]), resid_error=resid_error,
        final_sigma=sigma, softcap=borders.softcap,
    )


# ---------------------------------------------------------------------------------------------- 3. settle
@dataclass(frozen=True)
class ExitPoint:
    """An early exit at one confidence threshold.

    Attributes:
        threshold: exit at the first layer whose lens top-1 probability is >= this.
        mean_exit_layer: mean stream layer at which positions exit (L = never exited early).
        saved_block_fraction: mean (L - exit layer) / L, the share of blocks skipped.
        saved_flops_fraction: FLOPs saved net of the lens run at every checked layer m..e:
            ``1 - mean(e·F_block + (e-m+1)·F_head) / (L·F_block + F_head)``; negative when checking costs
            more than the blocks skipped (a large vocabulary and a narrow model).
        agreement: fraction of positions whose exit top-1 equals the full model's top-1.
    """

    threshold: float
    mean_exit_layer: float
    saved_block_fraction: float
    saved_flops_fraction: float
    agreement: float


@dataclass(frozen=True)
class SettleResult:
    """Where predictions settle over a corpus (see :func:`settle`).

    Attributes:
        kind: ``logit`` or ``tuned``.
        n_positions: positions read; n_layers: L.
        settle_layer: [N] int64, the first stream layer from which the lens top-1 equals the final top-1
            at every later layer (L when only the model's own output has it).
        histogram: [L+1] int64 counts of ``settle_layer``.
        settled_fraction: [L+1] float32, fraction of positions settled at or before each layer.
        top1_agreement: [L+1] float32, fraction of positions whose lens top-1 at a layer equals the final.
        exits: one :class:`ExitPoint` per threshold.
        min_layer: m, the first layer where exits were checked.
        block_flops: forward FLOPs of one block for one token (2 per multiply-add, weights plus attention
            over the mean context); head_flops: FLOPs of one lens read (2·V·d).
    """

    kind: str
    n_positions: int
    n_layers: int
    settle_layer: torch.Tensor
    histogram: torch.Tensor
    settled_fraction: torch.Tensor
    top1_agreement: torch.Tensor
    exits: list[ExitPoint]
    block_flops: float
    head_flops: float
    thresholds: tuple[float, ...] = field(default=DEFAULT_THRESHOLDS)
    min_layer: int = 0


def _block_flops(borders: Borders, mean_context: float) -> float:
    """FLOPs per token of one (average) block: 2 per weight of its matrices + attention scores and mix."""
    L = borders.n_layers
    weights = sum(p.numel() for blk in borders.blocks for p in blk.parameters() if p.dim() >= 2) / L
    cfg = borders.config
    H = int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 1) or 1)
    dh = int(getattr(cfg, "head_dim", None) or borders.d_model // H)
    return 2.0 * weights + 4.0 * H * dh * mean_context


def settle(borders: Borders, batches: Iterable[torch.Tensor] | torch.Tensor,
           thresholds: Sequence[float] = DEFAULT_THRESHOLDS, translator: Translator | None = None,
           kind: str | None = None, chunk_rows: int | None = None, min_layer: int = 0) -> SettleResult:
    """Settling layers and early exits over a corpus (Geva et al. 2022 §5.2, with any lens).

    Args:
        borders: the model's borders.
        batches: token rows [N, T] int64 (or an iterable of [B, T] batches), e.g. from
            :func:`vocablens.corpus.pack_tokens`; every position of every row is read.
        thresholds: early-exit confidences in (0, 1].
        translator: a :class:`~vocablens.lens.logit.Translator` (tuned lens) or None (logit lens).
        chunk_rows: positions decoded at once (default: 64 MiB of logits).
        min_layer: the first stream layer where an exit is checked (0 = the embedding itself; with tied
            embeddings the logit lens there confidently predicts the input token, a poor exit).

    Returns:
        :class:`SettleResult`. Memory: one batch's residual stream plus one chunk of [c, V] logits.

    Raises:
        BadInput: no tokens, a threshold outside (0, 1], min_layer outside 0..L.
    """
    if not 0 <= int(min_layer) <= borders.n_layers:
        raise BadInput(f"min_layer must be in 0..{borders.n_layers}; got {min_layer}")
    m = int(min_layer)
    ths = tuple(float(t) for t in thresholds)
    if not ths or any(not 0 < t <= 1 for t in ths):
        raise BadInput(f"thresholds must be in (0, 1]; got {list(thresholds)}")
    if isinstance(batches, torch.Tensor):
        batches = [batches if batches.dim() == 2 else batches[None]]
    L = borders.n_layers
    real = borders.real_vocab_size
    top1s, confs = [], []
    ctx_sum, n_tok = 0.0, 0
    with torch.no_grad():
        for ids in batches:
            if ids.numel() == 0:
                continue
            resid, _ = borders.residual_stream(ids)
            B, T = ids.shape
            ctx_sum += B * T * (T + 1) / 2
            n_tok += B * T
            h = resid.reshape(L + 1, B * T, -1)
            step = _chunk_rows(borders.vocab_size, chunk_rows)
            t1 = torch.empty(L + 1, B * T, dtype=torch.long)
            cf = torch.empty(L + 1, B * T)
            for layer in range(L + 1):
                for s in range(0, B * T, step):
                    lp = layer_logprobs(borders, h[layer, s:s + step], layer, translator)[:, :real]
                    mx = lp.max(dim=-1)
                    t1[layer, s:s + step] = mx.indices
                    cf[layer, s:s + step] = mx.values.exp()
            top1s.append(t1)
            confs.append(cf)
    if n_tok == 0:
        raise BadInput("no tokens to read: the corpus is empty")
    top1 = torch.cat(top1s, 1)  # [L+1, N]
    conf = torch.cat(confs, 1)
    agree = top1 == top1[L]  # [L+1, N]
    stays = agree.flip(0).int().cumprod(0).flip(0)  # 1 where this and every later layer agree
    settle_layer = (L + 1) - stays.sum(0)
    hist = torch.bincount(settle_layer, minlength=L + 1)
    N = top1.shape[1]
    F_block = _block_flops(borders, ctx_sum / n_tok)
    F_head = 2.0 * real * borders.d_emb
    base = L * F_block + F_head
    exits = []
    for t in ths:
        hit = conf >= t
        hit[:m] = False
        hit[L] = True
        e = hit.int().argmax(0)  # first layer reaching the threshold
        chosen = top1.gather(0, e[None])[0]
        ef = e.float()
        cost = ef * F_block + (ef - m + 1) * F_head
        exits.append(ExitPoint(threshold=t, mean_exit_layer=float(ef.mean()),
                               saved_block_fraction=float(((L - ef) / L).mean()),
                               saved_flops_fraction=float(1 - cost.mean() / base),
                               agreement=float((chosen == top1[L]).float().mean())))
    return SettleResult(kind=kind or ("logit" if translator is None else "tuned"), n_positions=N, n_layers=L,
                        min_layer=m,
                        settle_layer=settle_layer, histogram=hist,
                        settled_fraction=(hist.cumsum(0).float() / N), top1_agreement=agree.float().mean(1),
                        exits=exits, block_flops=F_block, head_flops=F_head, thresholds=ths)
