"""Where the lens and its evaluation read V: in one process, or split over tensor-parallel ranks.

The logit lens (:mod:`vocablens.lens.logit`) and the lens evaluation (:mod:`vocablens.lens.evaluate`)
need four things over the vocabulary: one forward that records the residual stream and the model's
own logits, the argmax of those logits, and the lens statistics of stacked hidden states against
them (:func:`vocablens.ops.kl_readout`, :func:`vocablens.ops.logits_readout`).
:func:`readout_path` hands them out for a model:

- :class:`OneProcess`: the model's own logits [N, V] and the chunked ops, as they always ran;
- :class:`TensorParallel`, for a model loaded with ``tp=True``
  (:mod:`vocablens.models.tensor_parallel`): the forward runs the base decoder on every rank (the
  residual stream is whole there), the model's logits are this rank's columns [N, V_r] of its own
  head applied to its own final hidden state, and every statistic is combined across ranks
  (:mod:`vocablens.ops.vocab_parallel.readout`): [N, V] is never gathered.

Every rank must make the same calls in the same order (collectives).
"""

from __future__ import annotations

import torch

from vocablens.errors import UnsupportedArchitecture
from vocablens.models.tensor_parallel import is_tensor_parallel, local_rows, whole
from vocablens import ops
from vocablens.ops.vocab_parallel import VocabParallelLMHead, shard_range
from vocablens.ops.vocab_parallel.comm import world
from vocablens.ops.vocab_parallel.functional import vocab_parallel_argmax
from vocablens.ops.vocab_parallel.readout import vocab_parallel_kl_readout, vocab_parallel_logits_readout


def tensor_parallel_head(U, group=None) -> VocabParallelLMHead:
    """The vocab-parallel head of a tensor-parallel load: this rank's rows of the plan's LM head
    (no copy) as a :class:`~vocablens.ops.vocab_parallel.VocabParallelLMHead`.

    The plan's split (``torch.chunk``'s: ceil(V/N) rows a rank) and vocablens's
    (:func:`~vocablens.ops.vocab_parallel.shard_range`: the first V mod N ranks one row more) agree for
    2 ranks and whenever N divides V; otherwise every rank takes its rows from the whole matrix once
    (``full_tensor()``, decided from V and N alone, so every rank takes the same branch).
    """
    rank, ws = world(group)
    V, d = int(U.weight.shape[0]), int(U.weight.shape[1])
    start, stop = shard_range(V, ws, rank)
    chunk = -(-V // ws)
    if all(shard_range(V, ws, r) == (min(V, r * chunk), min(V, (r + 1) * chunk)) for r in range(ws)):
        got, W = local_rows(U.weight)
        b = None if U.bias is None else local_rows(U.bias)[1]
        if got != start:  # pragma: no cover  (a plan that splits otherwise than torch.chunk)
            raise UnsupportedArchitecture("tensor parallel", [f"rows from {got}"], "unexpected split of the LM head")
    else:
        W = whole(U.weight.detach())[start:stop]
        b = None if U.bias is None else whole(U.bias.detach())[start:stop]
    head = VocabParallelLMHead(d, V, b is not None, group, softcap=U.softcap, logit_scale=U.logit_scale,
                               dtype=W.dtype, device="meta")
    head.weight = torch.nn.Parameter(W.detach(), requires_grad=False)
    if b is not None:
        head.bias = torch.nn.Parameter(b.detach(), requires_grad=False)
    return head


class OneProcess:
    """The readout of a model held whole by this process (the model's own logits [N, V])."""

    def __init__(self, borders) -> None:
        self.borders, self.U = borders, borders.unembedding.float32()
        self._w32: torch.Tensor | None = None

    def stream(self, ids: torch.Tensor, mask: torch.Tensor | None = None):
        """ids [B, T] -> ``(resid [L+1, B, T, d_model], the model's logits [B, T, V] float32)``."""
        return self.borders.residual_stream(ids, mask)

    def argmax(self, ref: torch.Tensor, cols: int) -> torch.Tensor:
        """Top-1 ids [N] of logits ``ref`` [N, V] over the first ``cols`` columns."""
        return ref[:, :cols].argmax(-1)

    def kl(self, X: torch.Tensor, ref: torch.Tensor, float32: bool = False, **kw):
        """:func:`vocablens.ops.kl_readout` of head inputs X through W_U against ``ref``; ``float32``:
        the GEMM in float32 whatever W_U's dtype (a float32 copy of W_U, made once)."""
        return ops.kl_readout(X, self._weight(float32), ref, **kw)  # looked up at call time (tests wrap it)

    def _weight(self, float32: bool) -> torch.Tensor:
        W = self.U.weight.detach()
        if not float32 or W.dtype == torch.float32:
            return W
        if self._w32 is None:
            self._w32 = W.float()
        return self._w32

    def final(self, ref: torch.Tensor, **kw):
        """:func:`vocablens.ops.logits_readout` of the model's own logits against themselves."""
        return ops.logits_readout(ref, ref, **kw)


class TensorParallel(OneProcess):
    """The readout of a tensor-parallel load: this rank's columns, statistics combined across ranks."""

    def __init__(self, borders) -> None:
        super().__init__(borders)
        self.head = tensor_parallel_head(self.U)
        self.start, self.V = self.head.vocab_start, self.head.V

    def stream(self, ids: torch.Tensor, mask: torch.Tensor | None = None):
        """ids [B, T] -> ``(resid [L+1, B, T, d_model], this rank's columns [B, T, V_r] of the model's
        logits)``: the base decoder runs on every rank, its head is read vocab-parallel."""
        from vocablens.models.blocks_forward import check_forward_input, check_stream_finite

        b = self.borders
        ids = check_forward_input(b, ids)
        dec = b.model.get_decoder()
        with b.capture() as store, torch.no_grad():
            h = dec(input_ids=ids.to(b.device), attention_mask=mask, use_cache=False).last_hidden_state
        missing = [i for i in range(b.n_layers + 1) if i not in store]
        if missing:
            raise UnsupportedArchitecture(b.family, [type(dec).__name__], f"residual stream not captured at {missing}")
        resid = torch.stack([store[i] for i in range(b.n_layers + 1)])
        z = self.head(h)  # [B, T, V_r] float32, the head's transform applied
        check_stream_finite(b, resid, z, mask)
        return resid, z

    def argmax(self, ref: torch.Tensor, cols: int) -> torch.Tensor:
        gid = self.start + torch.arange(ref.shape[-1], device=ref.device)
        return vocab_parallel_argmax(ref.masked_fill(gid >= cols, -torch.inf), self.start)

    def kl(self, X: torch.Tensor, ref: torch.Tensor, float32: bool = False, **kw):
        kw = {k: v for k, v in kw.items() if k not in ("bias", "logit_scale", "softcap", "chunk_rows", "chunk_bytes")}
        W = self.head.weight.float() if float32 else self.head.weight
        return vocab_parallel_kl_readout(X, W, ref, self.start, self.V, bias=self.head.bias,
                                         logit_scale=self.head.logit_scale, softcap=self.head.softcap, **kw)

    def final(self, ref: torch.Tensor, **kw):
        return vocab_parallel_logits_readout(ref, ref, self.start, self.V, **kw)


def readout_path(borders) -> OneProcess:
    """:class:`TensorParallel` for a model loaded with ``tp=True`` (memoized on the borders), else
    :class:`OneProcess`."""
    if not is_tensor_parallel(borders):
        return OneProcess(borders)
    if "tp_readout" not in borders._memo:
        borders._memo["tp_readout"] = TensorParallel(borders)
    return borders._memo["tp_readout"]


__all__ = ["OneProcess", "TensorParallel", "readout_path", "tensor_parallel_head"]
