"""The cheaper paths of the exact argmax scan (issue 26): the NaN/inf check by one product, the
all-pairs maxima over worker threads and products narrower than a block, the pooled reflections, and
the Ball's reach (a filter that skips building the Ball). Each gives what the plain computation gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vocablens.argmax import find_unargmaxable
from vocablens.argmax import certificates as cert
from vocablens.argmax import preparation as prep
from vocablens.argmax import kernels
from vocablens.argmax.blocks import run_in_workers
from vocablens.argmax.prepared import DistinctRows, SourceRows
from vocablens.argmax.scan import Clock, Scan
from vocablens.errors import BadInput


def _prepared(W: torch.Tensor) -> Scan:
    """The scan after stage prepare (no bias, every row in play) with the int8 kernel and
    ``q_norm_max`` stage gemm would give it."""
    W, _ = prep.check_input(W, None, {})
    clock = Clock(t0=0.0, deadline=None, progress=lambda *_: None)
    source = SourceRows(rows=prep.as_numpy(W), bias=None, defer=None, pages=None)
    distinct, _, _ = prep.dedupe(source, np.ones(W.shape[0], dtype=bool), clock)
    white, Z, Q = prep.whiten(source, distinct, clock)
    qn = float(np.sqrt(float((Q.to(torch.int32) ** 2).sum(1).max())))
    return Scan(V=W.shape[0], d=W.shape[1], tol=1e-9, clock=clock, source=source, distinct=distinct,
                white=white, Z=Z, Q=Q, products=kernels.exact_products(Q), q_norm_max=qn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_nonfinite_rows_are_named_and_overflowing_sums_are_not(dtype):
    for val in (float("nan"), float("inf"), -float("inf")):
        for pos in (0, 7, 63):
            W = torch.randn(300, 64).to(dtype)
            W[123, pos] = val
            with pytest.raises(BadInput, match=r"ids \[123\]"):
                prep.check_input(W, None, {})
    W = torch.randn(300, 64).to(dtype)
    W[5, :] = torch.finfo(dtype).max            # finite entries whose sum overflows: not flagged
    W[6, :] = -torch.finfo(dtype).max
    W[7, 0], W[7, 1] = torch.finfo(dtype).max, -torch.finfo(dtype).max
    prep.check_input(W, None, {})


def test_all_pairs_maxima_over_workers_and_narrow_products_are_exact(monkeypatch):
    # 203 rows, blocks of 16 rows, products of 5 columns (the diagonal square of a block crosses
    # several products) on 2 worker threads: the maxima equal the int64 brute force, diagonal excluded
    g = torch.Generator().manual_seed(3)
    Q = torch.randint(-127, 128, (203, 40), generator=g, dtype=torch.int8)
    Q[17] = Q[18]                                   # a tie across a product edge
    ref = Q.long() @ Q.long().T
    ref.fill_diagonal_(torch.iinfo(torch.int64).min)
    want = ref.max(1).values
    st = Scan(V=203, d=40, tol=1e-9, clock=Clock(t0=0.0, deadline=None, progress=lambda *_: None),
              source=None, distinct=DistinctRows(ids=np.arange(203), position=np.arange(203), twins={}),
              white=None, Z=None, Q=Q)
    monkeypatch.setattr(cert, "GEMM_BYTES", 4 * 40 * 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        # near thresholds: each row's 3rd-largest product (a few pairs each), row 5 very low (it
        # overflows the per-worker cap and is left open), row 9 above everything (no pairs)
        T = ref.topk(3, dim=1).values[:, -1].numpy().astype(np.int64)
        T[5], T[9] = -10 ** 6, 10 ** 6
        best, done, near, _, cut = cert._dense_maxima(st, 16, 0, 1, T)
        assert torch.get_num_threads() == 2          # restored after the workers
    finally:
        torch.set_num_threads(threads)
    assert done == 203 and not cut
    assert torch.equal(best.long(), want)
    # the near pairs are exactly the (t, j), j != t, with q_t . q_j >= T_t, for every row not left open
    assert near.over[5] and near.over.sum() == 1
    t, j = near.gathered()
    got = set(zip(t.tolist(), j.tolist()))
    R = ref.numpy()
    exp = {(a, b) for a in range(203) for b in np.nonzero(R[a] >= T[a])[0].tolist() if a != 5}
    assert got == exp and not any(a == 9 for a, _ in got)


def test_run_in_workers_covers_every_item_once_and_raises_the_first_error():
    for static in (False, True):
        seen: list = []
        run_in_workers(range(50), lambda x, w: seen.append((x, w)), 3, static=static)
        assert sorted(x for x, _ in seen) == list(range(50))
        if static:                                  # worker w took items w, w + 3, ...
            assert all(x % 3 == w for x, w in seen)

    def boom(x, w):
        if x == 7:
            raise ValueError("item 7")
    with pytest.raises(ValueError, match="item 7"):
        run_in_workers(range(40), boom, 2)


def test_pooled_reflections_give_the_verdicts_of_one_column_at_a_time(monkeypatch):
    # rows with widely spread norms fail the int8 certificate often (the near misses go to reflect);
    # a pool one column wide runs each column's reflections alone: the same verdicts
    rng = np.random.default_rng(0)
    W = rng.standard_normal((1200, 16)) * np.exp(0.8 * rng.standard_normal((1200, 1)))
    W = torch.from_numpy(W)
    ref = find_unargmaxable(W)
    assert ref.settled["reflect"] > 0
    monkeypatch.setattr(cert, "REFLECT_COLS", 1)
    one = find_unargmaxable(W)
    assert torch.equal(one.verdict, ref.verdict)
    assert one.counts()["undecided"] == 0


def test_the_ball_lies_within_its_reach():
    # every vertex of the Ball (the mean of the rows on one side of a whitened axis) has norm
    # <= 1 / sqrt(h) (h: the smaller side), half the reach the filter uses; so does any convex
    # combination of them (what Ball.weights accepts)
    from vocablens.argmax.sparse import Ball

    rng = np.random.default_rng(1)
    W = torch.from_numpy(rng.standard_normal((3000, 12)) * np.linspace(0.5, 3, 12) + 1.0)
    st = _prepared(W)
    assert np.isfinite(st.white.ball_reach)
    ball = Ball(st)
    assert ball.ok
    verts = np.vstack([(ball.mean_pos - st.white.center) @ st.white.whiten, (ball.mean_neg - st.white.center) @ st.white.whiten])
    h = np.minimum(ball.size, st.n - ball.size).min()
    norms = np.linalg.norm(verts, axis=1)
    assert norms.max() <= (1 + 1e-9) / np.sqrt(h) <= st.white.ball_reach / 2 * (1 + 1e-9)
    assert norms.max() > 0.5 / np.sqrt(h)            # the bound is not vacuous
    mix = rng.dirichlet(np.ones(len(verts)), 200) @ verts
    assert np.linalg.norm(mix, axis=1).max() <= st.white.ball_reach


def test_ill_conditioned_whitening_turns_the_ball_filter_off():
    rng = np.random.default_rng(2)
    W = rng.standard_normal((800, 6))
    W[:, 5] = W[:, 4] + 1e-5 * rng.standard_normal(800)     # covariance condition ~1e10
    st = _prepared(torch.from_numpy(W))
    assert st.r == 6 and st.white.ball_reach == float("inf")


def test_planted_rows_are_still_proved_through_the_ball():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((1500, 20))
    pl = [10, 400, 1234]
    for t in pl:
        a, b = rng.choice([i for i in range(1500) if i not in pl], 2, replace=False)
        W[t] = 0.25 * (W[a] + W[b]) + 0.5 * np.delete(W, pl, axis=0).mean(0)
    res = find_unargmaxable(torch.from_numpy(W))
    assert set(pl) <= set(res.ids("unargmaxable").tolist()) and res.counts()["undecided"] == 0
    assert set(pl) <= set(res.combo_mean)            # the sparse path (the Ball) proved them
