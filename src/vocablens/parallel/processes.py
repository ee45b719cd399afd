"""Running analyses over several processes (``torch.distributed``, launched by torchrun).

Two ways of splitting the work, both active only when a process group with more than one rank is
initialised (:func:`init_from_env` joins the one torchrun describes; without it everything runs as a
world of one and nothing changes):

- **Rows** (data parallel: ``lens eval``, ``settle``): :func:`~vocablens.ops.vocab_parallel.comm.share` gives each rank a contiguous
  slice of the token rows (the first ``N % world`` ranks one row more; a rank may get none), each rank
  computes sums over its slice, and :func:`~vocablens.ops.vocab_parallel.comm.allreduce_sum` adds them in float64, so the means equal one
  process's up to float rounding. Per-position results are put back in row order by
  :func:`~vocablens.ops.vocab_parallel.comm.gather_columns` (exact).
- **Vocabulary** (model parallel over V: ``score``, ``generate``): :class:`VocabParallelModel` keeps
  only this rank's contiguous slice of the embedding and LM head rows
  (:class:`~vocablens.ops.vocab_parallel.VocabParallelEmbedding` /
  :class:`~vocablens.ops.vocab_parallel.VocabParallelLMHead`, Megatron-LM, Shoeybi et al. 2019 §3)
  and frees the full matrices; log-probabilities, entropies and top-k come from logsumexp and
  all-reduces over the shards, never from gathered [T, V] logits.

Every rank must call the same functions in the same order (they are collectives).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from vocablens.errors import BadInput
from vocablens.ops.vocab_parallel import VocabParallelEmbedding, VocabParallelLMHead
from vocablens.ops.vocab_parallel.comm import world
from vocablens.ops.vocab_parallel.functional import vocab_parallel_gather_logits
from vocablens.ops.vocab_parallel.losses import vocab_parallel_token_logprobs
from vocablens.units import plural


def init_from_env(device: str = "cpu") -> tuple[int, int]:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1 in the environment): gloo for a
    CPU ``device``, NCCL for CUDA. Returns ``(rank, world)``; ``(0, 1)`` when not under torchrun.
    Idempotent (a group already initialised is reused)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


def common_seed(seed: int | None) -> int | None:
    """``seed`` itself, or when it is None in a world of several ranks one seed drawn on rank 0 and
    broadcast, so sampling draws the same tokens on every rank (their collectives stay in step)."""
    if seed is not None or world()[1] == 1:
        return seed
    import torch.distributed as dist

    t = torch.randint(0, 2 ** 62, (1,), generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 2))
    dist.broadcast(t, src=0)
    return int(t)


class _ShardedEmbedding(nn.Module):
    """Stands in for the model's token embedding: this rank's rows only, output the same on every rank."""

    def __init__(self, inner: VocabParallelEmbedding) -> None:
        super().__init__()
        self.inner = inner
        self.weight = inner.weight  # [V_r, d]: for code that reads the dtype or device of the embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(ids)


class VocabParallelModel:
    """A loaded model whose embedding and LM head rows are split over the ranks of ``group``.

    Built from a :class:`~vocablens.models.Borders` on every rank: each rank copies its contiguous
    slice ``[vocab_start, vocab_stop)`` of W_E and W_U (and b_U) and then frees the full matrices
    (the model's parameters are emptied in place: the borders' W_E / W_U become [0, d] and must not
    be used afterwards). The model's input embedding is replaced by the sharded one, so the base
    decoder runs unchanged (one all-reduce of [B, T, d] per forward). Per rank, the two matrices
    take ``(V_r/V)`` of their former bytes.

    A model loaded tensor-parallel (``vocablens.load(spec, tp=True)``) keeps its own split: the head
    is this rank's rows of the plan's sharded LM head (:func:`vocablens.lens.readout_path.tensor_parallel_head`),
    the embedding and blocks are left as the plan placed them.

    Implements the head protocol of :func:`vocablens.generate.generate` (``logits``, ``vocab_size``,
    ``d_emb``, ``real_mask``).

    Raises:
        BadInput: world size larger than V, or a model loaded with its borders only.
    """

    def __init__(self, borders, group=None) -> None:
        from vocablens.generate.loop import base_decoder

        from vocablens.models.tensor_parallel import is_tensor_parallel

        if any(p.is_meta for p in borders.blocks.parameters()):
            raise BadInput("the vocab-parallel model needs the whole model (it was loaded with its borders only)")
        U = borders.unembedding
        self.borders, self.group = borders, group
        self.decoder = base_decoder(borders)
        self.vocab_size, self.d_emb = int(U.weight.shape[0]), int(U.weight.shape[1])
        self.real_mask = U.real_mask
        if is_tensor_parallel(borders):  # the plan split the head (and the embedding) already
            from vocablens.lens.readout_path import tensor_parallel_head

            self.head = tensor_parallel_head(U, group)
            self.vocab_start, self.vocab_stop = self.head.vocab_start, self.head.vocab_stop
            return
        W, b = U.weight.detach(), None if U.bias is None else U.bias.detach()
        self.head = VocabParallelLMHead.from_full(W, b, group, softcap=U.softcap, logit_scale=U.logit_scale)
        E = borders.input_embedding
        vp = VocabParallelEmbedding.from_full(E.weight.detach(), group, scale=E.module_scale)
        self.vocab_start, self.vocab_stop = self.head.vocab_start, self.head.vocab_stop
        borders.model.set_input_embeddings(_ShardedEmbedding(vp))
        for p in {id(x): x for x in (E.weight, borders.unembedding.weight, borders.unembedding.bias) if x is not None}.values():
            p.data = p.data.new_empty((0,) + tuple(p.shape[1:]))  # free the full [V, d] (tied: once)

    def held_rows(self) -> int:
        """Vocabulary rows of W_U this rank holds (V_r)."""
        return int(self.head.weight.shape[0])

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> the head's input [B, T, d_emb] (after the final norm), the same on every rank."""
        return self.decoder(input_ids=ids.to(self.head.weight.device), use_cache=False).last_hidden_state

    @torch.no_grad()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Head input [..., d_emb] -> the full float32 logits [..., V] on every rank (one all-gather)."""
        return vocab_parallel_gather_logits(self.head(h), self.vocab_size, self.group)

    @torch.no_grad()
    def token_logprobs(self, h: torch.Tensor, targets: torch.Tensor, top_k: int = 0):
        """Per-position log p(target), entropy and top-k from sharded logits, without gathering them.

        Args:
            h: [N, d_emb] head inputs; targets: [N] int64 in [0, V); top_k: 0..V.

        Returns:
            ``(logprob [N], entropy [N], topk_ids [N, k], topk_logprobs [N, k])``, float32 nats,
            the same on every rank. Cost per rank: 2·N·V_r·d FLOPs and a few all-reduces of [N]
            (the entropy -Σ p log p accumulated in float64).
        """
        return vocab_parallel_token_logprobs(self.head(h), targets, self.vocab_start, self.vocab_size, top_k,
                                             self.group)

    def score(self, input_ids: torch.Tensor, top_k: int = 0, n_bytes: int = 0):
        """:func:`vocablens.generate.score.score_ids` with the head split over ranks (same result within 1e-5 nats).

        Raises:
            BadInput: fewer than 2 tokens, top_k outside [0, V].
        """
        from vocablens.generate.score import ScoreResult

        ids = input_ids.reshape(-1).to(torch.int64)
        if ids.numel() < 2:
            raise BadInput(f"the text has {plural(ids.numel(), 'token')}: scoring needs at least 2 (the first has no prefix)")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= self.vocab_size:
            raise BadInput(f"`top_k` must be an int in [0, {self.vocab_size}]; got {top_k!r}")
        h = self.hidden(ids[None])[0, :-1]
        lp, ent, ti, tl = self.token_logprobs(h, ids[1:], top_k)
        return ScoreResult(input_ids=ids, logprobs=lp.cpu(), entropy=ent.cpu(), topk_ids=ti.cpu(),
                           topk_logprobs=tl.cpu(), n_bytes=int(n_bytes))


__all__ = ["VocabParallelModel", "common_seed", "init_from_env"]
