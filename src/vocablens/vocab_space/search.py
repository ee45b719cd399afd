"""Reverse search: the FFN value vectors that single out a token (Geva et al. 2022 §3, reversed).

A value vector v scores every token t with the logit it adds per unit of activation, ``s_t(v) = R[t]·v``
(R the readout, :mod:`.readout`). Ranking vectors by the raw ``s_t(v)`` favours high-norm late
neurons, whichever tokens they really push: on SmolLM2-135M, block 29 neuron 645 (top tokens 'Intf',
'firehose' ...) ranks first for ' Monday' and ' France', although ' Monday' sits at rank 41,868 of
its 49,152 logits. Here a vector is ranked by how strongly it singles the token out among its own
logits over the vocabulary, the z-score

    z_t(v) = (s_t(v) - mean_w s_w(v)) / std_w s_w(v)        (w over the real vocabulary)

(the reading of Geva et al. 2022 §3 and Dar et al. 2022 §3, where a vector means its top-ranked
tokens). Both moments are exact and need no [N, V] projection: ``mean_w s_w(v) = μ·v`` and
``var_w s_w(v) = vᵀ C v`` with μ [d] the mean readout row and C [d, d] the readout rows' covariance.
:func:`value_stats` computes them once for all N value vectors (2·V·d² + 2·N·d² FLOPs, vs 2·N·V·d
for projecting every vector); each searched token then costs 2·N·d FLOPs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import block_views
from vocablens.models.files.pages import release_pages
from vocablens.vocab_space.readout import check_token, readout_rows, rows_per_chunk, stream_rows, vocab_blocks
from vocablens.vocab_space.vectors import gather_vectors

#: the ranking criterion of :func:`search_tokens`, in words (shown by the CLI and the report)
CRITERION = ("z-score of the token's logit among the vector's own logits over the vocabulary, "
             "(s_t - mean s) / std s (Geva et al. 2022; Dar et al. 2022), not the raw logit s_t")


@dataclass(frozen=True)
class ValueStats:
    """Mean and standard deviation of every value vector's logits over the real vocabulary.

    Attributes:
        blocks, neurons: [N] int64, block and neuron of each value vector (block-major).
        mean: [N] float32, ``mean_w R[w]·v`` (logits per unit of activation).
        std: [N] float32, the population standard deviation ``std_w R[w]·v``.
        apply_norm_gain: whether R includes the final norm's gain.
    """

    blocks: torch.Tensor
    neurons: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    apply_norm_gain: bool


#: value_stats results per unembedding object (Borders makes a new one when W_U changes), keyed by the
#: versions of every tensor they read, so an in-place edit of the weights is never served stale stats
_STATS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _stats_key(borders: Borders, apply_norm_gain: bool) -> tuple:
    mods = [borders.final_norm, borders.project_out, *(v.mlp_out for v in block_views(borders))]
    return (bool(apply_norm_gain), borders.real_vocab_size,
            tuple((p.data_ptr(), p._version) for m in mods if m is not None for p in m.parameters()))


def value_stats(borders: Borders, apply_norm_gain: bool = True) -> ValueStats:
    """Exact per-vector moments of the value vectors' logits over the vocabulary (see the module docstring).

    Cost: 2·V·d² FLOPs for the readout's covariance and 2·N·d² for the N = L·d_ff quadratic forms;
    memory O(d² + d_ff·d) and one 8 MiB block of readout rows. The readout is streamed twice by
    blocks (:func:`~vocablens.vocab_space.readout.vocab_blocks`): the mean row and the covariance are
    sums over blocks accumulated in float64 (each block's sum and Gram in float32), then rounded to
    float32. The result is kept for this model's
    unembedding while its weights are unchanged (in-place edits are detected), so repeated searches
    pay it once; :func:`search_tokens` also takes it explicitly.

    Raises:
        UnsupportedArchitecture: a block without a dense MLP (mixture of experts).
    """
    memo = _STATS.setdefault(borders.unembedding, {})
    key = _stats_key(borders, apply_norm_gain)
    if key not in memo:
        if len(memo) >= 4:  # weights edited in place again and again: keep only recent readings
            memo.clear()
        memo[key] = _value_stats(borders, apply_norm_gain)
    return memo[key]


def _value_stats(borders: Borders, apply_norm_gain: bool) -> ValueStats:
    V, d = borders.real_vocab_size, int(borders.d_model)
    dev = borders.read_device
    # two passes over blocks of readout rows (never the [V, d] matrix): the mean row, then the
    # covariance of the centred rows; each block's sum is float32 (as the whole-matrix mean was), the
    # sums over blocks are float64 (a float64 copy of the block would cost 2x its memory)
    s = torch.zeros(d, dtype=torch.float64, device=dev)
    for _, _, R in stream_rows(borders, V, "value", apply_norm_gain):
        s += R.sum(0).double()
        del R  # the next block is made before the loop rebinds R: free this one first
    mu = (s / V).float()
    C64 = torch.zeros(d, d, dtype=torch.float64, device=dev)
    for _, _, R in stream_rows(borders, V, "value", apply_norm_gain):
        Rc = R - mu
        del R
        C64 += (Rc.t() @ Rc).double()  # one float32 GEMM per block, summed in float64
        del Rc
    C = (C64 / V).float()
    blocks, neurons, means, stds = [], [], [], []
    for v in block_views(borders):
        W = v.W_out.detach().to(dev, torch.float32)  # [d_ff, d]
        means.append(W @ mu)
        stds.append(((W @ C) * W).sum(-1).clamp_min(0).sqrt())
        blocks.append(torch.full((W.shape[0],), v.index, dtype=torch.long, device=dev))
        neurons.append(torch.arange(W.shape[0], device=dev))
        del W
        release_pages(v.W_out.detach())  # read once: its checkpoint pages may go (models.files.pages)
    return ValueStats(blocks=torch.cat(blocks), neurons=torch.cat(neurons), mean=torch.cat(means),
                      std=torch.cat(stds), apply_norm_gain=bool(apply_norm_gain))


@dataclass(frozen=True)
class TokenSearch:
    """The value vectors that most single out one token, promoting it or suppressing it, over all blocks.

    Attributes:
        token_id: the token searched (the target every row serves).
        promote_blocks, promote_neurons: [k] block and neuron, best first (largest z).
        promote_z: [k] the ranking key, ``z_t(v)`` (see the module docstring).
        promote_scores: [k] the raw logit per unit, ``R[t]·v``.
        promote_ranks: [k] int64, the token's rank among the vector's logits (0 = its top token).
        suppress_blocks, suppress_neurons, suppress_z, suppress_scores: the same for the most negative z.
        suppress_ranks: [k] int64, the token's rank from the bottom (0 = the vector's most suppressed).
        apply_norm_gain: whether the final norm's gain was applied.
        criterion: the ranking criterion, in words.
    """

    token_id: int
    promote_blocks: torch.Tensor
    promote_neurons: torch.Tensor
    promote_z: torch.Tensor
    promote_scores: torch.Tensor
    promote_ranks: torch.Tensor
    suppress_blocks: torch.Tensor
    suppress_neurons: torch.Tensor
    suppress_z: torch.Tensor
    suppress_scores: torch.Tensor
    suppress_ranks: torch.Tensor
    apply_norm_gain: bool
    criterion: str = CRITERION


def _z(stats: ValueStats, raw: torch.Tensor) -> torch.Tensor:
    """z-scores [N]; a vector with zero spread over the vocabulary (e.g. all zeros) gets 0."""
    std = stats.std
    return torch.where(std > 0, (raw - stats.mean) / std.clamp_min(torch.finfo(std.dtype).tiny), 0.0)


def _ranks(borders: Borders, X: torch.Tensor, t: int, k: int, step: int, apply_norm_gain: bool) -> torch.Tensor:
    """Token t's rank among each vector's logits over the real vocabulary, [2k] int64: from the top for
    X[:k], from the bottom for X[k:]. Streamed over blocks of readout rows, the block holding t first
    (the reference score s_t comes from the same GEMM kernel as every other column's)."""
    V = borders.real_vocab_size
    sign = torch.ones(len(X), 1, device=X.device)
    sign[k:] = -1  # suppress rows: ranked from the bottom
    blocks = sorted(vocab_blocks(V, int(borders.d_model)), key=lambda ab: not ab[0] <= t < ab[1])
    ranks = torch.zeros(len(X), dtype=torch.long, device=X.device)
    ref = None
    for a, b in blocks:
        R = readout_rows(borders, slice(a, b), apply_norm_gain)
        S = torch.cat([(X[i:i + step] @ R.t()) * sign[i:i + step] for i in range(0, len(X), step)])  # [2k, b-a]
        if ref is None:
            ref = S[:, t - a:t - a + 1].clone()
        ranks += (S > ref).sum(1)
        del R, S  # before the next block is made
        release_pages(borders.unembedding.weight.detach()[a:b])
    return ranks


def search_tokens(borders: Borders, token_ids: Sequence[int], k: int = 10, apply_norm_gain: bool = True,
                  stats: ValueStats | None = None) -> list[TokenSearch]:
    """For each token, the k value vectors with the largest and the k with the most negative z-score.

    Args:
        borders: the model's borders.
        token_ids: tokens of the real vocabulary (at least one).
        k: vectors kept at each end, per token (1..N).
        apply_norm_gain: read through the final norm's gain (the model's own map, up to scale).
        stats: :func:`value_stats` of this model with the same ``apply_norm_gain`` (computed when None).

    Returns:
        One :class:`TokenSearch` per token, in the order given. Cost after the stats: 2·N·d FLOPs per
        token for the scores, plus 2·(2k)·V·d to rank the token inside the 2k vectors listed.

    Raises:
        BadInput: no token, a token outside the real vocabulary, bad k, stats of another reading.
        UnsupportedArchitecture: a block without a dense MLP.
    """
    ids = [check_token(borders, t) for t in token_ids]
    if not ids:
        raise BadInput("no token to search: give at least one")
    if stats is None:
        stats = value_stats(borders, apply_norm_gain)
    elif stats.apply_norm_gain != bool(apply_norm_gain):
        raise BadInput("stats were computed with a different apply_norm_gain than this search")
    N = len(stats.mean)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= N:
        raise BadInput(f"`k` must be an integer between 1 and the number of value vectors {N}; got {k!r}")
    dev = borders.read_device
    views = block_views(borders)
    rows = readout_rows(borders, ids, apply_norm_gain)  # [T, d], the readout's rows bit for bit
    raw = []
    for v in views:
        W = v.W_out.detach()
        raw.append(W.to(dev, torch.float32) @ rows.t())
        release_pages(W)  # read once here: its checkpoint pages may go (models.files.pages)
    raw = torch.cat(raw)  # [N, T]
    real = borders.real_vocab_size
    step = rows_per_chunk(real)
    out = []
    for j, t in enumerate(ids):
        z = _z(stats, raw[:, j])
        hi = torch.topk(z, k)
        lo = torch.topk(z, k, largest=False)
        idx = torch.cat([hi.indices, lo.indices])
        ln = torch.stack([stats.blocks[idx], stats.neurons[idx]]).tolist()  # one host transfer per token
        X = gather_vectors(borders, ln[0], ln[1]).to(dev)
        ranks = _ranks(borders, X, t, k, step, apply_norm_gain)
        out.append(TokenSearch(
            token_id=t, promote_blocks=stats.blocks[hi.indices], promote_neurons=stats.neurons[hi.indices],
            promote_z=hi.values, promote_scores=raw[hi.indices, j], promote_ranks=ranks[:k],
            suppress_blocks=stats.blocks[lo.indices], suppress_neurons=stats.neurons[lo.indices],
            suppress_z=lo.values, suppress_scores=raw[lo.indices, j], suppress_ranks=ranks[k:],
            apply_norm_gain=bool(apply_norm_gain)))
    return out


def search_token(borders: Borders, token_id: int, k: int = 10, apply_norm_gain: bool = True,
                 stats: ValueStats | None = None) -> TokenSearch:
    """:func:`search_tokens` for one token: the value vectors that most single out ``token_id``."""
    return search_tokens(borders, [token_id], k=k, apply_norm_gain=apply_norm_gain, stats=stats)[0]
