"""The embedding lookup as a gather, with two backwards, and its address arithmetic.

Forward: ``out[..., :] = W[ids[...], :] · scale`` (an ``index_select``; the one-hot product
``one_hot(ids) @ W`` gives the same rows at 2·V·d FLOPs per token). Backward adds each output
gradient back to the row it came from; repeated ids accumulate, rows never looked up get zero:

* ``backward="index_add"``: ``grad_W.index_add_(0, ids, grad_out)`` (atomic adds on a GPU);
* ``backward="sort"``: sort the ids, sum each run of equal ids (a segment sum over the sorted
  gradient rows), then write one row per distinct id — the deterministic GPU strategy
  (PyTorch's ``embedding_dense_backward`` sorts ids on CUDA; Megatron's deterministic mode).

Both accumulate in float32 whatever the weight dtype and cast once. The padding row (``padding_idx``)
gets no gradient, as in ``torch.nn.Embedding``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops._checks import check_choice, check_float, check_ids, check_int, check_real

BACKWARDS = ("index_add", "sort")


def _grad_index_add(grad: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    g32 = torch.zeros(V, grad.shape[-1], dtype=torch.float32, device=grad.device)
    g32.index_add_(0, ids, grad.to(torch.float32))
    return g32


def _grad_sorted(grad: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    order = torch.argsort(ids, stable=True)
    sid = ids[order]
    rows = grad.to(torch.float32)[order]
    uniq, counts = torch.unique_consecutive(sid, return_counts=True)
    # segment sums via a cumulative sum over the sorted rows: sum of run = csum[end] - csum[start-1]
    csum = torch.cumsum(rows.to(torch.float64), 0)
    ends = torch.cumsum(counts, 0) - 1
    seg = csum[ends]
    seg[1:] -= csum[ends[:-1]]
    g32 = torch.zeros(V, grad.shape[-1], dtype=torch.float32, device=grad.device)
    g32[uniq] = seg.to(torch.float32)
    return g32


class _EmbeddingLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, W, ids_flat, scale, padding_idx, backward):
        ctx.save_for_backward(ids_flat)
        ctx.V, ctx.scale, ctx.padding_idx, ctx.backward = W.shape[0], scale, padding_idx, backward
        ctx.wdtype = W.dtype
        out = W.index_select(0, ids_flat)
        if scale is not None:
            out = out * torch.tensor(scale, dtype=out.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        g = grad_out
        if ctx.scale is not None:
            g = g.to(torch.float32) * ctx.scale
        if ctx.padding_idx is not None:
            keep = ids != ctx.padding_idx
            ids, g = ids[keep], g[keep]
        fn = _grad_index_add if ctx.backward == "index_add" else _grad_sorted
        return fn(g, ids, ctx.V).to(ctx.wdtype), None, None, None, None


def embedding_lookup(W: torch.Tensor, ids: torch.Tensor, scale: float | None = None,
                     padding_idx: int | None = None, *, backward: str = "index_add") -> torch.Tensor:
    """Rows of ``W`` for each id, times ``scale``: a gather, not a matrix product.

    Args:
        W: [V, d] float embedding matrix (any float dtype; the output has the same dtype).
        ids: [...] integer token ids in [0, V).
        scale: optional input scale (Gemma multiplies by sqrt(d_model); Vaswani et al. 2017 §3.4).
        padding_idx: a row that receives no gradient (``torch.nn.Embedding`` semantics); negative
            values count from the end.
        backward: "index_add" (scatter-add by index) or "sort" (sort ids, sum runs, one write per id).

    Returns:
        [..., d] tensor in W's dtype; differentiable with respect to W.

    Raises:
        ShapeMismatch: W is not 2-D float, ids are not integers.
        BadInput: an id outside [0, V) (never a silent wrong row), padding_idx not an int in [-V, V),
            unknown backward, scale not a finite number, V = 0.
    """
    check_float("W", W)
    if W.dim() != 2:
        raise ShapeMismatch(f"W must be [V, d]; got shape {tuple(W.shape)}")
    V = W.shape[0]
    if V == 0:
        raise BadInput(f"W {tuple(W.shape)} has no rows")
    check_choice("backward", backward, BACKWARDS)
    if scale is not None:
        scale = check_real("scale", scale)
    check_ids("ids", ids, V)
    if padding_idx is not None:
        if not -V <= check_int("padding_idx", padding_idx) < V:
            raise BadInput(f"padding_idx {padding_idx} outside [-{V}, {V}) for W {tuple(W.shape)}")
        padding_idx = padding_idx % V
    flat = ids.reshape(-1).to(torch.int64)
    if flat.device != W.device:
        flat = flat.to(W.device)
    out = _EmbeddingLookup.apply(W, flat, None if scale is None else float(scale), padding_idx, backward)
    return out.reshape(*ids.shape, W.shape[1])


@dataclass(frozen=True)
class LookupCost:
    """Address arithmetic and traffic of one embedding lookup.

    Attributes:
        row_offsets: [n] int64 byte offset of each looked-up row from the matrix base
            (``id · stride_row · element_size``; row i starts at base + i·d·bytes for a contiguous W).
        addresses: [n] int64 absolute addresses (``W.data_ptr() + offset``); 0-based when W is on meta.
        row_bytes: bytes of one row (d · element_size).
        bytes_read: bytes the gather reads (n · row_bytes; repeated ids counted every time).
        unique_bytes_read: bytes of the distinct rows (what a cache would fetch once).
        matrix_bytes: bytes of the whole matrix (what the LM head's GEMM reads).
        onehot_flops: FLOPs of the equivalent one-hot product (2·V·d per token; a gather does none).
    """

    row_offsets: torch.Tensor
    addresses: torch.Tensor
    row_bytes: int
    bytes_read: int
    unique_bytes_read: int
    matrix_bytes: int
    onehot_flops: int


def lookup_cost(W: torch.Tensor, ids: torch.Tensor) -> LookupCost:
    """Addresses and bytes read by looking up ``ids`` in ``W`` (works on meta tensors too).

    Example (the seeds' numbers): 64 tokens of a bf16 [151936, 1024] matrix read 64·1024·2 =
    131,072 bytes, while the matrix is 311,164,928 bytes; row 42 starts 86,016 bytes in.

    Args:
        W: [V, d] float tensor (its strides and element size are used; ``device="meta"`` is fine).
        ids: [...] integer ids in [0, V).

    Returns:
        :class:`LookupCost` (bytes, FLOPs as 2 per multiply-add).

    Raises:
        ShapeMismatch / BadInput: as :func:`embedding_lookup`.
    """
    check_float("W", W)
    if W.dim() != 2:
        raise ShapeMismatch(f"W must be [V, d]; got shape {tuple(W.shape)}")
    V, d = W.shape
    check_ids("ids", ids, V)
    flat = ids.reshape(-1).to(torch.int64).cpu()  # cpu: an accounting of addresses, not a compute path
    es = W.element_size()
    offsets = flat * (W.stride(0) * es)
    base = 0 if W.device.type == "meta" else W.data_ptr()
    row_bytes = d * es
    n_unique = int(torch.unique(flat).numel()) if flat.numel() else 0
    return LookupCost(row_offsets=offsets, addresses=offsets + base, row_bytes=row_bytes,
                      bytes_read=flat.numel() * row_bytes, unique_bytes_read=n_unique * row_bytes,
                      matrix_bytes=V * d * es, onehot_flops=2 * V * d * flat.numel())
