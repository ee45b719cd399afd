"""Which tokens can never be the top prediction: an exact, certificate-checked check.

Definitions (Demeter, Kimmel and Downey, ACL 2020, "Stolen Probability"; Grivas, Bogoychev and
Lopez, ACL 2022, "Low-Rank Softmax Can Have Unargmaxable Classes in Theory, but Rarely in
Practice"). Rows ``w_j`` of the unembedding ``W [V, d]``, optional bias ``b [V]``, logits
``l_j(x) = w_j . x + b_j`` for a hidden vector ``x`` in R^d.

- Token i is **argmaxable** when some x gives ``l_i(x) > l_j(x)`` for every j != i (strict).
- Without bias, by Gordan's alternative, i is *not* argmaxable iff ``w_i`` is a convex combination
  of the other rows: ``w_i = sum_j mu_j w_j``, ``mu >= 0``, ``sum mu = 1``. With distinct rows this
  is "w_i is not a vertex of the convex hull of W".
- With bias (Motzkin's transposition theorem), i is not argmaxable iff some such ``mu`` also has
  ``sum_j mu_j b_j >= b_i``: the lifted point ``(w_i, b_i)`` is not on the *upper* hull. A token
  argmaxable without bias stays argmaxable with any bias (scale x up), so only the no-bias
  failures need the lifted problem.
- Both questions are unchanged when a common vector is added to every row and when the hidden
  space is mapped by any invertible linear map ``A`` (``l_i - l_j`` only depends on ``w_i - w_j``;
  substitute ``x = A y``). We therefore centre and whiten: ``Z = (W - mu) A`` with ``A`` the
  inverse square root of the row covariance on its numerical range. Then ``y = z_i`` is very often
  a certificate already (``z_i . z_i`` is about d while ``z_j . z_i`` is about sqrt(d)).
- Exact duplicates (bit-identical rows, and with bias equal biases) can never be a *strict*
  argmax: they always tie. They are their own category (``duplicate``), never "argmaxable".
  Whether the group can *tie for first* is checked on one representative with its twins removed.

Certificates (each re-checked in float64 in the original coordinates):

- argmaxable: a hidden vector ``x`` (float64 [d]) and its smallest margin
  ``l_i(x) - max_{j != i} l_j(x) > 0``;
- not argmaxable: weights ``mu`` on other rows with ``||w_i - sum mu_j w_j||_2 <= tol * scale``
  (and ``sum mu_j b_j >= b_i`` with bias). Then for every x,
  ``l_i(x) - max_j l_j(x) <= ||w_i - sum mu_j w_j||_2 ||x||_2``: the token cannot win unless the
  hidden vector is astronomically large. The residual is reported.

Pipeline (each stage timed, tokens settled per stage counted; one module per part):
``prepare`` (:mod:`~vocablens.argmax.preparation`: validation, masks, exact duplicates, centring
and whitening), ``gemm`` and ``reflect`` (:mod:`~vocablens.argmax.certificates`: the certificate
``y = q_i`` for all tokens by one exact all-pairs int8 product over the upper triangle, the pairs
its bound cannot clear scored exactly (:mod:`~vocablens.argmax.near`), then batched reflections of
the near misses on the int8 grid), ``proof`` and ``bias``
(:mod:`~vocablens.argmax.tilt`: rows near the centre by one dense tilted combination each;
:mod:`~vocablens.argmax.sparse`: a few competitors plus the Ball or a tilt for the gap;
:mod:`~vocablens.argmax.proofs`: batched NNLS column generation from the reflect stage's top
competitors, with the mean of the other rows as a shared column, HiGHS LPs as the fallback; the
lifted LP with a bias) and ``verify``
(:mod:`~vocablens.argmax.verify`: float64 re-check). Stage prepare's results are frozen
(:mod:`~vocablens.argmax.prepared`: the source rows, the distinct rows, the whitening and grid);
every stage reads them and settles tokens in one verdict book (:class:`~vocablens.argmax.state.ScanState`).

A solver failure never becomes a verdict: such tokens are ``undecided`` with a reason; so are the
tokens left open when the time budget runs out (reason ``"budget"``; the result names the stages
cut short). Memory: one [n, r] float32 matrix and one [n, r] int8 matrix at a time plus
fixed-size blocks: the whitened rows Z and their int8 grid Q from ``gemm`` to ``bias`` (the
reflect stage scores on Q, :mod:`~vocablens.argmax.scoring`); Q alone in ``verify`` and in the
result. When W is a
file mapping of unwritten pages (:func:`vocablens.models.partial.load_head_only`), its pages go back to
the page cache after each pass (:mod:`~vocablens.models.pages`), so W does not add to that.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from vocablens.argmax.certificates import stage_gemm, stage_reflect
from vocablens.argmax.verify import stage_verify, verify_argmaxable
from vocablens.argmax.distributed import gather as dist_gather
from vocablens.argmax.distributed import deal_open_rows
from vocablens.ops.vocab_parallel.comm import world
from vocablens.argmax.prepared import SourceRows
from vocablens.argmax.preparation import apply_masks, as_numpy, check_input, dedupe, whiten
from vocablens.argmax.lp import stage_bias
from vocablens.models.pages import PageRelease
from vocablens.argmax.proofs import stage_proof
from vocablens.argmax.sparse import screen_interior
from vocablens.argmax.result import (
    ARGMAXABLE, BUDGET, DUPLICATE, PADDING, STAGES, UNARGMAXABLE, UNDECIDED, UNTRAINED, VERDICTS,
    ArgmaxResult, Progress,
)
from vocablens.argmax.state import OutOfTime, ScanState, one_blas_thread
from vocablens.errors import BadInput


def find_unargmaxable(
    W: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    padding: torch.Tensor | None = None,
    untrained: torch.Tensor | None = None,
    include_padding: bool = False,
    include_untrained: bool = False,
    defer: torch.Tensor | None = None,
    reflect_iters: int = 2,
    tol: float = 1e-9,
    block: int = 1024,
    verify: str = "borderline",
    max_rounds: int = 40,
    row_budget_s: float | None = 60.0,
    time_budget_s: float | None = None,
    progress: Progress | None = None,
    device: str = "cpu",
) -> ArgmaxResult:
    """Decide, for every row of an unembedding, whether it can be the strict argmax.

    Args:
        W: unembedding ``[V, d]``, any float dtype (float64 is kept, others are read as float32,
            which is exact for bf16/fp16/fp32 weights).
        bias: optional LM-head bias ``[V]``.
        padding: bool ``[V]``, rows beyond the tokenizer; excluded (neither candidates nor
            competitors) unless ``include_padding``.
        untrained: bool ``[V]``, never-trained rows; excluded unless ``include_untrained``.
        defer: bool ``[V]``, rows whose proofs run last (e.g. reserved special tokens), so a time
            budget is spent on the other rows first. They stay candidates and competitors.
        reflect_iters: scorings per row in the reflect stage (the first at ``y = z_t``, then
            after each reflection). Two by default: one reflection settles most near misses
            (a near-duplicate twin); the rows it leaves are cheaper to separate by the proof
            stage's nearest-point directions (docs/performance-argmax.md).
        tol: relative tolerance of a not-argmaxable certificate: the residual
            ``||w_i - sum mu_j w_j||_2`` must be at most ``tol`` times the largest centred row norm.
        block: query rows per block of the stage-1 matrix product (its products are ``block``
            x as many columns as fit :data:`~vocablens.argmax.certificates.GEMM_BYTES` of scores).
        verify: ``"borderline"`` (float64 re-check of every certificate without a rigorous
            whitened bound and of the :data:`~vocablens.argmax.verify.BORDERLINE` certificates with
            the smallest margin relative to their bound among those with one: stage 1's exact int8
            products and the reflect stage's int8 scorings, whose bounds cover the others) or
            ``"all"`` (float64 re-check of every certificate; 2 V^2 d float64 FLOPs).
        max_rounds: constraint-generation rounds per token before the LP fallback.
        row_budget_s: wall seconds one row's own NNLS rounds may take in the proof stage before it
            is declared undecided (None: no limit); the products its batch shares are not counted,
            so a busy machine does not turn a slow batch into undecided rows.
        time_budget_s: wall seconds for the whole run (None: no limit). When it runs out the
            tokens not yet decided are ``undecided`` with reason ``"budget"`` (never a guessed
            verdict) and :attr:`ArgmaxResult.cut_short` names the stages cut short.
        progress: optional callback ``(stage, done, total)``.
        device: where the all-pairs stage's certificate products run:
            ``"cpu"`` or ``"cuda[:N]"`` (the GPU; the same exact integers, so the same verdicts).

    Returns:
        :class:`ArgmaxResult`.

    Raises:
        ShapeMismatch: W not a non-empty float matrix, bias or masks of the wrong shape.
        BadInput: NaN/inf rows or biases (named), unknown ``verify``, a negative budget, a device
            that is not cpu or an available CUDA GPU.

    Source: Grivas, Bogoychev and Lopez (ACL 2022) for the problem and the reflection filter; the
    whitening, symmetric blocked certificates and NNLS column generation are vocablens's.
    """
    W, bias = check_input(W, bias, {"padding": padding, "untrained": untrained, "defer": defer})
    _check_options(verify, time_budget_s, row_budget_s, device)
    st = ScanState.new(W.shape[0], W.shape[1], tol, progress, time_budget_s)
    st.device = str(device)
    apply_masks(st, padding, untrained, include_padding, include_untrained)
    _prepare(st, W, bias, defer)
    if st.n <= 1 or st.cut_short:
        return st.result()
    _run_stages(st, reflect_iters, block, max_rounds, row_budget_s)
    st.z_to_q()                         # the re-check and the result read Q only: Z goes
    _timed(st, "verify", lambda: stage_verify(st, verify))
    return st.result()


def _check_options(verify: str, time_budget_s, row_budget_s, device: str) -> None:
    """BadInput for an unknown ``verify``, a negative or non-numeric budget, a device that is not
    the CPU or an available CUDA GPU."""
    if verify not in ("borderline", "all"):
        raise BadInput(f"verify must be 'borderline' or 'all'; got {verify!r}")
    for name, v in (("time_budget_s", time_budget_s), ("row_budget_s", row_budget_s)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0):
            raise BadInput(f"{name} must be None or a number of seconds >= 0; got {v!r}")
    try:
        dev = torch.device(str(device))
    except (RuntimeError, ValueError):
        raise BadInput(f"device must be cpu or cuda[:N]; got {device!r}") from None
    if dev.type not in ("cpu", "cuda") or (dev.type == "cuda" and not torch.cuda.is_available()):
        raise BadInput(f"device {device!r}: the scan runs on cpu or an available CUDA GPU"
                       f"{' (CUDA is not available here)' if dev.type == 'cuda' else ''}")


def _prepare(st: ScanState, W: torch.Tensor, bias: torch.Tensor | None, defer: torch.Tensor | None) -> None:
    """Stage prepare: the source rows, the distinct rows (duplicates settled), and with more than
    one distinct row the whitening, Z and Q (:mod:`~vocablens.argmax.preparation`); a budget spent
    here marks the stage cut short."""
    rows = as_numpy(W)
    st.src = SourceRows(rows=rows, bias=None if bias is None else bias.detach().cpu().double().numpy(),
                        defer=None if defer is None else defer.cpu().numpy(),
                        pages=PageRelease(rows))    # W's pages go back after each pass once Z is being built
    try:
        st.distinct = dedupe(st)
        if st.n == 1:
            # one distinct row: it wins (or ties with its twins) everywhere; x = 0 is a certificate
            t = int(st.distinct.ids[0])
            st.x_extra[t] = torch.zeros(st.d, dtype=torch.float64)
            st.settle_arg(t, 0, math.inf)
        if st.n > 1:
            st.white, st.Z, st.Q = whiten(st)
            st.left = np.arange(st.n)
    except OutOfTime:
        st.cut("prepare")
    st.timings["prepare"] = time.perf_counter() - st.t0
    st.cpu["prepare"] = time.process_time() - st.c0


def _timed(st: ScanState, name: str, fn):
    """Run one stage, add its wall and CPU time; Ctrl-C marks the run interrupted."""
    ts, cs = time.perf_counter(), time.process_time()
    try:
        return fn()
    except KeyboardInterrupt:
        st.interrupted = True
    finally:
        st.timings[name] += time.perf_counter() - ts
        st.cpu[name] += time.process_time() - cs


def _run_stages(st: ScanState, reflect_iters: int, block: int, max_rounds: int, row_budget_s) -> None:
    """gemm -> reflect -> proof -> bias, each skipped (and named cut short) once time is up.
    Under torch.distributed the all-pairs stage is split by blocks and the open rows by rank
    (:mod:`~vocablens.argmax.distributed`); every rank ends with the same state."""
    screen = screen_interior if st.src.bias is None else None
    fails: dict = {}
    stages = (("gemm", lambda: stage_gemm(st, block)),
              ("reflect", lambda: stage_reflect(st, reflect_iters, screen)),
              ("proof", lambda: fails.update(stage_proof(st, max_rounds, row_budget_s))),
              ("bias", lambda: stage_bias(st, fails, max_rounds) if st.src.bias is not None else None))
    rank, size = world()
    mine = before = None
    for name, fn in stages:
        if size > 1 and name == "reflect":
            before, mine = dict(st.settled), deal_open_rows(st)
            st.left = mine
        if st.interrupted:
            break
        if st.cut_short or st.time_left() <= 0:
            if name == "gemm" or (name == "bias" and fails) or (name != "bias" and len(st.left)):
                st.cut(name)
            continue
        try:
            if name == "gemm":
                _timed(st, name, fn)    # Q stays: the reflect stage's int8 scores and the tilt read it
            else:
                with one_blas_thread():
                    _timed(st, name, fn)
        except OutOfTime:
            st.cut(name)
            st.left = st.still_open(st.left)
    if size > 1 and mine is not None:
        dist_gather(st, mine, st.left, before)


__all__ = [
    "ARGMAXABLE", "BUDGET", "DUPLICATE", "PADDING", "STAGES", "UNARGMAXABLE", "UNDECIDED", "UNTRAINED",
    "VERDICTS", "ArgmaxResult", "find_unargmaxable", "verify_argmaxable",
]
