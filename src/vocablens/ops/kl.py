"""KL(reference ‖ q) through the LM head, chunked over tokens, never materializing more than [rows, V].

For hidden states of S stacked layers ``hidden [S, N, d]`` (the lens states of one token, read at S
layers) and one reference distribution per token, given by its logits ``reference [N, V]`` (the
model's own output), the lens distribution is ``q = softmax(softcap(scale · (h Wᵀ + b)))``. Tokens are
processed in chunks: one GEMM writes the logits of all S layers of a chunk (``rows = S · n`` rows)
into a reused float32 buffer; every statistic is read off it in cache-sized row blocks (one CPU
thread per block range, :func:`vocablens.ops.chunking.run_blocks`) before the next chunk.

* :func:`kl_readout` (forward only): per (layer, token) KL(reference ‖ q), the logsumexp, and on
  request the entropy, the top-k, the log-probability and rank of a target token, and
  max_v |q_v - p_v| — all from the one GEMM (the logit lens and the tuned lens's evaluation read the
  stream this way: one LM-head GEMM per layer and token, nothing else over V).
* :func:`~vocablens.ops.kl_train.linear_kl` (training, in :mod:`vocablens.ops.kl_train`): per
  layer, the KL summed over tokens (or, with ``targets`` and no reference, the cross-entropy = KL
  to a one-hot reference), with its analytic gradient with
  respect to the hidden states: d KL / d logits = q - p (Belrose et al. 2023, §3, train the tuned
  lens on this KL; the gradient is that of softmax cross-entropy with soft targets), pulled back
  through the softcap and scale (:func:`vocablens.logit_transform.transform_logits_backward`) and
  W (one GEMM). Autograd never sees a [rows, V] tensor.

Numerics: logits are shifted by their row maximum before anything is summed, so results depend only
on logit differences; every sum is float32; the reference's log-probabilities are never formed (KL =
Σ p (r - m_r) - log s_r - [Σ p (z - m) - log s], with m the row maxima and s the exp-sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.logit_transform import check_transform, transform_logits
from vocablens.ops._checks import check_float, check_ids
from vocablens.ops.chunking import run_blocks
from vocablens.ops.kl_block import PAIR_TOKENS, STATS_ROWS, ReadoutRows, block_stats, reference_chunk

#: default budget of one [rows, V] float32 buffer, bytes (two such buffers are live per chunk): 256
#: rows of V = 49,152. CPU GEMMs of 256+ rows run faster per FLOP than 64-row ones, and fewer, larger
#: chunks mean fewer passes to schedule (measurement: docs/performance-ops.md).
DEFAULT_CHUNK_BYTES = 48 * 2**20


@dataclass(frozen=True)
class KLReadout:
    """Result of :func:`kl_readout`; tensors are [S, N] (or [N] for a [N, d] input), float32 unless noted.

    Attributes:
        kl: KL(reference ‖ q) in nats (clamped at 0).
        lse: logsumexp of the (scaled, softcapped) logits, nats.
        entropy: entropy of q in nats, or None.
        topk_logprobs: [S, N, k] the k largest log-probabilities (over the first ``topk_cols``
            columns), descending, or None.
        topk_ids: [S, N, k] int64 their token ids, or None.
        target_logprob: log q(target), or None.
        target_rank: int64 number of columns (among the first ``topk_cols``) whose logit exceeds the
            target's (0 = the target is on top), or None.
        max_abs_dp: max over V of |q_v - p_v|, or None.
    """

    kl: torch.Tensor
    lse: torch.Tensor
    entropy: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    target_logprob: torch.Tensor | None = None
    target_rank: torch.Tensor | None = None
    max_abs_dp: torch.Tensor | None = None


def stacked_inputs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             logit_scale: float, softcap: float | None) -> tuple[torch.Tensor, bool]:
    """``hidden`` [N, d] or [S, N, d] viewed as [S, N, d], checked against ``weight`` [V, d] and ``bias`` [V].

    Returns ``(hidden3, was_2d)``. Raises ShapeMismatch (dtypes, d, bias shape), BadInput (empty
    input, a bad logit_scale or softcap)."""
    check_float("hidden", hidden)
    check_float("weight", weight)
    check_transform(logit_scale, softcap)
    if weight.dim() != 2 or weight.shape[0] == 0:
        raise ShapeMismatch(f"weight must be [V >= 1, d]; got {tuple(weight.shape)}")
    if hidden.dim() not in (2, 3) or hidden.shape[-1] != weight.shape[1]:
        raise ShapeMismatch(f"hidden must be [N, d] or [S, N, d] with d={weight.shape[1]}; got {tuple(hidden.shape)}")
    if hidden.shape[-2] == 0 or hidden.shape[0] == 0:
        raise BadInput(f"hidden {tuple(hidden.shape)} is empty: no tokens to compute")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeMismatch(f"bias {tuple(bias.shape)} must be [V]=({weight.shape[0]},)")
    two = hidden.dim() == 2
    return (hidden[None] if two else hidden), two


def check_reference(reference: torch.Tensor, N: int, V: int) -> None:
    """Raise ShapeMismatch unless ``reference`` is float logits [N, V]."""
    check_float("reference", reference)
    if tuple(reference.shape) != (N, V):
        raise ShapeMismatch(f"reference logits must be [N, V]=({N}, {V}); got {tuple(reference.shape)}")


def tokens_per_chunk(S: int, V: int, chunk_bytes: int | None, chunk_rows: int | None) -> int:
    """Tokens per chunk of S stacked layers: ``chunk_rows`` (rows = tokens·S), else the rows of a
    float32 [rows, V] buffer of ``chunk_bytes`` (default :data:`DEFAULT_CHUNK_BYTES`); at least 1."""
    rows = chunk_rows if chunk_rows else max(1, (chunk_bytes or DEFAULT_CHUNK_BYTES) // (4 * V))
    return max(1, int(rows) // S)


def head_logits_into(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, logit_scale: float,
                 softcap: float | None, buf: torch.Tensor) -> torch.Tensor:
    """float32 logits [R, V] of R head inputs, written into the reused buffer ``buf`` (>= R·V floats)."""
    R, V = h.shape[0], weight.shape[0]
    z = buf[: R * V].view(R, V)
    h = h.to(weight.dtype)
    if weight.dtype == torch.float32:
        if bias is not None:
            torch.addmm(bias.float(), h, weight.t(), out=z)
        else:
            torch.mm(h, weight.t(), out=z)
    else:  # low-precision GEMM, float32 from here on
        z.copy_(torch.nn.functional.linear(h, weight, None if bias is None else bias.to(weight.dtype)))
    return transform_logits(z, logit_scale, softcap, inplace=True)


def pair_dot(z: torch.Tensor, p: torch.Tensor, n: int, S: int) -> torch.Tensor:
    """Σ_v z[j·S + s, v] p[j, v] for token-major rows z [n·S, V] and p [n, V] -> [n, S] (one GEMM)."""
    full = torch.mm(z, p.t()).view(n, S, n)  # n x more products than needed, but one pass over z
    return full.diagonal(dim1=0, dim2=2).t()


#: default budget of kl_readout's [rows, V] float32 logits buffer: 512 rows at V = 49,152 (CPU
#: GEMMs of 512 rows run faster per FLOP than those of 240: docs/performance-ops.md).
READOUT_CHUNK_BYTES = 96 * 2**20


#: tokens whose reference probabilities [n, V] are held at once by :func:`kl_readout` (a multiple of
#: :data:`PAIR_TOKENS`): 64 x 49,152 float32 is 12 MiB.
REF_TOKENS = 64


def _group_stats(z: torch.Tensor, a: int, g0: int, g1: int, S: int, reference: torch.Tensor,
                 targets: torch.Tensor | None, pall: torch.Tensor, plogp: torch.Tensor, ebufs: list,
                 o: ReadoutRows, cols: int) -> None:
    """Statistics of tokens g0..g1 of the chunk whose logits ``z`` [rows, V] start at token ``a``.

    First the references of their pair blocks (p into ``pall``, Σ p log p into ``plogp``), one pair
    block per job; then every row block of STATS_ROWS rows is one job, pulled by whichever worker
    thread is free (:func:`~vocablens.ops.chunking.run_blocks` with ``dynamic``)."""
    V, dev = z.shape[1], z.device
    pairs = list(range(g0, g1, PAIR_TOKENS))

    def refs(lo: int, hi: int, w: int) -> None:
        for t0 in pairs[lo:hi]:
            t1 = min(g1, t0 + PAIR_TOKENS)
            plogp[t0:t1] = reference_chunk(reference[t0:t1], pall[(t0 - g0) * V:])[1]

    # no block straddles two pair blocks: (first row, end row, first token of its pair block), rows of z
    blocks = [(r0, min((t1 - a) * S, r0 + STATS_ROWS), t0) for t0 in pairs for t1 in [min(g1, t0 + PAIR_TOKENS)]
              for r0 in range((t0 - a) * S, (t1 - a) * S, STATS_ROWS)]

    def stats(lo: int, hi: int, w: int) -> None:
        for r0, r1, t0 in blocks[lo:hi]:
            n = min(g1, t0 + PAIR_TOKENS) - t0
            p = pall[(t0 - g0) * V:(t0 - g0 + n) * V].view(n, V)
            j0 = r0 - (t0 - a) * S  # row within the pair block
            tokens = [(max(j * S, j0) - j0, min((j + 1) * S, j0 + r1 - r0) - j0, j)
                      for j in range(j0 // S, (j0 + r1 - r0 - 1) // S + 1)]  # rows of each token
            tgt = None if targets is None else targets[t0 + torch.arange(j0, j0 + r1 - r0, device=dev) // S]
            block_stats(z[r0:r1], p, tokens, ebufs[w], o, a * S + r0, cols, tgt)

    run_blocks(refs, len(pairs), dev)
    run_blocks(stats, len(blocks), dev, dynamic=True)


@torch.no_grad()
def kl_readout(hidden: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor, *,
               bias: torch.Tensor | None = None, logit_scale: float = 1.0, softcap: float | None = None,
               targets: torch.Tensor | None = None, rank: bool = False, top_k: int = 0,
               topk_cols: int | None = None, entropy: bool = False, max_abs_dp: bool = False,
               chunk_bytes: int | None = None, chunk_rows: int | None = None) -> KLReadout:
    """Forward-only KL(reference ‖ q) and the lens statistics of S layers, one LM-head GEMM per row.

    Each chunk's logits are written once by the GEMM; the statistics are then read off them in
    cache-sized blocks of :data:`STATS_ROWS` rows (:func:`vocablens.ops.kl_block.block_stats`: max,
    top-k, rank, exp, sums), so apart from the GEMM
    the chunk streams through memory about once. Only what is asked for is computed.

    Args:
        hidden: [S, N, d] (or [N, d]) head inputs (already normed), any float dtype; the GEMM runs
            in ``weight``'s dtype, everything after it in float32.
        weight: [V, d] the unembedding W_U.
        reference: [N, V] logits of the reference distribution p (any shift; -inf allowed).
        bias: [V] optional head bias. logit_scale, softcap: the head's transform.
        targets: [N] int token ids for ``target_logprob`` (and ``target_rank`` with ``rank``).
        top_k: also return the k most likely tokens (0 = no).
        topk_cols: top-k and rank consider the first ``topk_cols`` columns only (real tokens;
            default all V).
        entropy: also return the entropy of q. max_abs_dp: also return max_v |q_v - p_v|.
        chunk_bytes: budget of the [rows, V] float32 logits buffer (default
            :data:`READOUT_CHUNK_BYTES`, 96 MiB; besides it only the references of :data:`REF_TOKENS`
            tokens and [STATS_ROWS, V] scratch per thread are live); chunk_rows: rows per GEMM instead.

    Returns:
        :class:`KLReadout`, tensors [S, N] ([N] for a 2-D ``hidden``).

    Raises:
        ShapeMismatch: shapes or dtypes disagree.
        BadInput: empty input, targets outside [0, V), top_k / topk_cols out of range, rank without
            targets, a bad scale or softcap.
    """
    H, two = stacked_inputs(hidden, weight, bias, logit_scale, softcap)
    S, N, _ = H.shape
    V = int(weight.shape[0])
    check_reference(reference, N, V)

    def chunk(a: int, b: int, buf: torch.Tensor) -> torch.Tensor:  # rows token-major: j*S + s = token a+j, layer s
        return head_logits_into(H[:, a:b].transpose(0, 1).reshape((b - a) * S, -1), weight, bias, logit_scale,
                            softcap, buf)

    o, plogp = _readout(chunk, S, N, V, H.device, reference, targets, rank, top_k, topk_cols, entropy,
                        max_abs_dp, chunk_bytes, chunk_rows)
    return _result(o, plogp, N, S, two)


@torch.no_grad()
def logits_readout(logits: torch.Tensor, reference: torch.Tensor, *, targets: torch.Tensor | None = None,
                   rank: bool = False, top_k: int = 0, topk_cols: int | None = None, entropy: bool = False,
                   max_abs_dp: bool = False, chunk_bytes: int | None = None) -> KLReadout:
    """:func:`kl_readout`'s statistics of logits already computed, ``logits [N, V]`` (after the
    head's transform), against ``reference [N, V]``: no GEMM. The logit lens reads its last layer
    this way from the model's own output logits (the distribution that layer's entry must equal).

    Returns:
        :class:`KLReadout`, tensors [N]. Raises: as :func:`kl_readout`.
    """
    check_float("logits", logits)
    if logits.dim() != 2 or 0 in logits.shape:
        raise ShapeMismatch(f"logits must be a non-empty [N, V]; got {tuple(logits.shape)}")
    N, V = (int(x) for x in logits.shape)
    check_reference(reference, N, V)

    def chunk(a: int, b: int, buf: torch.Tensor) -> torch.Tensor:
        return buf[: (b - a) * V].view(b - a, V).copy_(logits[a:b])

    o, plogp = _readout(chunk, 1, N, V, logits.device, reference, targets, rank, top_k, topk_cols, entropy,
                        max_abs_dp, chunk_bytes, None)
    return _result(o, plogp, N, 1, True)


def _readout(chunk, S: int, N: int, V: int, dev, reference, targets, rank, top_k, topk_cols, entropy, max_abs_dp,
             chunk_bytes, chunk_rows) -> tuple[ReadoutRows, torch.Tensor]:
    """The chunk loop of :func:`kl_readout` over ``chunk(a, b, buf) -> logits [(b - a)·S, V]`` (in buf)."""
    cols = V if topk_cols is None else int(topk_cols)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= cols:
        raise BadInput(f"top_k must be an int in [0, {cols}]; got {top_k!r}")
    if not 1 <= cols <= V:
        raise BadInput(f"topk_cols must be in [1, {V}]; got {topk_cols}")
    if targets is not None:
        check_ids("targets", targets, V)
        if tuple(targets.shape) != (N,):
            raise ShapeMismatch(f"targets must be [N]=({N},); got {tuple(targets.shape)}")
        targets = targets.to(torch.int64)
    elif rank:
        raise BadInput("rank needs targets")
    n_tok = tokens_per_chunk(S, V, chunk_bytes or READOUT_CHUNK_BYTES, chunk_rows)
    n_tok = min(N, n_tok - n_tok % PAIR_TOKENS if n_tok > PAIR_TOKENS else n_tok)  # whole pair blocks
    f32 = dict(dtype=torch.float32, device=dev)
    zbuf = torch.empty(n_tok * S * V, **f32)
    group = min(n_tok, REF_TOKENS)  # tokens whose reference probabilities are live at once
    pall = torch.empty(group * V, **f32)
    workers = max(1, torch.get_num_threads()) if dev.type == "cpu" else 1
    ebufs = [torch.empty(STATS_ROWS * V, **f32) for _ in range(workers)]  # one scratch block per thread
    o = ReadoutRows(N * S, top_k, targets is not None, rank, entropy, max_abs_dp, dev)
    plogp = torch.empty(N, **f32)
    for a in range(0, N, n_tok):
        b = min(N, a + n_tok)
        z = chunk(a, b, zbuf)
        for g in range(a, b, group):
            _group_stats(z, a, g, min(b, g + group), S, reference, targets, pall, plogp, ebufs, o, cols)
    return o, plogp


def _result(o: ReadoutRows, plogp: torch.Tensor, N: int, S: int, two: bool) -> KLReadout:
    """The [S, N] (or [N]) :class:`KLReadout` of the filled rows; log s = log Σ exp(z - m)."""
    log_s = o.s.log()

    def out(x, *tail):
        if x is None:
            return None
        x = x.view(N, S, *tail).transpose(0, 1).contiguous()
        return x[0] if two else x

    kl = (plogp[:, None] - o.pz.view(N, S) + log_s.view(N, S)).clamp_min_(0.0)
    k = 0 if o.tv is None else o.tv.shape[1]
    return KLReadout(
        kl=out(kl), lse=out(o.m + log_s),
        entropy=None if o.ez is None else out(log_s - o.ez / o.s),
        topk_logprobs=None if o.tv is None else out(o.tv - o.m - log_s, k),
        topk_ids=out(o.ti, k), target_logprob=None if o.zt is None else out(o.zt - log_s),
        target_rank=None if o.rk is None else out(o.rk.to(torch.int64)), max_abs_dp=out(o.dp))


__all__ = ["DEFAULT_CHUNK_BYTES", "PAIR_TOKENS", "READOUT_CHUNK_BYTES", "REF_TOKENS", "STATS_ROWS", "KLReadout", "kl_readout",
           "logits_readout"]
