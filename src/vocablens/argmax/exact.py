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

Pipeline (each stage timed, tokens settled per stage counted): ``prepare`` (validation, masks,
exact duplicates, centring and whitening), ``gemm`` (the certificate ``y = q_i``, the whitened row
rounded to a global int8 grid, for every token at once: ``Q Q^T`` by blocks in int8 with int32
sums, which is exact integer arithmetic, over the upper triangle only since ``Q Q^T`` is
symmetric — half of the all-pairs work at the int8 rate — with a rigorous bound for the rounding
``z - q``), ``reflect`` (float32 re-check of the failures and at most ``reflect_iters`` batched
reflections of the near misses, the "Braid reflect" of Grivas et al. §4), ``proof`` (for what
remains: non-negative least squares over a generated set of competitors — start from the
``2(r+1)`` nearest, add violated rows until none is violated — giving either a convex combination
or a separating direction; HiGHS linear programs as the fallback), ``bias`` (the lifted LP with
HiGHS for no-bias failures when a bias is used) and ``verify`` (float64 re-check).

A solver failure never becomes a verdict: such tokens are ``undecided`` with a reason.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from vocablens.errors import BadInput, ShapeMismatch

VERDICTS = ("argmaxable", "unargmaxable", "duplicate", "undecided", "padding", "untrained")
ARGMAXABLE, UNARGMAXABLE, DUPLICATE, UNDECIDED, PADDING, UNTRAINED = range(6)
STAGES = ("prepare", "gemm", "reflect", "proof", "bias", "verify")

_U32 = 2.0 ** -24  # unit roundoff of float32

Progress = Callable[[str, int, int], None]
_NOEX = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class ArgmaxResult:
    """Verdict and certificate for every token of an unembedding.

    Attributes:
        verdict: int8 [V], index into :data:`VERDICTS`.
        stage: int8 [V], index into :data:`STAGES` of the stage that settled the token; -1 when the
            row was excluded (padding, never trained).
        margin: float64 [V], argmaxable tokens: the smallest margin ``l_i(x) - max_{j!=i} l_j(x)``
            (logit units, > 0) at the certificate ``x``; a certified lower bound for tokens settled
            by the float32 stages that were not re-checked in float64. NaN for other tokens.
        residual: float64 [V], unargmaxable tokens: ``||w_i - sum_j mu_j w_j||_2`` of the
            certificate (0 for a duplicate beaten by its twin's larger bias). NaN otherwise.
        group: int64 [V], id of the exact-duplicate group a row belongs to, -1 for unique rows.
        group_can_tie: group id -> whether that group can tie for first (its representative wins
            against every row outside the group for some x).
        in_play: bool [V], rows that were candidates and competitors (not excluded).
        center: float64 [d], the row mean ``mu`` subtracted before whitening.
        whiten: float64 [d, r], the whitening map ``A``; a stage-1 certificate is
            ``x_i = s_i * A @ (quant_scale * quant[row[i]])``.
        scale: float64 [V], the factor ``s_i`` above (1 without bias; with bias the no-bias
            certificate is scaled until the biases cannot change the winner).
        quant: int8 [n, r], the whitened distinct rows on the global grid ``quant_scale``.
        quant_scale: the grid step (whitened units).
        row: int64 [V], row of ``quant`` for a distinct row's representative, -1 otherwise.
        x_extra: token -> explicit certificate x (float64 [d]) for tokens settled after stage 1.
        combos: token -> (ids int64 [k], weights float64 [k]) of the convex combination that
            dominates it.
        reasons: token -> why it is undecided.
        timings: stage -> wall seconds.
        settled: stage -> tokens settled there.
        bias_used: whether a bias took part.
        rank: r, numerical rank of the centred rows (dimension after whitening).
        n_unique: distinct rows in play.
        tol: relative tolerance of the not-argmaxable certificates.
        verified_f64: tokens whose certificate was re-checked in float64 by the pipeline.
        interrupted: the run was stopped (Ctrl-C); unsettled tokens are ``undecided``.
    """

    verdict: torch.Tensor
    stage: torch.Tensor
    margin: torch.Tensor
    residual: torch.Tensor
    group: torch.Tensor
    group_can_tie: dict
    in_play: torch.Tensor
    center: torch.Tensor
    whiten: torch.Tensor
    scale: torch.Tensor
    quant: torch.Tensor
    quant_scale: float
    row: torch.Tensor
    x_extra: dict = field(default_factory=dict)
    combos: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    settled: dict = field(default_factory=dict)
    bias_used: bool = False
    rank: int = 0
    n_unique: int = 0
    tol: float = 1e-9
    verified_f64: int = 0
    interrupted: bool = False

    def counts(self) -> dict[str, int]:
        """Tokens per verdict, every verdict present (zeros included)."""
        c = torch.bincount(self.verdict.long(), minlength=len(VERDICTS))
        return {name: int(c[k]) for k, name in enumerate(VERDICTS)}

    def ids(self, verdict: str) -> torch.Tensor:
        """Token ids [k] int64 with the given verdict name."""
        return (self.verdict == VERDICTS.index(verdict)).nonzero().flatten()

    def certificate_x(self, W: torch.Tensor, i: int) -> torch.Tensor:
        """The argmaxable certificate of token ``i`` in the original coordinates, float64 [d].

        Args:
            W: the same ``[V, d]`` matrix the result was computed from (stage-1 certificates are
                rebuilt from it rather than stored).

        Raises:
            BadInput: token ``i`` has no argmaxable certificate (wrong verdict).
        """
        i = int(i)
        if i in self.x_extra:
            return self.x_extra[i]
        v = int(self.verdict[i])
        rep_ok = v == ARGMAXABLE or (v == DUPLICATE and int(self.stage[i]) >= 0 and not math.isnan(float(self.margin[i])))
        if not rep_ok:
            raise BadInput(f"token {i} is {VERDICTS[v]}: it has no argmaxable certificate")
        q = self.quant[int(self.row[i])].double()
        return float(self.scale[i]) * (self.whiten @ (self.quant_scale * q))


# ----------------------------------------------------------------------------------------- helpers
def _as_numpy(W: torch.Tensor) -> np.ndarray:
    """Rows as numpy without losing precision: float64 stays float64, everything else float32."""
    W = W.detach().cpu()
    if W.dtype == torch.float64:
        return W.numpy()
    return W.float().numpy()


def _check_input(W, bias, masks):
    if not isinstance(W, torch.Tensor):
        W = torch.as_tensor(W)
    if W.dim() != 2:
        raise ShapeMismatch(f"W must be a matrix [V, d]; got shape {tuple(W.shape)}")
    V, d = W.shape
    if V < 1 or d < 1:
        raise ShapeMismatch(f"W must have at least one row and one column; got shape {tuple(W.shape)}")
    if not W.is_floating_point():
        raise ShapeMismatch(f"W must be floating point; got {W.dtype}")
    bad = ~torch.isfinite(W).all(dim=1)
    if bool(bad.any()):
        ids = bad.nonzero().flatten()
        raise BadInput(f"W has {len(ids)} row(s) with NaN or inf (ids {ids[:8].tolist()}"
                       f"{' ...' if len(ids) > 8 else ''}): argmaxability is undefined for them; "
                       "fix or mask the rows first")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            bias = torch.as_tensor(bias)
        if bias.shape != (V,):
            raise ShapeMismatch(f"bias must have shape [V] = [{V}]; got {tuple(bias.shape)}")
        badb = ~torch.isfinite(bias)
        if bool(badb.any()):
            ids = badb.nonzero().flatten()
            raise BadInput(f"bias has {len(ids)} NaN/inf entries (ids {ids[:8].tolist()})")
    for name, m in masks.items():
        if m is not None and (not isinstance(m, torch.Tensor) or m.shape != (V,) or m.dtype != torch.bool):
            raise ShapeMismatch(f"{name} must be a bool tensor [V] = [{V}]")
    return W, bias


def _row_scores64(Wn: np.ndarray, rows: np.ndarray | None, X: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """float64 ``W[rows] @ X`` computed in row chunks: [n, k]."""
    idx = np.arange(Wn.shape[0]) if rows is None else rows
    out = np.empty((len(idx), X.shape[1]), dtype=np.float64)
    for s in range(0, len(idx), chunk):
        out[s:s + chunk] = Wn[idx[s:s + chunk]].astype(np.float64) @ X
    return out


def _exact_int_matmul(Q: torch.Tensor):
    """An exact ``(A, B) -> A @ B^T`` for int8 row blocks of Q, int32 result.

    ``torch._int_mm`` (int8 products, int32 sums) is used when it reproduces an int64 reference on
    a sample of Q's own rows (it is wrong for some shapes, e.g. one column); Q is padded with zero
    columns to a multiple of 8 for it. Otherwise float32 products are exact while
    ``127^2 r < 2^24``; beyond that int64.
    """
    n, r = Q.shape
    pad = (-r) % 8
    ref_rows = Q[: min(n, 64)].long()
    ref = ref_rows @ ref_rows.T
    if hasattr(torch, "_int_mm"):
        def f(A, B):
            if pad:
                A = torch.nn.functional.pad(A, (0, pad))
                B = torch.nn.functional.pad(B, (0, pad))
            return torch._int_mm(A.contiguous(), B.contiguous().T)
        try:
            if torch.equal(f(Q[: min(n, 64)], Q[: min(n, 64)]).long(), ref):
                return f
        except RuntimeError:
            pass
    if 127 * 127 * r < 2 ** 24:
        return lambda A, B: (A.float() @ B.float().T).int()
    return lambda A, B: (A.long() @ B.long().T).int()


def _group_identical(Wn: np.ndarray, ids: np.ndarray):
    """Groups of bit-identical rows among ``Wn[ids]``.

    Returns ``(inv, cnt, order)``: group of each row [m], group sizes [g], and the rows sorted by
    group (stable) so that group g is ``ids[order[sum(cnt[:g]):sum(cnt[:g+1])]]``.
    """
    m = len(ids)
    itype = np.int32 if Wn.dtype == np.float32 else np.int64
    rng = np.random.default_rng(0)
    R = rng.integers(-(2 ** 62), 2 ** 62, size=(Wn.shape[1], 2), dtype=np.int64)
    keys = np.empty((m, 2), dtype=np.int64)
    with np.errstate(over="ignore"):
        for s in range(0, m, 8192):
            bits = (Wn[ids[s:s + 8192]] + Wn.dtype.type(0)).view(itype).astype(np.int64)
            keys[s:s + 8192] = bits @ R          # wraps modulo 2^64: an exact function of the bits
    _, inv, cnt = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inv = inv.ravel()
    if (cnt > 1).any():
        # confirm bitwise; split a (vanishingly rare) hash collision into its true groups
        nxt = len(cnt)
        for g in np.nonzero(cnt > 1)[0]:
            mem = np.nonzero(inv == g)[0]
            rows = Wn[ids[mem]] + Wn.dtype.type(0)
            sub = np.unique(rows.view(itype), axis=0, return_inverse=True)[1].ravel()
            for k in range(1, sub.max() + 1):
                inv[mem[sub == k]] = nxt
                nxt += 1
        _, inv = np.unique(inv, return_inverse=True)
        inv = inv.ravel()
        cnt = np.bincount(inv)
    order = np.argsort(inv, kind="stable")
    return inv, cnt, order


# ----------------------------------------------------------------------------------------- main
def find_unargmaxable(
    W: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    padding: torch.Tensor | None = None,
    untrained: torch.Tensor | None = None,
    include_padding: bool = False,
    include_untrained: bool = False,
    reflect_iters: int = 20,
    tol: float = 1e-9,
    block: int = 2048,
    verify: str = "borderline",
    max_rounds: int = 40,
    progress: Progress | None = None,
) -> ArgmaxResult:
    """Decide, for every row of an unembedding, whether it can be the strict argmax.

    Args:
        W: unembedding ``[V, d]``, any float dtype (float64 is kept, others are read as float32,
            which is exact for bf16/fp16/fp32 weights).
        bias: optional LM-head bias ``[V]``.
        padding: bool ``[V]``, rows beyond the tokenizer; excluded (neither candidates nor
            competitors) unless ``include_padding``.
        untrained: bool ``[V]``, never-trained rows; excluded unless ``include_untrained``.
        reflect_iters: batched reflection steps for the near misses of stage 1.
        tol: relative tolerance of a not-argmaxable certificate: the residual
            ``||w_i - sum mu_j w_j||_2`` must be at most ``tol`` times the largest centred row norm.
        block: query rows per block of the stage-1 matrix product.
        verify: ``"borderline"`` (float64 re-check of every certificate from stages 2+ and of the
            256 stage-1 certificates with the smallest margin relative to their error bound; the
            others are covered by the rigorous bound of the exact int8 stage) or ``"all"``
            (float64 re-check of every certificate; 2 V^2 d float64 FLOPs).
        max_rounds: constraint-generation rounds per token before it is declared undecided.
        progress: optional callback ``(stage, done, total)``.

    Returns:
        :class:`ArgmaxResult`.

    Raises:
        ShapeMismatch: W not a non-empty float matrix, bias or masks of the wrong shape.
        BadInput: NaN/inf rows or biases (named), unknown ``verify``.

    Source: Grivas, Bogoychev and Lopez (ACL 2022) for the problem and the reflection filter; the
    whitening, symmetric blocked certificates and NNLS column generation are vocablens's.
    """
    W, bias = _check_input(W, bias, {"padding": padding, "untrained": untrained})
    if verify not in ("borderline", "all"):
        raise BadInput(f"verify must be 'borderline' or 'all'; got {verify!r}")
    V, d = W.shape
    timings: dict[str, float] = {s: 0.0 for s in STAGES}
    settled: dict[str, int] = {s: 0 for s in STAGES}
    t0 = time.perf_counter()
    prog = progress or (lambda *_: None)

    verdict = np.full(V, UNDECIDED, dtype=np.int8)
    stage = np.full(V, -1, dtype=np.int8)
    margin = np.full(V, np.nan)
    residual = np.full(V, np.nan)
    group = np.full(V, -1, dtype=np.int64)
    scale = np.ones(V)
    x_extra: dict[int, torch.Tensor] = {}
    combos: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    reasons: dict[int, str] = {}
    group_can_tie: dict[int, bool] = {}

    in_play = np.ones(V, dtype=bool)
    if padding is not None and not include_padding:
        pm = padding.cpu().numpy()
        verdict[pm] = PADDING
        in_play &= ~pm
    if untrained is not None and not include_untrained:
        um = untrained.cpu().numpy() & in_play
        verdict[um] = UNTRAINED
        in_play &= ~um

    Wn = _as_numpy(W)
    bn = None if bias is None else bias.detach().cpu().double().numpy()
    play_ids = np.nonzero(in_play)[0]
    verdict[play_ids] = UNDECIDED

    # -- exact duplicates (bit-identical rows; -0.0 == +0.0): an exact integer hash of the bits,
    # then a bitwise comparison inside each hash group
    inv, cnt, order = _group_identical(Wn, play_ids)
    reps: list[int] = []          # representative token id per distinct (row, winning bias)
    twins: dict[int, np.ndarray] = {}   # representative -> its exact twins (tie with it)
    gid = 0
    bounds = np.concatenate([[0], np.cumsum(cnt)])
    for g in range(len(cnt)):
        members = play_ids[order[bounds[g]:bounds[g + 1]]]
        if len(members) == 1:
            reps.append(int(members[0]))
            continue
        if bn is None:
            top = members
        else:
            bmax = bn[members].max()
            top = members[bn[members] == bmax]
            for m in members[bn[members] < bmax]:
                # dominated by an identical row with a larger bias: mu = e_top
                verdict[m] = UNARGMAXABLE
                stage[m] = 0
                residual[m] = 0.0
                combos[int(m)] = (torch.tensor([int(top[0])]), torch.tensor([1.0], dtype=torch.float64))
        if len(top) > 1:
            group[members] = gid
            verdict[top] = DUPLICATE
            stage[top] = 0
            twins[int(top[0])] = top[1:]
            gid += 1
        reps.append(int(top[0]))
    reps_a = np.array(sorted(reps), dtype=np.int64)
    n = len(reps_a)
    settled["prepare"] = int(np.sum(stage == 0))

    row_of = np.full(V, -1, dtype=np.int64)
    row_of[reps_a] = np.arange(n)
    quant_box: dict = {"Q": torch.zeros(n, 0, dtype=torch.int8), "qs": 1.0}

    def finish(center, A, rank, interrupted=False, verified=0):
        for t in np.nonzero(verdict == UNDECIDED)[0]:
            reasons.setdefault(int(t), "interrupted" if interrupted else "not settled")
        timings["total"] = time.perf_counter() - t0
        return ArgmaxResult(
            verdict=torch.from_numpy(verdict), stage=torch.from_numpy(stage),
            margin=torch.from_numpy(margin), residual=torch.from_numpy(residual),
            group=torch.from_numpy(group), group_can_tie=group_can_tie,
            in_play=torch.from_numpy(in_play), center=center, whiten=A,
            scale=torch.from_numpy(scale), quant=quant_box["Q"], quant_scale=quant_box["qs"],
            row=torch.from_numpy(row_of), x_extra=x_extra, combos=combos, reasons=reasons,
            timings=timings, settled=settled, bias_used=bn is not None, rank=rank, n_unique=n,
            tol=tol, verified_f64=verified, interrupted=interrupted)

    def settle_arg(t: int, st: int, m: float):
        if verdict[t] == DUPLICATE:
            group_can_tie[int(group[t])] = True
        else:
            verdict[t] = ARGMAXABLE
        stage[t] = st
        margin[t] = m
        settled[STAGES[st]] += 1

    if n == 0:
        timings["prepare"] = time.perf_counter() - t0
        return finish(torch.zeros(d, dtype=torch.float64), torch.zeros(d, 0, dtype=torch.float64), 0)
    if n == 1:
        # one distinct row: it wins (or ties with its twins) everywhere; x = 0 is a certificate
        t = int(reps_a[0])
        x_extra[t] = torch.zeros(d, dtype=torch.float64)
        settle_arg(t, 0, math.inf)
        timings["prepare"] = time.perf_counter() - t0
        return finish(torch.zeros(d, dtype=torch.float64), torch.zeros(d, 0, dtype=torch.float64), 0)

    # -- centring and whitening on the numerical range (float64). Any invertible A gives the same
    # answer; A only has to keep every direction the rows really use.
    U = torch.from_numpy(Wn[reps_a])
    mu_t = torch.zeros(d, dtype=torch.float64)
    for s_ in range(0, n, 16384):
        mu_t += U[s_:s_ + 16384].double().sum(0)
    mu_t /= n
    C = torch.zeros(d, d, dtype=torch.float64)
    for s_ in range(0, n, 16384):
        Xc = U[s_:s_ + 16384].double() - mu_t
        C += Xc.T @ Xc
    lam, vec = torch.linalg.eigh(C)
    lam, vec = lam.numpy(), vec.numpy()
    keep = lam > max(lam[-1], 0.0) * 1e-12
    if not keep.any():
        keep[-1] = True
    A = vec[:, keep] / np.sqrt(lam[keep])           # [d, r]
    r = A.shape[1]
    mu = mu_t.numpy()
    At = torch.from_numpy(A)
    Z = np.empty((n, r), dtype=np.float32)
    wsq = 0.0
    for s_ in range(0, n, 16384):
        Xc = U[s_:s_ + 16384].double() - mu_t
        wsq = max(wsq, float((Xc * Xc).sum(1).max()))
        Z[s_:s_ + 16384] = (Xc @ At).float().numpy()
    del U, Xc
    wscale = math.sqrt(wsq) or 1.0
    Zt = torch.from_numpy(Z)
    # global int8 grid for stage 1: q = round(z / qs), e = z - qs q (z exact: + float32 rounding)
    qs = float(np.abs(Z).max()) * (1 + 1e-6) / 127.0 or 1.0
    Q = np.empty((n, r), dtype=np.int8)
    enorm = np.empty(n)
    for s_ in range(0, n, 16384):
        zc = Z[s_:s_ + 16384].astype(np.float64)
        qc = np.rint(zc / qs)
        Q[s_:s_ + 16384] = qc.astype(np.int8)
        enorm[s_:s_ + 16384] = np.linalg.norm(zc - qs * qc, axis=1) + 1.01 * _U32 * np.linalg.norm(zc, axis=1)
    emax = float(enorm.max())
    Qt = torch.from_numpy(Q)
    imm = _exact_int_matmul(Qt)
    quant_box.update(Q=Qt, qs=qs)
    znorm = np.linalg.norm(Z.astype(np.float64), axis=1)
    zmax = float(znorm.max())
    gamma = r * _U32 / (1 - r * _U32)
    coef = (gamma + 3 * _U32) * 1.01
    center_t, A_t = torch.from_numpy(mu), torch.from_numpy(A)
    bmax = float(bn[reps_a].max()) if bn is not None else 0.0
    rep_pos = {int(t): k for k, t in enumerate(reps_a)}

    def z64(idx) -> np.ndarray:
        """Whitened rows in float64, computed afresh from W: [len(idx), r]."""
        return (Wn[reps_a[np.asarray(idx)]].astype(np.float64) - mu) @ A
    # competitors excluded for a representative: its own twins (they tie, they do not beat it)
    timings["prepare"] = time.perf_counter() - t0

    interrupted = False
    left = np.arange(n)
    try:
        # -- stage 1: y = q_i (z_i rounded to a global int8 grid) for all tokens at once.
        # Q Q^T is computed by blocks in int8 with int32 accumulation: exact integers, and only the
        # upper triangle (Q Q^T is symmetric: each block serves its rows and its columns).
        ts = time.perf_counter()
        best = torch.full((n,), torch.iinfo(torch.int32).min, dtype=torch.int32)
        diag = (Qt.int() * Qt.int()).sum(1)
        col_chunk = max(block, 8192)
        for i0 in range(0, n, block):
            i1 = min(n, i0 + block)
            QI = Qt[i0:i1]
            for c0 in range(i0, n, col_chunk):
                c1 = min(n, c0 + col_chunk)
                S = imm(QI, Qt[c0:c1])                      # [bi, bc] int32, exact
                if c0 == i0:
                    k = min(i1, c1) - i0
                    ar = torch.arange(k)
                    S[ar, ar] = torch.iinfo(torch.int32).min
                best[i0:i1] = torch.maximum(best[i0:i1], S.amax(1))
                best[c0:c1] = torch.maximum(best[c0:c1], S.amax(0))
            prog("gemm", i1, n)
        # z_j . y = s^2 q_j . q_t + e_j . y with |e_j . y| <= ||e_j|| ||y||, y = s q_t
        qn = np.sqrt(diag.double().numpy())
        ynorm = qs * qn
        m1 = qs * qs * (diag.double().numpy() - best.double().numpy()) - (enorm + emax) * ynorm * 1.001
        ok = (m1 > 0) & (qn > 0)
        for k in np.nonzero(ok)[0]:
            t = int(reps_a[k])
            m0 = float(m1[k])
            if bn is not None:
                scale[t] = 2.0 * max(1.0, (bmax - bn[t]) / m0)
                m0 = scale[t] * m0 - (bmax - bn[t])
            settle_arg(t, 1, m0)
        left = np.nonzero(~ok)[0]
        s1_ratio = np.where(ok, m1 / ((enorm + emax) * ynorm + 1e-300), 0.0)
        timings["gemm"] = time.perf_counter() - ts

        # -- stage 2: batched reflections of the near misses
        ts = time.perf_counter()
        if len(left) and reflect_iters > 0:
            Y = Zt[torch.from_numpy(left)].T.clone()       # [r, m]
            cols = torch.from_numpy(left)
            for it in range(reflect_iters):
                S = Zt @ Y                                 # [n, m]
                ar = torch.arange(len(cols))
                own = S[cols, ar].clone()
                S[cols, ar] = -math.inf
                bestv, jstar = S.max(0)
                ynorm = Y.double().norm(dim=0).numpy()
                mm = (own - bestv).double().numpy()
                bnd = coef * ynorm * (znorm[cols.numpy()] + zmax) + 1e-30
                done = mm > bnd
                for q in np.nonzero(done)[0]:
                    k = int(cols[q])
                    t = int(reps_a[k])
                    m0 = mm[q] - bnd[q]
                    y = Y[:, q].double().numpy()
                    s_ = 1.0
                    if bn is not None:
                        s_ = 2.0 * max(1.0, (bmax - bn[t]) / m0)
                        m0 = s_ * m0 - (bmax - bn[t])
                    x_extra[t] = torch.from_numpy(s_ * (A @ y))
                    settle_arg(t, 2, m0)
                keepc = torch.from_numpy(~done)
                Y, cols, jstar = Y[:, keepc], cols[keepc], jstar[keepc]
                prog("reflect", it + 1, reflect_iters)
                if len(cols) == 0:
                    break
                nv = Zt[cols].T - Zt[jstar].T                # [r, m]  z_t - z_j
                coefr = (nv * Y).sum(0) / (nv * nv).sum(0).clamp_min(1e-30)
                Y = Y - 2.0 * coefr * nv
            left = cols.numpy()
        timings["reflect"] = time.perf_counter() - ts

        # -- stage 3: exact proofs (NNLS column generation, HiGHS LP fallback)
        ts = time.perf_counter()
        nobias_fail: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for q, k in enumerate(left):
            t = int(reps_a[k])
            excl = _NOEX  # twins are not rows of Z: a representative competes without them
            res = _prove(Zt, z64, int(k), excl, tol, max_rounds)
            if res[0] == "arg":
                y = res[1]
                x = A @ y
                m0 = res[2]
                s_ = 1.0
                if bn is not None:
                    s_ = 2.0 * max(1.0, (bmax - bn[t]) / m0)
                    m0 = s_ * m0 - (bmax - bn[t])
                x_extra[t] = torch.from_numpy(s_ * x)
                settle_arg(t, 3, m0)
            elif res[0] == "int":
                nobias_fail[t] = (reps_a[res[1]], res[2])
            else:
                reasons[t] = res[1]
            prog("proof", q + 1, len(left))
        # not-argmaxable (no bias): check the combination in the original coordinates
        for t, (ids, wts) in list(nobias_fail.items()):
            rvec = Wn[ids].astype(np.float64).T @ wts - Wn[t].astype(np.float64)
            rn = float(np.linalg.norm(rvec))
            if rn > tol * wscale:
                reasons[t] = f"convex combination found but its residual {rn:.3g} exceeds the tolerance"
                del nobias_fail[t]
                continue
            if bn is None:
                _settle_unarg(t, ids, wts, rn, 3, verdict, stage, residual, combos, group, group_can_tie)
                settled["proof"] += 1
        timings["proof"] = time.perf_counter() - ts

        # -- bias: lifted LP (HiGHS) for the no-bias failures
        ts = time.perf_counter()
        if bn is not None:
            bz = bn[reps_a]
            items = list(nobias_fail.items())
            for q, (t, (ids, wts)) in enumerate(items):
                k = rep_pos[t]
                excl = _NOEX  # twins are not rows of Z: a representative competes without them
                start = np.array([rep_pos[int(x)] for x in ids], dtype=np.int64)
                out = _lp_bias(Zt, z64, bz, k, excl, start, tol, max_rounds)
                if out[0] == "arg":
                    y, s_, m0 = out[1], out[2], out[3]
                    x_extra[t] = torch.from_numpy(A @ (y / s_))
                    settle_arg(t, 4, m0)
                elif out[0] == "int":
                    ids2, wts2 = reps_a[out[1]], out[2]
                    rvec = Wn[ids2].astype(np.float64).T @ wts2 - Wn[t].astype(np.float64)
                    rn = float(np.linalg.norm(rvec))
                    gap = float(bn[ids2] @ wts2 - bn[t])
                    if rn <= tol * wscale and gap >= -tol * (1.0 + abs(bn[t])):
                        _settle_unarg(t, ids2, wts2, rn, 4, verdict, stage, residual, combos, group,
                                      group_can_tie)
                        settled["bias"] += 1
                    else:
                        reasons[t] = f"lifted LP certificate failed its check (residual {rn:.3g}, bias gap {gap:.3g})"
                else:
                    reasons[t] = out[1]
                prog("bias", q + 1, len(items))
        timings["bias"] = time.perf_counter() - ts
    except KeyboardInterrupt:
        interrupted = True

    # -- verify: float64 re-check in the original coordinates
    ts = time.perf_counter()
    verified = 0
    try:
        cand = [t for t in np.nonzero((stage >= 1) & ~np.isnan(margin))[0]]
        if verify == "all":
            chosen = np.array(cand, dtype=np.int64)
        else:
            s1 = np.array([t for t in cand if stage[t] == 1], dtype=np.int64)
            later = np.array([t for t in cand if stage[t] != 1], dtype=np.int64)
            pick = []
            if len(s1):
                ks = np.array([rep_pos[int(t)] for t in s1])
                ratio = s1_ratio[ks]
                pick = list(s1[np.argsort(ratio)[:256]])
            chosen = np.unique(np.concatenate([later, np.array(pick, dtype=np.int64)])).astype(np.int64)
        res = verify_argmaxable(Wn, bn, in_play, chosen, lambda t: _cert(t, x_extra, scale, Q, qs, row_of, A),
                                twins_of=lambda t: twins.get(int(t), np.zeros(0, dtype=np.int64)),
                                progress=lambda a, b: prog("verify", a, b))
        for t, m in zip(chosen, res):
            verified += 1
            if m > 0:
                margin[t] = m
            else:
                # never report a verdict the float64 check does not confirm
                if verdict[t] == DUPLICATE:
                    group_can_tie.pop(int(group[t]), None)
                else:
                    verdict[t] = UNDECIDED
                reasons[int(t)] = f"float64 re-check of the certificate gave margin {m:.3g}"
                margin[t] = np.nan
    except KeyboardInterrupt:
        interrupted = True
    settled["verify"] = verified
    timings["verify"] = time.perf_counter() - ts
    for t in twins:
        group_can_tie.setdefault(int(group[t]), False)
    return finish(center_t, A_t, r, interrupted, verified)


def _settle_unarg(t, ids, wts, rn, st, verdict, stage, residual, combos, group, group_can_tie):
    if verdict[t] == DUPLICATE:
        group_can_tie[int(group[t])] = False
    else:
        verdict[t] = UNARGMAXABLE
    stage[t] = st
    residual[t] = rn
    combos[int(t)] = (torch.from_numpy(np.asarray(ids, dtype=np.int64)), torch.from_numpy(np.asarray(wts, dtype=np.float64)))


def _cert(t, x_extra, scale, Q, qs, row_of, A) -> np.ndarray:
    t = int(t)
    if t in x_extra:
        return x_extra[t].numpy()
    return scale[t] * (A @ (qs * Q[row_of[t]].astype(np.float64)))


def verify_argmaxable(Wn, bn, in_play, tokens, cert, twins_of=None, chunk: int = 512, progress=None):
    """float64 margins ``l_t(x_t) - max_{j in play, j != t, j not a twin} l_j(x_t)`` for tokens [k].

    Args:
        Wn: rows ``[V, d]`` (numpy, float32 or float64); bn: bias [V] or None; in_play: bool [V].
        tokens: int64 [k]; cert: ``t -> x`` float64 [d].

    Returns:
        float64 [k] margins (logit units).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    out = np.empty(len(tokens))
    play = np.nonzero(in_play)[0]
    pos = np.full(len(in_play), -1)
    pos[play] = np.arange(len(play))
    for s in range(0, len(tokens), chunk):
        tk = tokens[s:s + chunk]
        X = np.stack([cert(t) for t in tk], axis=1)               # [d, k]
        L = _row_scores64(Wn, play, X)                             # [n_play, k]
        if bn is not None:
            L += bn[play][:, None]
        for q, t in enumerate(tk):
            own = L[pos[t], q]
            L[pos[t], q] = -np.inf
            if twins_of is not None:
                tw = twins_of(t)
                if len(tw):
                    L[pos[tw], q] = -np.inf
            out[s + q] = own - L[:, q].max() if L.shape[0] > 1 else math.inf
        if progress:
            progress(min(s + chunk, len(tokens)), len(tokens))
    return out


# ----------------------------------------------------------------------------------------- proofs
def _scores(Zt: torch.Tensor, y: np.ndarray) -> tuple[np.ndarray, float]:
    """float32 scores ``Z y`` [n] as float64 and a slack that covers their rounding error."""
    yt = torch.from_numpy(np.ascontiguousarray(y)).float()
    sc = (Zt @ yt).double().numpy()
    r = Zt.shape[1]
    zmax = float(Zt.norm(dim=1).max())
    ynorm = float(yt.double().norm())
    slack = 2.02 * (r * _U32 / (1 - r * _U32) + 3 * _U32) * ynorm * zmax + 1e-300
    return sc, slack


def _prove(Zt: torch.Tensor, z64, k: int, excl: np.ndarray, tol: float, max_rounds: int):
    """No-bias proof for whitened row k by NNLS column generation.

    Returns ``("arg", y [r], margin)``, ``("int", ids [m], weights [m])`` or ``("undecided", why)``.
    """
    from scipy.optimize import nnls

    n, r = Zt.shape
    zt = z64([k])[0]
    s = (Zt @ Zt[k]).double()
    s[k] = -math.inf
    if len(excl):
        s[torch.from_numpy(excl)] = -math.inf
    allowed = torch.isfinite(s)
    if not bool(allowed.any()):
        return ("arg", np.zeros(r), math.inf)
    n0 = min(int(allowed.sum()), 2 * (r + 1))
    S = torch.topk(s, n0).indices.numpy()
    Sset = set(S.tolist())
    for _ in range(max_rounds):
        D = z64(S) - zt                                              # [m, r] float64
        dn = np.linalg.norm(D, axis=1)
        om = 10.0 * float(np.median(dn)) + 1e-30
        M = np.vstack([D.T, np.full((1, len(S)), om)])
        rhs = np.zeros(r + 1)
        rhs[-1] = om
        try:
            mu, _ = nnls(M, rhs, maxiter=50 * (len(S) + r))
        except Exception as exc:  # noqa: BLE001 — a solver failure is never a verdict
            return _lp_nobias(Zt, z64, k, excl, S, tol, max_rounds, f"NNLS failed ({exc})")
        tot = mu.sum()
        if tot <= 0:
            return _lp_nobias(Zt, z64, k, excl, S, tol, max_rounds, "NNLS returned zero weights")
        w = mu / tot
        g = w @ D                                                    # hull point - z_t
        if np.linalg.norm(g) <= tol * float(np.median(dn)):
            sup = w > 0
            return ("int", S[sup], w[sup])
        y = -g
        sc, slack = _scores(Zt, y)
        own = sc[k]
        sc[k] = -np.inf
        if len(excl):
            sc[excl] = -np.inf
        viol = np.nonzero(sc >= own - slack)[0]
        if len(viol) == 0:
            # report the certificate at the token's own whitened norm (margins comparable to stage 1)
            f = float(np.linalg.norm(zt)) / float(np.linalg.norm(y))
            return ("arg", f * y, f * float(own - sc.max()))
        new = [int(v) for v in viol[np.argsort(-sc[viol])] if int(v) not in Sset][:500]
        if not new:
            return _lp_nobias(Zt, z64, k, excl, S, tol, max_rounds, "NNLS column generation stalled")
        Sset.update(new)
        S = np.concatenate([S, np.array(new, dtype=np.int64)])
    return _lp_nobias(Zt, z64, k, excl, S, tol, max_rounds, "NNLS did not converge")


def _lp_nobias(Zt, z64, k, excl, S, tol, max_rounds, why):
    out = _lp_bias(Zt, z64, None, k, excl, S, tol, max_rounds)
    if out[0] == "arg":
        zt = z64([k])[0]
        f = float(np.linalg.norm(zt)) / float(np.linalg.norm(out[1]))
        return ("arg", f * out[1], f * out[3])
    if out[0] == "int":
        return out
    return ("undecided", f"{why}; LP: {out[1]}")


def _lp_bias(Zt, z64, bz, k, excl, S, tol, max_rounds):
    """HiGHS LP with constraint generation (Grivas et al.'s Chebyshev LP, reformulated).

    max tau  s.t.  (z_j - z_k).y + (b_j - b_k) s + tau <= 0  (j in S),  -1 <= y <= 1,
    0 <= s <= 1 (s fixed to 0 without bias), tau <= 1. Its optimum is
    ``min_{mu in simplex} ||sum mu_j (z_j - z_k)||_1 + max(0, sum mu_j (b_k - b_j))``; the row duals
    are ``mu``. The verdict comes from the optimal value, never from a solver status.

    Returns ``("arg", y, s, margin)``, ``("int", ids, weights)`` or ``("undecided", why)``.
    """
    from scipy.optimize import linprog

    n, r = Zt.shape
    zt = z64([k])[0]
    S = np.asarray(S, dtype=np.int64)
    Sset = set(S.tolist())
    has_b = bz is not None
    for _ in range(max_rounds):
        D = z64(S) - zt
        cols = [D]
        if has_b:
            cols.append((bz[S] - bz[k])[:, None])
        else:
            cols.append(np.zeros((len(S), 1)))
        cols.append(np.ones((len(S), 1)))
        Aub = np.hstack(cols)
        c = np.zeros(r + 2)
        c[-1] = -1.0
        bounds = [(-1.0, 1.0)] * r + [(0.0, 1.0 if has_b else 0.0), (None, 1.0)]
        try:
            res = linprog(c, A_ub=Aub, b_ub=np.zeros(len(S)), bounds=bounds, method="highs",
                          options={"primal_feasibility_tolerance": 1e-10,
                                   "dual_feasibility_tolerance": 1e-10})
        except Exception as exc:  # noqa: BLE001
            return ("undecided", f"HiGHS failed ({exc})")
        if res.status != 0 or res.x is None:
            return ("undecided", f"HiGHS status {res.status}: {res.message}")
        tau = float(res.x[-1])
        scaleD = float(np.median(np.abs(D).sum(1))) + 1e-30
        if tau <= tol * scaleD:
            mu = -np.asarray(res.ineqlin.marginals)
            mu = np.clip(mu, 0, None)
            if mu.sum() <= 0:
                return ("undecided", "HiGHS gave no dual multipliers")
            mu /= mu.sum()
            sup = mu > 1e-15
            return ("int", S[sup], mu[sup] / mu[sup].sum())
        y, s_ = res.x[:r], float(res.x[r])
        if has_b and s_ <= 0:
            # tau > 0 with s = 0 would be a no-bias certificate; it cannot happen for a no-bias
            # failure, but use it if it does (scale the bias away)
            s_ = 1e-12
        sc, slack = _scores(Zt, y)
        own = sc[k]
        if has_b:
            sc = sc / s_ + bz
            own = sc[k]
            slack = slack / s_
        sc[k] = -np.inf
        if len(excl):
            sc[excl] = -np.inf
        viol = np.nonzero(sc >= own - slack)[0]
        if len(viol) == 0:
            m0 = float(own - sc.max())
            return ("arg", y, s_ if has_b else 1.0, m0)
        new = [int(v) for v in viol[np.argsort(-sc[viol])] if int(v) not in Sset][:500]
        if not new:
            return ("undecided", "LP constraint generation stalled")
        Sset.update(new)
        S = np.concatenate([S, np.array(new, dtype=np.int64)])
    return ("undecided", "LP did not converge")
