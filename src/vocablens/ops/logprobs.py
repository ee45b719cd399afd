"""Forward-only log-probabilities through the LM head, chunked, never materializing [N, V].

:func:`token_logprobs` gives, for ``hidden [N, d]`` and ``weight [V, d]`` (+ bias, logit scale,
final-logit softcap), the log-probability of given targets and on request the top-k
log-probabilities, the entropy and the logsumexp. It chunks over tokens and, when a chunk of full
rows would not fit the memory budget, over the vocabulary too, with an online log-sum-exp kept in
the relative form of :mod:`vocablens.ops.chunking` (row max and log Σ exp(z - max), merged tile by
tile; Milakov & Gimelshein 2018; Cut Cross-Entropy, Wijmans et al. 2024, arXiv 2411.09009, §3), so
every log-probability depends only on logit differences.

Training (the loss with a backward) is :func:`vocablens.ops.cross_entropy.linear_cross_entropy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.ops._checks import (
    check_bool, check_head, check_head_transform, check_ids, check_int, check_nonempty, check_size,
)
from vocablens.ops.chunking import (
    ChunkBuffers, chunk_sizes, default_chunk_bytes, flatten_tokens, gemm_operands, logits_into, override_sizes,
    safe_max,
)
from vocablens.ops.kl_block import exp_shifted
from vocablens.ops.topk import merge_topk, topk_lowest_id

#: full-row chunks of the forward-only path hold this many tokens (fewer when N is smaller) when
#: they fit :data:`FULL_ROW_CHUNK_BYTES`: each chunk reads all of W, and a CPU GEMM of 512 rows runs
#: faster per FLOP than two of 256, more so on two threads (measurement: docs/performance-ops.md)
MIN_FULL_ROW_TOKENS = 512
#: the largest default chunk of complete rows, bytes: 512 rows at V = 49,152 (as
#: :data:`vocablens.ops.kl.READOUT_CHUNK_BYTES`); a larger V gets fewer rows, or vocabulary tiles
FULL_ROW_CHUNK_BYTES = 96 * 2**20


@dataclass(frozen=True)
class TokenLogprobs:
    """Result of :func:`token_logprobs` (all float32 except ids).

    Attributes:
        logprob: [N] log p(target) in nats, or None when no targets were given.
        lse: [N] logsumexp of the (scaled, softcapped) logits, nats.
        entropy: [N] entropy of the next-token distribution in nats, or None.
        topk_logprobs: [N, k] the k largest log-probabilities, descending, or None.
        topk_ids: [N, k] int64 their token ids (lowest id first among ties), or None.
        target_rank: [N] int64 number of columns (among the first ``topk_cols``) whose logit exceeds
            the target's (0 = the target is on top), or None.
    """

    logprob: torch.Tensor | None
    lse: torch.Tensor
    entropy: torch.Tensor | None
    topk_logprobs: torch.Tensor | None
    topk_ids: torch.Tensor | None
    target_rank: torch.Tensor | None = None


class _RowState:
    """Online state of one token chunk over vocabulary tiles: max m, s = Σ exp(z - m), q = Σ e·(z - m)
    (entropy), the target logit and the running top-k (raw logits). All float32 [n] (top-k [n, k])."""

    def __init__(self, n: int, dev, entropy: bool, targets: bool) -> None:
        self.m = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
        self.s = torch.zeros(n, dtype=torch.float32, device=dev)
        self.q = torch.zeros(n, dtype=torch.float32, device=dev) if entropy else None
        self.zt = torch.zeros(n, dtype=torch.float32, device=dev) if targets else None
        self.tv = self.ti = None

    def add_topk(self, z: torch.Tensor, v0: int, k: int) -> None:
        cv, ci = topk_lowest_id(z, min(k, z.shape[1]))
        ci = ci + v0
        if self.tv is None:
            self.tv, self.ti = cv, ci
        else:
            self.tv, self.ti = merge_topk(self.tv, self.ti, cv, ci, k)

    def add_target(self, z: torch.Tensor, tc: torch.Tensor, v0: int, single_tile: bool) -> None:
        if single_tile:
            self.zt = z.gather(1, tc[:, None]).squeeze(1)
            return
        inside = (tc >= v0) & (tc < v0 + z.shape[1])
        if bool(inside.any()):
            rows = inside.nonzero().squeeze(1)
            self.zt[rows] = z[rows, tc[rows] - v0]

    def add_tile(self, z: torch.Tensor) -> None:
        """Fold a tile into (m, s, q); ``z`` is overwritten by exp(z - m_new)."""
        m, s = self.m, self.s
        m_new = torch.maximum(m, z.amax(1))
        ms = safe_max(m_new)
        seen = s > 0
        alpha = torch.exp(torch.where(seen, m - ms, torch.full_like(m, -math.inf)))
        z.sub_(ms[:, None]).exp_()
        if self.q is not None:
            # q = Σ e·(z - m); moving the reference from m to m_new adds (m - m_new)·s
            shift = torch.where(seen, (m - ms) * s, torch.zeros_like(s))
            self.q = alpha * (self.q + shift) + torch.special.xlogy(z, z).sum(1)
        self.s = alpha * s + z.sum(1)
        self.m = m_new


#: rows of a complete-row chunk whose exp-sums are read at a time: [16, V] float32 is 3 MiB at
#: V = 49,152, so the scratch of exp(y) stays in cache through its sums (see :mod:`vocablens.ops.kl_block`).
EXP_ROWS = 16


def _row_sums(z: torch.Tensor, scratch: torch.Tensor | None, entropy: bool):
    """Row max and exp-sums of logits ``z [n, V]`` (float32), ``EXP_ROWS`` rows at a time, so that
    every pass over a block after its max runs in cache.

    Returns ``(m, ms, S, Q)`` float32 [n]: the row max m, ms = m with -inf as 0
    (:func:`~vocablens.ops.chunking.safe_max`), S = Σ exp(y) and with ``entropy`` Q = Σ exp(y)·y
    (else None), y = z - ms <= 0. z is overwritten by y, or without the entropy by exp(y); with the
    entropy exp(y) goes to ``scratch`` (>= EXP_ROWS·V floats). exp is
    :func:`~vocablens.ops.kl_block.exp_shifted` (exp2 of y·log2 e, floored at 2^-126: a -inf logit
    adds 2^-126 to S and -inf to Q). Both are float32 row sums (cascade summation, error ~eps·log V).
    The blocks run one after another, each op on all threads: one op per thread
    (:func:`~vocablens.ops.chunking.run_blocks`) and a row max over the whole chunk first both cost
    more here (measurement: docs/performance-ops.md)."""
    n = z.shape[0]
    f32 = dict(dtype=torch.float32, device=z.device)
    m, ms, S = torch.empty(n, **f32), torch.empty(n, **f32), torch.empty(n, **f32)
    Q = torch.empty(n, **f32) if entropy else None
    for i in range(0, n, EXP_ROWS):
        yb = z[i:i + EXP_ROWS]
        j = i + yb.shape[0]
        torch.amax(yb, 1, out=m[i:j])
        ms[i:j] = safe_max(m[i:j])
        yb.sub_(ms[i:j, None])
        if entropy:
            e = exp_shifted(yb, scratch[: yb.numel()].view_as(yb))
            torch.sum(e, 1, out=S[i:j])
            torch.sum(e.mul_(yb), 1, out=Q[i:j])
        else:
            torch.sum(exp_shifted(yb, yb), 1, out=S[i:j])
    return m, ms, S, Q


def _full_rows(z: torch.Tensor, tc: torch.Tensor | None, k: int, entropy: bool, ebuf: torch.Tensor | None,
               cols: int | None = None, rank: bool = False):
    """Statistics of one chunk of complete rows ``z [n, V]`` (float32, overwritten: shifted by its row
    max, then, without the entropy, its exp).

    Returns ``(lse, logprob, entropy, topk_logprobs, topk_ids, rank)`` ([n] / [n, k]; None where not
    asked); top-k and rank read the first ``cols`` columns (None: all), on the raw logits.
    Passes over z: top-k and rank when asked; then the row max, the shift and the exp-sums of
    :func:`_row_sums` in cache-sized blocks (``ebuf``: their scratch, with the entropy). From y = z - m:
    log p = y - log S, and the entropy is log S - Σ e·y / S (e = exp(y), S = Σ e); rows with -inf
    logits get their entropy from the exact p with xlogy (0·log 0 = 0).
    """
    tv = ti = rk = None
    zc = z if cols is None else z[:, :cols]
    if k:
        tv, ti = topk_lowest_id(zc, k)
    if rank:
        rk = (zc > z.gather(1, tc[:, None])).sum(1)
    zt = None if tc is None else z.gather(1, tc[:, None]).squeeze(1)
    # shift by the row max first: torch's fused log-softmax forms z - lse, which at |z| ~ 57 was off by
    # 3e-5 per log-prob (entropy 3e-4 over V = 70,000); z - m is small and exact near the top. The
    # normalizer is the log of a float32 cascade sum, never torch's float32 log-probs (over
    # V = 70,000 they share an error of ~1.4e-5); float64 sums would convert every element, several
    # times the cost (docs/performance-ops.md). The shift happens block by block in _row_sums
    m, ms, S, Q = _row_sums(z, ebuf, entropy)
    yt = None if zt is None else zt - ms
    S = S.double()
    logS = torch.log(S)
    ls = logS.float()
    ent = None
    if entropy:
        ent = (logS - Q.double() / S).float()
        bad = ~torch.isfinite(ent)  # rows with -inf logits (Q = -inf): p = exp(y - log S) with xlogy
        if bool(bad.any()):
            rows = bad.nonzero().squeeze(1)
            p = (z[rows] - ls[rows, None]).exp()
            ent[rows] = -torch.special.xlogy(p, p).sum(1)
    lp = None if yt is None else yt - ls
    if k:
        tv = (tv - ms[:, None]) - ls[:, None]
    return m + ls, lp, ent, tv, ti, rk


def _tiled_rows(tile, V: int, n_voc: int, tc: torch.Tensor | None, k: int, entropy: bool, cols: int,
                rank: bool, n: int, dev):
    """Statistics of one chunk of ``n`` token rows read in vocabulary tiles ``tile(v0)`` -> [n, v]
    float32 logits of columns v0..v0+v (overwritten), folded online (:class:`_RowState`).

    Returns ``(lse, logprob, entropy, topk_logprobs, topk_ids, rank)`` as :func:`_full_rows` does.
    The rank costs a second sweep over the tiles: the target's logit (from its own tile) is known
    only after the first."""
    st = _RowState(n, dev, entropy, tc is not None)
    for v0 in range(0, V, n_voc):
        z = tile(v0)
        if tc is not None:
            st.add_target(z, tc, v0, n_voc >= V)
        if k and v0 < cols:
            st.add_topk(z[:, :cols - v0], v0, k)
        st.add_tile(z)
    ms, log_s = safe_max(st.m), torch.log(st.s)
    lp = None if tc is None else (st.zt - ms) - log_s
    ent = log_s - st.q / st.s if entropy else None
    tv, ti = ((st.tv - ms[:, None]) - log_s[:, None], st.ti) if k else (None, None)
    rk = None
    if rank:
        rk = torch.zeros(n, dtype=torch.int64, device=dev)
        for v0 in range(0, cols, n_voc):
            z = tile(v0)
            rk += (z[:, :cols - v0] > st.zt[:, None]).sum(1)
    return st.m + log_s, lp, ent, tv, ti, rk


def _checked_options(V: int, topk_cols, top_k, entropy, rank, targets) -> tuple[int, int]:
    """-> (columns read by top-k and rank, k). Raises BadInput: topk_cols not an int in [1, V], top_k not
    an int in [0, topk_cols], entropy or rank not a bool, rank without targets."""
    cols = V if topk_cols is None else check_int("topk_cols", topk_cols, 1, V)
    k = check_int("top_k", top_k, 0, cols)
    check_bool("entropy", entropy)
    check_bool("rank", rank)
    if rank and targets is None:
        raise BadInput("rank needs targets")
    return cols, k


def _chunk_plan(N: int, V: int, chunk_bytes: int | None, chunk_tokens: int | None,
                chunk_vocab: int | None) -> tuple[int, int]:
    """(tokens per chunk, vocabulary columns per tile): complete rows of min(N, MIN_FULL_ROW_TOKENS)
    tokens when they fit :data:`FULL_ROW_CHUNK_BYTES` (else as many as fit, or vocabulary tiles of
    the default budget); the caller's sizes (already checked) override."""
    budget = chunk_bytes
    if budget is None:
        budget = max(default_chunk_bytes(N, V), min(FULL_ROW_CHUNK_BYTES, min(N, MIN_FULL_ROW_TOKENS) * V * 4))
    return override_sizes(*chunk_sizes(N, V, budget), N, V, chunk_tokens, chunk_vocab)


class _Outputs:
    """The [N] / [N, k] float32 (ids, ranks int64) outputs of :func:`token_logprobs`, filled chunk by chunk."""

    def __init__(self, N: int, k: int, targets: bool, entropy: bool, rank: bool, dev) -> None:
        f32 = dict(dtype=torch.float32, device=dev)
        self.k = k
        self.lse = torch.empty(N, **f32)
        self.lp = torch.empty(N, **f32) if targets else None
        self.ent = torch.empty(N, **f32) if entropy else None
        self.tv = torch.empty(N, k, **f32) if k else None
        self.ti = torch.empty(N, k, dtype=torch.int64, device=dev) if k else None
        self.rk = torch.empty(N, dtype=torch.int64, device=dev) if rank else None

    def put(self, a: int, b: int, stats) -> None:
        """Rows a..b from ``(lse, logprob, entropy, topk_logprobs, topk_ids, rank)`` of one chunk."""
        for out, x in zip((self.lse, self.lp, self.ent, self.tv, self.ti, self.rk), stats):
            if out is not None:
                out[a:b] = x

    def result(self, lead) -> TokenLogprobs:
        def shape(x, extra=()):
            return None if x is None else x.reshape(*lead, *extra)

        k = (self.k,)
        return TokenLogprobs(logprob=shape(self.lp), lse=shape(self.lse), entropy=shape(self.ent),
                             topk_logprobs=shape(self.tv, k), topk_ids=shape(self.ti, k), target_rank=shape(self.rk))


@torch.no_grad()
def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None = None, *,
                   bias: torch.Tensor | None = None, logit_scale: float = 1.0, softcap: float | None = None,
                   top_k: int = 0, entropy: bool = False, rank: bool = False, topk_cols: int | None = None,
                   chunk_bytes: int | None = None, chunk_tokens: int | None = None,
                   chunk_vocab: int | None = None) -> TokenLogprobs:
    """Forward-only log-probabilities through the LM head, chunked, never materializing [N, V].

    Args:
        hidden: [N, d] or [..., d] normed hidden states (the LM head's input), float32/bf16/fp16/float64.
        weight: [V, d] the unembedding ``W_U`` (same dtype as hidden).
        targets: [N] (or hidden's leading shape) int token ids in [0, V), or None.
        bias: [V] optional head bias. logit_scale: factor applied before the softcap.
        softcap: final-logit softcap c of :func:`vocablens.logit_transform.transform_logits`, or None.
        top_k: int in [0, topk_cols]: also return the k most likely tokens per position (0 = no).
        entropy: bool, also return the entropy (nats) per position.
        rank: bool, also return the rank of each target (needs targets): the number of columns whose
            logit exceeds the target's, as :func:`vocablens.ops.kl_readout` counts it (over complete
            rows it is read off the chunk; over a tiled vocabulary it costs a second GEMM pass, the
            target's logit being known only once its tile is read).
        topk_cols: top-k and rank read the first ``topk_cols`` columns only (the real vocabulary;
            default all V); the normalizer is always over all V.
        chunk_bytes: budget for one float32 chunk of logits (bytes; default
            :func:`~vocablens.ops.chunking.default_chunk_bytes`); chunk_tokens / chunk_vocab (ints >= 1)
            override the derived sizes (the vocabulary is tiled when a chunk of full rows would not fit).

    Returns:
        :class:`TokenLogprobs` with tensors shaped like hidden's leading dims, float32. Log-probabilities,
        top-k log-probabilities and the entropy depend only on logit differences: a target 100 nats
        below the max gives -100, four equal logits offset by 1e8 give -log 4.

    Raises:
        ShapeMismatch: d or dtypes disagree, targets' shape differs.
        BadInput: empty input, targets outside [0, V), topk_cols not an int in [1, V], top_k not an
            int in [0, topk_cols], entropy or rank not a bool, rank without targets, a chunk size not
            None or an int >= 1, bad logit_scale / softcap.

    Default chunks: complete rows of min(N, 512) tokens when they fit 96 MiB (V = 49,152: 96 MiB),
    else as many complete rows as fit 96 MiB, or tiles of :func:`~vocablens.ops.chunking.default_chunk_bytes`. A chunk of complete rows is read by its
    row max, the shift by it and row sums of exp (:func:`_full_rows`), the same values as
    ``log_softmax(z).gather(targets)`` over the whole row.
    Peak extra memory is one [n, v] float32 chunk (plus a [16, V] scratch with ``entropy`` over
    complete rows) and O(N·k) outputs (plus, for bf16/fp16 inputs, a float32 copy of W on CPU or
    one chunk in the input dtype elsewhere; see :func:`~vocablens.ops.chunking.gemm_operands`);
    every reduction is float32.
    """
    check_head(hidden, weight, bias)
    logit_scale, softcap = check_head_transform(logit_scale, softcap)
    V = weight.shape[0]
    cols, k = _checked_options(V, topk_cols, top_k, entropy, rank, targets)
    sizes = [check_size(n, v) for n, v in (("chunk_bytes", chunk_bytes), ("chunk_tokens", chunk_tokens),
                                           ("chunk_vocab", chunk_vocab))]
    h, t, lead = flatten_tokens(hidden, targets)
    check_nonempty("hidden", h)
    if t is not None:
        check_ids("targets", t, V)
    N, dev = h.shape[0], h.device
    n_tok, n_voc = _chunk_plan(N, V, *sizes)
    h, W, bias = gemm_operands(h, weight, bias)
    bufs = ChunkBuffers(n_tok, n_voc, h.dtype, dev)
    ebuf = torch.empty(min(n_tok, EXP_ROWS) * V, dtype=torch.float32, device=dev) if entropy and n_voc >= V else None
    out = _Outputs(N, k, t is not None, entropy, rank, dev)
    for a in range(0, N, n_tok):
        b = min(N, a + n_tok)
        ta = None if t is None else t[a:b]

        def tile(v0: int, a=a, b=b) -> torch.Tensor:  # logits [b - a, v] of the tile from column v0
            return logits_into(h[a:b], W, bias, v0, min(V, v0 + n_voc), logit_scale, softcap, bufs)

        if n_voc >= V:  # complete rows: the row statistics of one chunk
            stats = _full_rows(tile(0), ta, k, entropy, ebuf, None if cols == V else cols, rank)
        else:
            stats = _tiled_rows(tile, V, n_voc, ta, k, entropy, cols, rank, b - a, dev)
        out.put(a, b, stats)
    return out.result(lead)


__all__ = ["EXP_ROWS", "FULL_ROW_CHUNK_BYTES", "MIN_FULL_ROW_TOKENS", "TokenLogprobs", "chunk_sizes", "default_chunk_bytes", "token_logprobs"]
