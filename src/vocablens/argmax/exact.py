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
(:mod:`~vocablens.argmax.prepared`: the source rows, the distinct rows, the whitening and grid) and
every later stage reads them through one frozen :class:`~vocablens.argmax.scan.Scan`. Each stage
takes the rows the one before left open and returns a frozen
:class:`~vocablens.argmax.decisions.StageResult`: the tokens it decided, each with its certificate
or the reason it gave up, and the rows still open. Only this driver folds those results into the
per-token arrays (:class:`~vocablens.argmax.book.VerdictBook`) and freezes them into the
:class:`ArgmaxResult`.

A solver failure never becomes a verdict: such tokens are ``undecided`` with a reason; so are the
tokens left open when the time budget runs out (reason ``"budget"``; the result names the stages
cut short). Memory: one [n, r] float32 matrix and one [n, r] int8 matrix at a time plus
fixed-size blocks: the whitened rows Z and their int8 grid Q from ``gemm`` to ``bias`` (the
reflect stage scores on Q, :mod:`~vocablens.argmax.scoring`); Q alone in ``verify`` and in the
result. When W is a
file mapping of unwritten pages (:func:`vocablens.models.files.partial.load_head_only`), its pages go back to
the page cache after each pass (:mod:`~vocablens.models.files.pages`), so W does not add to that.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import torch

from vocablens.argmax.blocks import one_blas_thread
from vocablens.argmax.book import VerdictBook
from vocablens.argmax.certificates import stage_gemm, stage_reflect
from vocablens.argmax.decisions import Argmaxable, StageResult, Stopped
from vocablens.argmax.distributed import exchange
from vocablens.argmax.lp import stage_bias
from vocablens.argmax.preparation import as_numpy, check_input, dedupe, excluded, whiten
from vocablens.argmax.prepared import SourceRows
from vocablens.argmax.proofs import stage_proof
from vocablens.argmax.result import (
    ARGMAXABLE, BUDGET, DUPLICATE, PADDING, STAGES, UNARGMAXABLE, UNDECIDED, UNTRAINED, VERDICTS,
    ArgmaxResult, Progress,
)
from vocablens.argmax.scan import Clock, Scan
from vocablens.argmax.sparse import InteriorParts
from vocablens.argmax.verify import stage_verify, verify_argmaxable
from vocablens.errors import BadInput
from vocablens.models.files.pages import PageRelease
from vocablens.ops.vocab_parallel.comm import world


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
    book = VerdictBook(W.shape[0], W.shape[1], tol, time_budget_s, bias is not None)
    clock = Clock(t0=book.t0, deadline=None if time_budget_s is None else book.t0 + float(time_budget_s),
                  progress=progress or (lambda *_: None))
    book.exclude(*excluded(padding, untrained, include_padding, include_untrained))
    scan, distinct = _prepare(book, clock, W, bias, defer, tol, str(device))
    if scan is None:
        return book.result(None, distinct)
    scan = _run_stages(book, scan, reflect_iters, block, max_rounds, row_budget_s)
    scan = scan.without_z()             # the re-check and the result read Q only: Z goes
    _timed(book, "verify", lambda: book.fold_verify(*stage_verify(
        scan, verify, book.argmaxable_candidates(), book.bound_ratio, book.x_extra, book.scale, book.in_play)))
    return book.result(scan, distinct)


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


def _prepare(book: VerdictBook, clock: Clock, W: torch.Tensor, bias: torch.Tensor | None,
             defer: torch.Tensor | None, tol: float, device: str):
    """Stage prepare: the source rows, the distinct rows (duplicates folded into the book), and with
    more than one distinct row the whitening, Z and Q (:mod:`~vocablens.argmax.preparation`).
    Returns ``(scan, distinct)``: the :class:`~vocablens.argmax.scan.Scan` (None when there is
    nothing left to decide: one distinct row, or a budget spent here, which marks the stage cut
    short) and the distinct rows (None when the budget ran out before them)."""
    rows = as_numpy(W)
    source = SourceRows(rows=rows, bias=None if bias is None else bias.detach().cpu().double().numpy(),
                        defer=None if defer is None else defer.cpu().numpy(),
                        pages=PageRelease(rows))    # W's pages go back after each pass once Z is being built
    scan = distinct = None
    with Stopped() as stop:
        distinct, groups, dominated = dedupe(source, book.in_play, clock)
        book.fold_duplicates(groups, dominated)
        if len(distinct.ids) == 1:
            # one distinct row: it wins (or ties with its twins) everywhere; x = 0 is a certificate
            t = int(distinct.ids[0])
            one = Argmaxable(token=t, stage=0, margin=math.inf, x=torch.zeros(book.d, dtype=torch.float64))
            book.fold(StageResult(name="prepare", decided=(one,), open=np.zeros(0, dtype=np.int64)))
        if len(distinct.ids) > 1:
            white, Z, Q = whiten(source, distinct, clock)
            scan = Scan(V=book.V, d=book.d, tol=tol, clock=clock, source=source, distinct=distinct,
                        white=white, Z=Z, Q=Q, device=device)
    if stop.interrupted:
        raise KeyboardInterrupt
    if stop.cut:
        book.cut("prepare")
        scan = None
    book.timings["prepare"] = time.perf_counter() - book.t0
    book.cpu["prepare"] = time.process_time() - book.c0
    return scan, distinct


def _timed(book: VerdictBook, name: str, fn):
    """Run one stage, add its wall and CPU time; Ctrl-C marks the run interrupted."""
    ts, cs = time.perf_counter(), time.process_time()
    try:
        return fn()
    except KeyboardInterrupt:
        book.interrupted = True
    finally:
        book.add_time(name, time.perf_counter() - ts, time.process_time() - cs)


def _run_stages(book: VerdictBook, scan: Scan, reflect_iters: int, block: int, max_rounds: int,
                row_budget_s) -> Scan:
    """gemm -> reflect -> proof -> bias, each taking the rows the one before left open and each
    skipped (and named cut short) once time is up; their results folded into the book in order.
    Returns the scan with stage gemm's int8 kernel. Under torch.distributed the all-pairs stage is
    split by blocks and the open rows by rank (:mod:`~vocablens.argmax.distributed`); every rank
    then folds every rank's results, so all end with the same book."""
    has_bias = scan.source.bias is not None
    parts = None if has_bias else InteriorParts()      # the Ball and the tilt's sums, built on first use
    rank, size = world()
    left, lifted, start_top = np.arange(scan.n), {}, {}
    mine: list | None = None
    for name in ("gemm", "reflect", "proof", "bias"):
        if size > 1 and name == "reflect":
            left, mine = left[rank::size], []           # this rank's share of the open rows
        if book.interrupted:
            break
        if book.cut_short or scan.time_left() <= 0:
            if name == "gemm" or (name == "bias" and lifted) or (name != "bias" and len(left)):
                book.cut(name)
            continue
        if name == "gemm":
            res = _timed(book, name, lambda: stage_gemm(scan, block))  # Q stays: reflect and the tilt read it
        elif name == "bias" and not has_bias:
            continue
        else:
            fn = {"reflect": lambda: stage_reflect(scan, left, reflect_iters, parts),
                  "proof": lambda: stage_proof(scan, left, max_rounds, row_budget_s, start_top, parts),
                  "bias": lambda: stage_bias(scan, lifted, max_rounds)}[name]
            with one_blas_thread():
                res = _timed(book, name, fn)
        if res is None:                                 # Ctrl-C outside a stage's own guard
            break
        book.fold(res)
        if name == "gemm":
            scan = replace(scan, products=res.products, q_norm_max=math.sqrt(res.q_dot_max or 0.0))
        left, start_top, lifted = res.open, res.start_top, res.lifted
        if mine is not None:
            mine.append(replace(res, start_top={}, lifted={}))
    if mine is not None:
        for r, theirs in enumerate(exchange(mine)):
            if r != rank:
                for res in theirs:
                    book.fold(replace(res, interrupted=False))
    return scan


__all__ = [
    "ARGMAXABLE", "BUDGET", "DUPLICATE", "PADDING", "STAGES", "UNARGMAXABLE", "UNDECIDED", "UNTRAINED",
    "VERDICTS", "ArgmaxResult", "find_unargmaxable", "verify_argmaxable",
]
