"""The chunked path over the vocabulary: chunk sizes, reused buffers, one chunk of logits, row statistics.

Every op over V in :mod:`vocablens.ops` (log-probabilities, top-k, entropy, KL, cross-entropy)
walks the [N, V] logits as chunks of ``n`` tokens by tiles of ``v`` vocabulary columns, each written
into one reused float32 buffer by :func:`logits_into` (GEMM, then the head transform of
:func:`vocablens.logit_transform.transform_logits`), so [N, V] is never materialized.

Exactness: a row's log-normalizer is kept as two float32 numbers, the row max ``m`` and
``log s = log Σ_j exp(z_j - m)`` (0 <= log s <= log V), never as their sum: a log-probability is
``(z_t - m) - log s``, which depends only on logit differences. Adding m back (lse = m + log s)
rounds to the spacing of m (8 at m = 1e8) and would return log 4 ≈ 0 for four equal logits offset by 1e8.
Tiles are merged with :func:`merge_row_stats` (the blockwise, online log-sum-exp of Milakov &
Gimelshein 2018, "Online normalizer calculation for softmax", and of Cut Cross-Entropy, Wijmans et
al. 2024, arXiv 2411.09009, §3), again in the relative form.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from vocablens.errors import ShapeMismatch
from vocablens.logit_transform import transform_logits
from vocablens.ops._checks import INT_DTYPES

#: bounds of the default budget for one chunk of float32 logits, in bytes.
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 4 * 2**20, 64 * 2**20


def default_chunk_bytes(N: int, V: int) -> int:
    """Default float32 chunk budget (bytes): 1/32 of the full [N, V] float32 logits, within [4 MiB, 64 MiB]."""
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, N * V * 4 // 32)))


def chunk_sizes(N: int, V: int, chunk_bytes: int | None = None, *, min_tokens: int = 16,
                vocab_tiles: bool = True) -> tuple[int, int]:
    """Tokens per chunk and vocabulary columns per tile for a float32 chunk of ``chunk_bytes``.

    Args:
        N: number of tokens; V: vocabulary rows; chunk_bytes: budget for one [n, v] float32 chunk
            (bytes; default :func:`default_chunk_bytes`).
        min_tokens: never fewer tokens per chunk than this (GEMM efficiency).
        vocab_tiles: allow tiling the vocabulary; False forces full rows.

    Returns:
        ``(n_tokens, n_vocab)`` with ``n_tokens * n_vocab * 4 <= max(chunk_bytes, min_tokens * n_vocab * 4)``.
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(N, V)
    n = max(1, chunk_bytes // (4 * V))
    if not vocab_tiles:
        return int(max(1, min(N, max(n, min_tokens)))), V
    if n >= min(min_tokens, N):
        return int(max(1, min(N, n))), V
    n = max(1, min(N, min_tokens))
    v = max(256, chunk_bytes // (4 * n))
    return int(n), int(min(V, v))


def train_chunk_sizes(N: int, V: int, chunk_bytes: int | None = None, *, max_tokens: int = 8192,
                      min_vocab: int = 256, low_precision_grad: bool = False) -> tuple[int, int]:
    """Token-chunk and vocabulary-tile sizes of the training path for a float32 tile of ``chunk_bytes``.

    By default, full vocabulary rows for chunks of max(clamp(N/16, 128, 256), budget/4V) tokens (the
    one-pass fused path) when that fits 512 MiB: GEMMs with 256 rows run near full speed on CPU
    (128 rows at ~2/3), and a row-complete chunk needs a single pass. Otherwise (or with an explicit
    budget), token chunks are as long as possible (each chunk reads the whole of W four times: two
    logit GEMMs, grad_hidden, grad_W) and vocabulary tiles fill the rest of the budget but keep at
    least ``min_vocab`` columns. ``low_precision_grad`` (bf16/fp16 inputs, gradients wanted, default
    budget): full-row chunks of at least 256 tokens: each chunk's float32 weight-gradient GEMM reads
    and writes the whole float32 [V, d] accumulator, so fewer, longer chunks halve that traffic
    (measurement: docs/performance-ops.md).
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(N, V)
        n_full = max(chunk_bytes // (4 * V), min(N, max(128, min(256, N // 16))))
        if low_precision_grad:
            n_full = max(n_full, min(N, 256))
        if n_full * V * 4 <= 512 * 2**20:
            return int(min(N, n_full)), int(V)
    n = max(1, min(N, max_tokens))
    v = chunk_bytes // (4 * n)
    if v < min_vocab:
        v = min(V, min_vocab)
        n = max(1, min(n, chunk_bytes // (4 * v)))
    return int(n), int(max(1, min(V, v)))


def override_sizes(n_tok: int, n_voc: int, N: int, V: int, chunk_tokens: int | None,
                   chunk_vocab: int | None) -> tuple[int, int]:
    """Derived sizes replaced by the caller's ``chunk_tokens`` / ``chunk_vocab`` (when given), clamped to [1, N] x [1, V]."""
    n_tok = chunk_tokens if chunk_tokens else n_tok
    n_voc = chunk_vocab if chunk_vocab else n_voc
    return max(1, min(int(n_tok), N)), max(1, min(int(n_voc), V))


def flatten_tokens(hidden: torch.Tensor, targets: torch.Tensor | None):
    """``hidden [..., d]`` -> ``[N, d]``, ``targets [...]`` -> int64 ``[N]`` (or None), and the leading shape.

    Raises:
        ShapeMismatch: hidden has fewer than 2 dims, targets' shape differs from hidden's leading
        shape, or targets are not integer ids.
    """
    if hidden.dim() < 2:
        raise ShapeMismatch(f"hidden must be [N, d] or [B, T, d]; got {tuple(hidden.shape)}")
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    t = None
    if targets is not None:
        if not isinstance(targets, torch.Tensor):
            raise ShapeMismatch(f"targets must be a tensor of token ids; got {type(targets).__name__}")
        if tuple(targets.shape) != tuple(lead):
            raise ShapeMismatch(f"targets {tuple(targets.shape)} must match hidden {tuple(hidden.shape)} "
                                f"without its last dim, i.e. {tuple(lead)}")
        if targets.dtype not in INT_DTYPES:
            raise ShapeMismatch(f"targets must hold integer ids (int64/int32); got {targets.dtype} {tuple(targets.shape)}")
        t = targets.reshape(-1).to(torch.int64)
    return h, t, lead


LOW_PRECISION = (torch.bfloat16, torch.float16)


def gemm_operands(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The operands the logit GEMMs run on: ``(h, weight, bias)`` themselves, except bf16/fp16 on CPU,
    which are widened to float32 once per call (+ one float32 copy of W, 4·V·d bytes).

    Why: CPUs without native bf16 arithmetic run a bf16 GEMM several times slower than the float32
    one (measurement: docs/performance-ops.md), and a low-precision GEMM rounds every logit to
    8 (bf16) or 11 (fp16) bits. The float32 GEMM of the widened operands computes the exact products
    of the low-precision inputs and accumulates them in float32. Accelerators keep the
    low-precision GEMM (their fast path); its output is widened to float32 by :func:`logits_into`.
    """
    if h.dtype in LOW_PRECISION and h.device.type == "cpu":
        return h.float(), weight.float(), None if bias is None else bias.float()
    return h, weight, bias


class ChunkBuffers:
    """The reused buffers of one chunked pass: float32 ``buf`` for the logits, ``low`` in the input
    dtype for the GEMM output of bf16/fp16 inputs (None for float32), and ``aux`` (float32, only when
    asked: the transformed logits that the softcap's derivative needs after ``buf`` is overwritten).
    Each holds ``n_tok * n_voc`` elements; :meth:`view` returns an [n, v] view of one of them."""

    def __init__(self, n_tok: int, n_voc: int, dtype: torch.dtype, device, aux: bool = False) -> None:
        size = n_tok * n_voc
        self.buf = torch.empty(size, dtype=torch.float32, device=device)
        self.low = None if dtype == torch.float32 else torch.empty(size, dtype=dtype, device=device)
        self.aux = torch.empty(size, dtype=torch.float32, device=device) if aux else None

    @staticmethod
    def view(flat: torch.Tensor, n: int, v: int) -> torch.Tensor:
        return flat[: n * v].view(n, v)


def logits_into(h_c: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int, v1: int,
                logit_scale: float, softcap: float | None, bufs: ChunkBuffers) -> torch.Tensor:
    """float32 logits [n, v1-v0] of one chunk, written into ``bufs.buf`` (a view of the reused buffer).

    logits = transform_logits(h W[v0:v1]ᵀ + b[v0:v1], logit_scale, softcap), the head of
    :mod:`vocablens.logit_transform`. The GEMM runs in the operands' dtype (see :func:`gemm_operands`;
    a low-precision output is widened to float32).
    """
    W = weight[v0:v1]
    n, v = h_c.shape[0], v1 - v0
    z = bufs.view(bufs.buf, n, v)
    out = z if h_c.dtype == torch.float32 else bufs.view(bufs.low, n, v)
    if bias is not None:
        torch.addmm(bias[v0:v1], h_c, W.t(), out=out)
    else:
        torch.mm(h_c, W.t(), out=out)
    if out is not z:
        z.copy_(out)
    return transform_logits(z, logit_scale, softcap, inplace=True)


def mm_low(G: torch.Tensor, W: torch.Tensor, bufs: ChunkBuffers) -> torch.Tensor:
    """``G [n, v] (float32) @ W [v, d]`` in W's dtype (bf16/fp16 G is staged in ``bufs.low``); float32 W: plain mm."""
    if W.dtype == torch.float32:
        return torch.mm(G, W)
    lo = bufs.view(bufs.low, *G.shape)
    lo.copy_(G)
    return torch.mm(lo, W)


_FUSED_OK: dict[str, bool] = {}


def fused_inplace(z: torch.Tensor, op: str) -> torch.Tensor:
    """Row ``softmax`` or ``log_softmax`` of a float32 [n, v] buffer written over itself (one fused kernel).

    ATen's kernels read each row's max and exp-sum before writing that row, and compute
    ``(x - max) - log Σ`` (log_softmax) and ``exp(x - max) / Σ`` (softmax), so the result depends only
    on differences and ``out=z`` is safe; both are checked once on a small tensor, with an
    out-of-place fallback.
    """
    kernel = torch._softmax if op == "softmax" else torch._log_softmax
    public = torch.softmax if op == "softmax" else torch.log_softmax
    if op not in _FUSED_OK:
        x = torch.randn(3, 4099, generator=torch.Generator().manual_seed(0)).to(z.device) * 7
        ref = public(x, 1)
        try:
            kernel(x, 1, False, out=x)
            _FUSED_OK[op] = bool(torch.equal(x, ref))
        except Exception:  # pragma: no cover - op signature differs
            _FUSED_OK[op] = False
    if _FUSED_OK[op]:
        kernel(z, 1, False, out=z)
    else:  # pragma: no cover
        z.copy_(public(z, 1))
    return z


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """The row max with -inf (a row masked out entirely) replaced by 0, so ``z - m`` stays -inf, not NaN."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def merge_row_stats(m_a: torch.Tensor, ls_a: torch.Tensor, m_b: torch.Tensor,
                    ls_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial log-normalizers given as (row max m [n], log Σ exp(z - m) [n]).

    Returns ``(m, log s)`` of the union, computed from differences only: m = max(m_a, m_b),
    log s = logaddexp(ls_a + (m_a - m), ls_b + (m_b - m)). A part with no column yet has m = -inf,
    log s = -inf.
    """
    m = torch.maximum(m_a, m_b)
    ms = safe_max(m)
    return m, torch.logaddexp(ls_a + (m_a - ms), ls_b + (m_b - ms))


def tile_row_stats(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max and log Σ exp(z - max) of one float32 tile [n, v]; ``z`` is overwritten by its log-softmax.

    log s is read exactly as minus the log-softmax at the argmax (where z - max = 0), never as
    ``log(Σ)`` of a sum that may have underflowed. Rows that are all -inf give (-inf, -inf).
    """
    m, am = torch.max(z, 1)
    fused_inplace(z, "log_softmax")
    ls = -z.gather(1, am[:, None]).squeeze(1)
    finite = torch.isfinite(m)
    return m, torch.where(finite, ls, torch.full_like(ls, -float("inf")))




def run_blocks(work: Callable[[int, int, int], None], n_jobs: int, device: torch.device | str = "cpu",
               dynamic: bool = False) -> None:
    """Run jobs 0..n_jobs-1 as ``work(lo, hi, worker)`` calls: on CPU, one Python thread per
    ``torch.get_num_threads()``, each running its ops single-threaded.

    By default each thread gets one contiguous range [lo, hi). With ``dynamic`` the threads pull one
    job at a time (``work(i, i + 1, worker)``) until none is left, so a thread the OS deschedules for
    a while on a shared machine leaves its jobs to the others instead of holding everyone at the end
    of the call.

    For many small ops (the statistics of cache-sized blocks of logits), one op per thread beats every
    op split over all threads: each split op ends in a barrier, and on a busy machine a barrier waits
    for a descheduled thread (measurement: docs/performance-ops.md). Other devices (and one thread) get a single call
    ``work(0, n_jobs, 0)`` on the calling thread.
    """
    n = min(n_jobs, torch.get_num_threads() if torch.device(device).type == "cpu" else 1)
    if n <= 1:
        work(0, n_jobs, 0)
        return
    threads = torch.get_num_threads()
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()  # thread-local: carry them
    jobs = itertools.count()  # next() on a count is atomic under the GIL: each job goes to one thread

    def run(w: int) -> None:
        torch.get_num_threads()  # this thread's lazy thread-count init, then one thread for its ops
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            if not dynamic:
                work(w * n_jobs // n, (w + 1) * n_jobs // n, w)
                return
            while (i := next(jobs)) < n_jobs:
                work(i, i + 1, w)

    try:
        with ThreadPoolExecutor(n) as pool:
            for f in [pool.submit(run, w) for w in range(n)]:
                f.result()
    finally:
        torch.set_num_threads(threads)  # the process-wide default that set_num_threads(1) changed


__all__ = ["LOW_PRECISION", "MAX_CHUNK_BYTES", "MIN_CHUNK_BYTES", "ChunkBuffers", "chunk_sizes",
           "default_chunk_bytes", "flatten_tokens", "fused_inplace", "gemm_operands", "logits_into",
           "merge_row_stats", "mm_low", "override_sizes", "run_blocks", "safe_max", "tile_row_stats", "train_chunk_sizes"]
