"""Stage 1's exactly scored near pairs (vocablens.argmax.near), the int8 tilt weights and the
borderline re-check: sound at adversarial near-ties, the same verdicts as the plain paths, and
every certificate a float64 computation confirms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_argmax_fast_paths import _prepared        # the prepared scan state (masks, dedupe, whitening)
from vocablens.argmax import find_unargmaxable
from dataclasses import replace

from vocablens.argmax import near as near_mod
from vocablens.argmax import tilt as tilt_mod
from vocablens.argmax import verify as verify_mod
from vocablens.argmax.near import Bounds, far_up


def _ties(seed=0, V=1500, d=48):
    """Rows with heavy-ish norms and near-duplicate twins at relative distances 1e-7 .. 1e-2:
    the int8 bound cannot separate a twin from its row, the exact scores can (or show it loses)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d)) * np.exp(0.3 * rng.standard_normal((V, 1)))
    for k, eps in enumerate(np.repeat([1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2], 10)):
        W[1 + k] = W[100 + k] * (1 + eps * rng.standard_normal(d))
    return torch.from_numpy(W)


def _exact_margin(W64: np.ndarray, x: np.ndarray, t: int) -> float:
    lg = W64 @ x
    own = float(lg[t])
    lg[t] = -np.inf
    return own - float(lg.max())


@pytest.mark.parametrize("seed", [0, 1])
def test_near_pairs_settle_more_rows_in_stage1_with_certificates_float64_confirms(seed, monkeypatch):
    W = _ties(seed)
    got = find_unargmaxable(W, verify="all")
    monkeypatch.setattr(near_mod, "NEAR_CAP", 0)        # every row with a near pair left open: the old stage 1
    ref = find_unargmaxable(W, verify="all")
    assert torch.equal(got.verdict, ref.verdict)
    s1, s1_ref = got.stage == 1, ref.stage == 1
    assert not (s1_ref & ~s1).any() and int(s1.sum()) > int(s1_ref.sum())   # more, never fewer
    # the float64 re-check of every certificate left every verdict standing (the twins 1e-7 and
    # 1e-6 apart stay undecided in both runs: no proof separates them within the tolerance)
    assert got.verified_f64 == int(((got.stage >= 1) & ~torch.isnan(got.margin)).sum())
    assert not any("re-check" in why for why in got.reasons.values())
    # every stage-1 margin is a lower bound on the exact float64 margin at its certificate; the rows
    # settled only thanks to the near pairs included (twins 1e-7 .. 1e-2 apart)
    W64 = W.double().numpy()
    new = (s1 & ~s1_ref).nonzero().flatten().tolist()
    assert new
    for t in new + s1.nonzero().flatten().tolist()[::53]:
        m = _exact_margin(W64, got.certificate_x(W, t).double().numpy(), t)
        assert 0 < float(got.margin[t]) <= m * (1 + 1e-9) + 1e-12


def test_thresholds_are_sound_and_tight():
    st = _prepared(_ties(2))
    b = Bounds(st)
    T = b.thresholds(st)
    ok = b.dg > 0
    # a product T - 1 is provably below the row's own score, T + 1 is not (T within one integer of tight)
    assert (far_up(st, T - 1, b.slack_q)[ok] < b.own_q[ok]).all()
    assert (far_up(st, T + 1, b.slack_q)[ok] >= b.own_q[ok]).all()
    # the own score's lower bound is below the exact float64 value at y = qs q_t
    Z = st.z64(np.arange(st.n))
    y = st.Q.double().numpy() * st.white.grid_step
    assert (b.own_q <= np.einsum("ij,ij->i", Z, y) + 1e-12).all()
    # a competitor's bound from its exact product is above its exact score (every pair of a sample)
    rows = np.arange(0, st.n, 37)
    S = st.Q[rows].long() @ st.Q.long().T                      # exact integer products [k, n]
    exact = y[rows] @ Z.T                                        # [k, n]
    up = far_up(st, S.numpy(), b.slack_q[rows][:, None])
    assert (up >= exact).all()


def test_int8_tilt_violators_contain_every_negative_weight():
    st = _prepared(_ties(3, V=2000, d=32))
    S = tilt_mod._Sums(st)
    rng = np.random.default_rng(0)
    U = rng.standard_normal((40, st.r)) * 2e-4
    a = np.full(40, 1.0 / st.n)
    a[:5] = 0.0                                                  # about half the weights negative
    exact = a[:, None] + U @ st.Q.double().numpy().T           # [m, n] float64 (exact enough)
    for use8 in (True, False):
        viol = tilt_mod._violators(st if use8 else replace(st, products=None), S, U, a)
        for q in range(40):
            neg = np.nonzero(exact[q] <= 0)[0]
            if len(neg) <= tilt_mod.TILT_MAX_EXCLUDED:
                assert set(neg.tolist()) <= set(viol[q].tolist())
                # and nothing far from zero is called a violator
                assert (exact[q][viol[q]] <= 1e-3 * np.abs(exact[q]).max()).all()
            else:                                                # enough to rule the tilt out
                assert len(viol[q]) > tilt_mod.TILT_MAX_EXCLUDED


def test_int8_violator_prefilter_keeps_every_row_the_full_exact_test_flags():
    # the int32 threshold only skips products that cannot fail the exact float64 test: the rows
    # flagged equal the full test's on every product, including weights planted exactly at zero
    from vocablens.argmax.blocks import U64

    st = _prepared(_ties(5, V=1800, d=40))
    S = tilt_mod._Sums(st)
    rng = np.random.default_rng(1)
    m = 24
    U = rng.standard_normal((m, st.r)) * 3e-4
    su = np.abs(U).max(1) / 127.0
    Pu = np.rint(U / su[:, None])
    eu = np.linalg.norm(U - su[:, None] * Pu, axis=1) * 1.01
    I = Pu @ st.Q.double().numpy().T                                 # exact integer products [m, n]
    a = np.full(m, 1.0 / st.n)
    for q in range(m // 2):                                           # a weight exactly 0 and ties near it
        a[q] = -su[q] * I[q, rng.integers(st.n)]
    from vocablens.argmax.scoring import int8_ready
    assert int8_ready(st)                                             # the path under test runs here
    viol = tilt_mod._violators(st, S, U, a)
    val = I * su[:, None] + a[:, None]
    bound = S.qn[None, :] * eu[:, None] + 4 * U64 * (np.abs(val) + np.abs(a)[:, None])
    for q in range(m):
        full = np.nonzero(val[q] <= bound[q])[0]
        if len(full) <= tilt_mod.TILT_MAX_EXCLUDED:
            assert viol[q].tolist() == full.tolist()
        else:
            assert len(viol[q]) > tilt_mod.TILT_MAX_EXCLUDED
    assert any(len(v) for v in viol[:m // 2])


def test_tilt_columns_cached_equal_the_direct_product_also_when_the_cache_starts_over(monkeypatch):
    st = _prepared(_ties(6, V=900, d=24))
    S = tilt_mod._Sums(st)
    rng = np.random.default_rng(2)

    def direct(rows):
        return S.Binv @ np.vstack([np.ones(len(rows)), st.Z[rows].double().numpy().T])

    monkeypatch.setattr(tilt_mod, "TILT_CACHE_BYTES", 8 * (st.r + 1) * 50)   # room for 50 columns
    for _ in range(6):
        rows = rng.integers(0, st.n, size=int(rng.integers(1, 40)))          # repeats included
        got = S.binv_u(st, rows)
        want = direct(rows)
        # equal to the direct product up to float64 rounding (a GEMM's rounding depends on its
        # width and on the CPU's kernel, so bit equality across products of other widths is not
        # a property: it failed on an AVX2-only CPU); a wrong or stale column is off by O(1)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        for j in np.unique(rows):                                          # repeats: one column
            cols = got[:, rows == j]
            assert (cols == cols[:, :1]).all()
    assert S._used <= 50


def test_proof_sets_keep_their_whitened_rows_between_rounds():
    from vocablens.argmax import proofs

    st = _prepared(_ties(7, V=700, d=20))
    row = proofs._Row(3, np.arange(10, 30))
    room = [1 << 20]
    assert np.allclose(row.z_set(st, room), st.z64(row.S), rtol=1e-13, atol=1e-13)
    kept = row.Z
    row.S = np.concatenate([row.S, np.arange(100, 140)])
    Z = row.z_set(st, room)
    assert np.array_equal(Z[:20], kept) and np.allclose(Z, st.z64(row.S), rtol=1e-13, atol=1e-13)
    assert room[0] == (1 << 20) - Z.nbytes
    tight = [0]                                  # no room: the rows are computed, not kept
    row2 = proofs._Row(4, np.arange(50, 60))
    assert np.allclose(row2.z_set(st, tight), st.z64(row2.S), rtol=1e-13, atol=1e-13) and row2.Z is None


def test_borderline_rechecks_the_smallest_bound_ratios_and_verdicts_equal_all(monkeypatch):
    W = _ties(4, V=3000, d=64)
    full = find_unargmaxable(W, verify="all")
    monkeypatch.setattr(verify_mod, "BORDERLINE", 5)
    part = find_unargmaxable(W)
    assert torch.equal(part.verdict, full.verdict) and torch.equal(part.stage, full.stage)
    cand = int(((full.stage >= 1) & ~torch.isnan(full.margin)).sum())
    assert full.verified_f64 == cand
    assert 5 <= part.verified_f64 < cand              # the rigorous ones beyond the 5 smallest were not re-run
