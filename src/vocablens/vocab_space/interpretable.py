"""The value vectors a reader learns most from: those whose top tokens stand out of their own logits.

Projecting every value vector costs 2·N·V·d FLOPs (SmolLM2-135M: 2.6 TFLOP), so a fixed random
sample of neurons per block is read, and each is scored by how far its top-k tokens stand above its
own distribution of logits over the vocabulary: the mean z-score of its k largest logits,
``mean_{t in top-k} (s_t - mean_w s_w) / std_w s_w`` (the criterion of the reverse search,
:mod:`.search`, applied to the vector's own top tokens; Geva et al. 2022 §3 read a vector by its top
tokens, Dar et al. 2022 §3 likewise). A vector whose top tokens are one theme (' he' ' him' ' his',
or number words) scores ~15-20; one whose top is a spread of unrelated fragments scores ~5. It is
scale-free, so high-norm late neurons are not favoured for their norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.vocab_space.readout import TopBottom, check_k, rows_per_chunk, stream_rows
from vocablens.vocab_space.vectors import VectorProjection, gather_vectors, sample_neurons


@dataclass(frozen=True)
class InterpretableVectors:
    """The chosen value vectors, best first, and how they were chosen.

    Attributes:
        vectors: :class:`~vocablens.vocab_space.vectors.VectorProjection` of the chosen rows (k tokens
            at each end), best first.
        top_z: [n] float32, each row's criterion: the mean z-score of its k top logits.
        criterion: the criterion and the sample, in words.
        n_candidates: vectors read (per_block per block).
    """

    vectors: VectorProjection
    top_z: torch.Tensor
    criterion: str
    n_candidates: int


def _int(name: str, x, lo: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise BadInput(f"{name} must be an integer >= {lo}; got {x!r}")
    return x


def _top_z(borders: Borders, X: torch.Tensor, step: int, k: int, apply_norm_gain: bool):
    """Each vector of ``X`` [N, d] scored against every real readout row, ``step`` vectors at a time:
    -> (per chunk, the :class:`TopBottom` result (top ids, top scores, bottom ids, bottom scores),
    the criterion [N] float32 on the host: the mean z-score of its top k logits within its own logits)."""
    real = borders.real_vocab_size
    chunks = list(range(0, len(X), step))
    tbs = [TopBottom(k) for _ in chunks]
    # each vector's mean and M2 = Σ (s - mean)² over the vocabulary: per block in float32 (var_mean),
    # merged across blocks in float64 (Chan, Golub and LeVeque 1979's pairwise update)
    mean = torch.zeros(len(X), dtype=torch.float64, device=X.device)
    m2 = torch.zeros_like(mean)
    for a, b, R in stream_rows(borders, real, "value", apply_norm_gain):  # [rows, d] blocks, never [V, d]
        for tb, i in zip(tbs, chunks):
            S = X[i:i + step] @ R.t()  # [c, rows]
            tb.add(S, a)
            var_b, mean_b = torch.var_mean(S, dim=1, correction=0)
            delta = mean_b.double() - mean[i:i + step]
            mean[i:i + step] += delta * ((b - a) / b)
            m2[i:i + step] += var_b.double() * (b - a) + delta * delta * (a * (b - a) / b)
            del S
        del R  # before the next block is made
    std = (m2 / real).sqrt()
    parts = [tb.result() for tb in tbs]
    tiny = torch.finfo(torch.float32).tiny
    crit = [((p[1].double() - mean[i:i + step, None]) / std[i:i + step, None].clamp_min(tiny)).mean(1).float()
            for p, i in zip(parts, chunks)]
    return parts, torch.cat(crit).cpu()  # cpu: once; the selection is a host loop


def _best_per_block(score: torch.Tensor, blocks: list[int], n: int, max_per_block: int | None) -> list[int]:
    """Indices of the ``n`` best ``score`` [N] (ties by index), at most ``max_per_block`` from one block."""
    chosen, per = [], {}
    for j in torch.argsort(score, descending=True, stable=True).tolist():
        if len(chosen) == n:
            break
        if max_per_block is None or per.get(blocks[j], 0) < max_per_block:
            chosen.append(j)
            per[blocks[j]] = per.get(blocks[j], 0) + 1
    return chosen


def interpretable_vectors(borders: Borders, n: int = 20, per_block: int = 32, k: int = 8,
                          max_per_block: int | None = 2, seed: int = 0, apply_norm_gain: bool = True,
                          chunk_rows: int | None = None) -> InterpretableVectors:
    """The ``n`` most interpretable of ``per_block`` random value vectors per block (see the module docstring).

    Args:
        borders: the model's borders.
        n: vectors returned (fewer when the sample is smaller).
        per_block: neurons drawn per block (:func:`~vocablens.vocab_space.vectors.sample_neurons`, ``seed``).
        k: top tokens the criterion averages over, and tokens listed at each end.
        max_per_block: at most this many vectors from one block (None: no cap), so the list spans depth.
        apply_norm_gain: read through the final norm's gain.
        chunk_rows: vectors projected at once (default: 64 MiB of logits).

    Returns:
        :class:`InterpretableVectors`. Cost: 2·L·per_block·V·d FLOPs (SmolLM2-135M, per_block 32:
        56 GFLOP); memory: one 8 MiB block of readout rows and its scores against a chunk of vectors.
        Each vector's mean and variance over the vocabulary are per-block float32 moments merged
        across blocks in float64.

    Raises:
        BadInput: n, per_block, k or max_per_block out of range.
        UnsupportedArchitecture: a block without a dense MLP.
    """
    _int("n", n, 1)
    if max_per_block is not None:
        _int("max_per_block", max_per_block, 1)
    check_k(k, borders.real_vocab_size)
    blocks, neurons = sample_neurons(borders, _int("per_block", per_block, 1), seed)
    X = gather_vectors(borders, blocks, neurons).to(borders.read_device)
    step = rows_per_chunk(borders.real_vocab_size, chunk_rows)
    parts, score = _top_z(borders, X, step, k, apply_norm_gain)
    chosen = _best_per_block(score, blocks, n, max_per_block)
    sel = torch.tensor(chosen, dtype=torch.long)  # cpu: indices into the host result
    ti, tv, bi, bv = (torch.cat([p[q] for p in parts]).cpu()[sel] for q in range(4))  # cpu: the result, once
    blocks_t, neurons_t = torch.tensor(blocks)[sel], torch.tensor(neurons)[sel]  # cpu: result labels
    norms = X.norm(dim=-1).cpu()[sel]  # cpu: the result
    proj = VectorProjection(kind="value", blocks=blocks_t, neurons=neurons_t,
                            norms=norms, top_ids=ti, top_scores=tv, bottom_ids=bi,
                            bottom_scores=bv, apply_norm_gain=bool(apply_norm_gain))
    cap = "" if max_per_block is None else f", at most {max_per_block} per block"
    criterion = (f"the mean z-score of each vector's top {k} logits within its own logits over the vocabulary "
                 f"(how far its top tokens stand out), best {len(chosen)} of {len(blocks)} random neurons "
                 f"({per_block} per block, seed {seed}){cap}")
    return InterpretableVectors(vectors=proj, top_z=score[sel], criterion=criterion, n_candidates=len(blocks))
