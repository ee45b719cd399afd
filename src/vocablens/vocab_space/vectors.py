"""FFN value and key vectors read in vocabulary space (Dar et al. 2022 §2-3; Geva et al. 2022 §3).

A value vector (row i of the down projection's transpose: what neuron i writes per unit of
activation) is read through the readout (:mod:`.readout`); a key vector (a gate row of a gated MLP,
else an up-projection row: what decides whether the neuron fires) through the *input* embedding,
because it is compared with the stream entering the block. Reading all value vectors is
L x d_ff x V numbers (SmolLM2-135M: 30 x 1536 x 49152 = 9 GB in float32); nothing here holds more
than one chunk of rows x V at a time, keeping only the top-k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import BlockView, block_view, block_views
from vocablens.models.files.pages import release_pages
from vocablens.vocab_space.readout import TopBottom, check_block, check_k, rows_per_chunk, stream_rows


@dataclass(frozen=True)
class VectorProjection:
    """FFN value (or key) vectors read in vocabulary space.

    Attributes:
        kind: ``value`` (read through the unembedding) or ``key`` (read through the input embedding).
        blocks: [n] int64 block index of each vector (it writes stream layer ``block + 1``).
        neurons: [n] int64 neuron index within its block.
        norms: [n] float32, L2 norm of each vector.
        top_ids, top_scores: [n, k] tokens the vector promotes most, and their scores (logits per unit).
        bottom_ids, bottom_scores: [n, k] tokens it suppresses most (most negative scores).
        apply_norm_gain: whether the final norm's gain was applied (values only).
    """

    kind: str
    blocks: torch.Tensor
    neurons: torch.Tensor
    norms: torch.Tensor
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    bottom_ids: torch.Tensor
    bottom_scores: torch.Tensor
    apply_norm_gain: bool


def gather_vectors(borders: Borders, blocks: Sequence[int], neurons: Sequence[int], kind: str = "value"
                   ) -> torch.Tensor:
    """The value (or key) vectors of the given (block, neuron) pairs, [n, d_model] float32.

    Raises:
        BadInput: unequal lengths, no pair, a block or neuron out of range, a bad kind.
        UnsupportedArchitecture: a block without a dense MLP (mixture of experts).
    """
    if kind not in ("value", "key"):
        raise BadInput(f"kind must be 'value' or 'key'; got {kind!r}")
    if len(blocks) != len(neurons):
        raise BadInput(f"{len(blocks)} blocks but {len(neurons)} neurons")
    if len(blocks) == 0:
        raise BadInput("no vectors to project: give at least one block and neuron")
    views: dict[int, BlockView] = {}
    vecs = []
    for ly, n in zip(blocks, neurons):
        ly, n = int(ly), int(n)
        check_block(borders, ly)
        v = views.get(ly) or views.setdefault(ly, block_view(borders, ly))
        if not 0 <= n < v.d_ff:
            raise BadInput(f"neuron {n} is out of range: block {ly} has neurons 0..{v.d_ff - 1}")
        vecs.append((v.W_out[n] if kind == "value" else v.keys[n]).detach().float())
    out = torch.stack(vecs)
    for v in views.values():  # a row of W_out is a column of the down projection: every page was read
        release_pages((v.W_out if kind == "value" else v.keys).detach())
    return out


def project_vectors(borders: Borders, blocks: Sequence[int], neurons: Sequence[int], k: int = 10,
                    kind: str = "value", apply_norm_gain: bool = True, chunk_rows: int | None = None
                    ) -> VectorProjection:
    """Project FFN value (or key) vectors into vocabulary space (Dar et al. 2022 §2; Geva et al. 2022 §3).

    Args:
        borders: the model's borders.
        blocks: a sequence as long as ``neurons``; vector j is neuron ``neurons[j]`` of block ``blocks[j]``.
        neurons: neuron indices, one per entry of ``blocks``.
        k: tokens kept at each end (1..V).
        kind: ``value``: row i of ``W_out`` [d_ff, d] read as ``R v`` with R the readout
            (:func:`~vocablens.vocab_space.readout.readout`); ``key``: row i of the gate (gated MLPs) or
            up projection read against the input embedding ``E k`` (input scale, input norm and ``project_in``).
        apply_norm_gain: apply the final norm's gain before the unembedding (values only).
        chunk_rows: vectors scored per chunk (default: as many as 64 MiB of [rows, V] scores).

    Returns:
        :class:`VectorProjection` with n = len(blocks) rows, in the order given; among equal scores
        the lowest token id comes first. Cost: 2·n·V·d FLOPs; memory: one block of readout (or
        embedding) rows (:func:`~vocablens.vocab_space.readout.vocab_blocks`, 8 MiB) and its scores
        against a chunk of vectors, never the [V, d] matrix.

    Raises:
        BadInput: unequal lengths, a block or neuron out of range, bad k or kind.
        UnsupportedArchitecture: a block without a dense MLP (mixture of experts).
    """
    X = gather_vectors(borders, blocks, neurons, kind)  # [n, d_model]
    real = borders.real_vocab_size
    check_k(k, real)
    X = X.to(borders.read_device if kind == "value" else borders.input_embedding.device)
    step = rows_per_chunk(real, chunk_rows)
    parts = [TopBottom(k) for _ in range(0, len(X), step)]
    for a, _, R in stream_rows(borders, real, kind, apply_norm_gain):  # [rows, d] blocks, never [V, d]
        for j, i in enumerate(range(0, len(X), step)):
            parts[j].add(X[i:i + step] @ R.t(), a)
        del R  # before the next block is made
    parts = [p.result() for p in parts]
    # cpu: the [n, k] result and its labels, once, at the end
    ti, tv, bi, bv = (torch.cat([p[j] for p in parts]).cpu() for j in range(4))
    blocks_t = torch.tensor([int(x) for x in blocks])  # cpu: result labels
    neurons_t = torch.tensor([int(x) for x in neurons])  # cpu: result labels
    return VectorProjection(kind=kind, blocks=blocks_t, neurons=neurons_t, norms=X.norm(dim=-1).cpu(),  # cpu: result
                            top_ids=ti, top_scores=tv, bottom_ids=bi, bottom_scores=bv,
                            apply_norm_gain=bool(apply_norm_gain and kind == "value"))


def sample_neurons(borders: Borders, per_block: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """``per_block`` distinct neurons drawn uniformly from every block (deterministic for a seed).

    Returns:
        ``(blocks, neurons)`` lists of length L·per_block, block-major, neurons sorted in a block.

    Raises:
        BadInput: per_block < 1. UnsupportedArchitecture: a block without a dense MLP.
    """
    if isinstance(per_block, bool) or not isinstance(per_block, int) or per_block < 1:
        raise BadInput(f"`per_block` must be an integer of at least 1; got {per_block!r}")
    g = torch.Generator().manual_seed(int(seed))  # cpu: the same draw on every device
    blocks, neurons = [], []
    for v in block_views(borders):
        idx = torch.randperm(v.d_ff, generator=g)[: min(per_block, v.d_ff)].sort().values  # cpu: seeded draw
        blocks += [v.index] * len(idx)
        neurons += idx.tolist()
    return blocks, neurons
