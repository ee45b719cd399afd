"""The reflect stage's int8 scoring (vocablens.argmax.scoring): a direction is certified only when
float64 arithmetic on the exact whitened rows agrees, near-ties (near-duplicate rows) are decided by
exact scores, and the top rows and best competitor are those of the exact integer products."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_argmax_fast_paths import _prepared        # the prepared scan state (masks, dedupe, whitening)
from vocablens.argmax.scoring import NEAR_MAX, int8_pass, int8_ready
from vocablens.argmax.scan import Scan


def _head(V=3000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d)) * np.exp(0.4 * rng.standard_normal((V, 1)))
    # near-duplicate pairs: a row and the same row times 1 + 1e-5 noise (the int8 grid cannot tell them)
    W[1:41] = W[41:81] * (1 + 1e-5 * rng.standard_normal((40, d)))
    return torch.from_numpy(W.astype(np.float32))


def _exact_scores(st: Scan, Y: np.ndarray) -> np.ndarray:
    """float64 scores of every direction against the exact whitened rows (computed from W)."""
    Z = st.z64(np.arange(st.n))
    return Y.astype(np.float64) @ Z.T                                # [m, n]


@pytest.mark.parametrize("seed", [0, 1])
def test_certified_directions_are_certified_in_float64_and_easy_ones_are_found(seed):
    st = _prepared(_head(seed=seed))
    assert int8_ready(st)
    rng = np.random.default_rng(seed + 10)
    cols = rng.choice(st.n, 96, replace=False)
    cols[:40] = np.arange(1, 41)                                     # the near-duplicate rows
    Zn = st.Z.numpy()
    Y = (Zn[cols] + 0.05 * rng.standard_normal((len(cols), st.r)) *
         np.linalg.norm(Zn[cols], axis=1, keepdims=True) / np.sqrt(st.r)).astype(np.float32)
    Y[:40] = Zn[cols[:40]]                                           # at y = z_t: a twin ties within 1e-5
    done, gap, jstar, top, lead, _ = int8_pass(st, cols, Y, k_top=16)
    E = _exact_scores(st, Y)
    own = E[np.arange(len(cols)), cols].copy()
    E[np.arange(len(cols)), cols] = -np.inf
    true_gap = own - E.max(1)
    # sound: every certified direction really wins, by at least the reported gap (up to float64 noise)
    assert (true_gap[done] > 0).all()
    assert (gap[done] <= true_gap[done] * (1 + 1e-9) + 1e-12).all()
    # complete where the margin is not a near-tie: margins above 1e-3 of the own score are all found
    easy = true_gap > 1e-3 * np.abs(own)
    assert done[easy].all()
    # twins: decided exactly (a certified twin beats its pair in float64; the pair is jstar otherwise)
    assert done[:40].any() and (~done[:40]).any()
    for q in np.nonzero(~done[:40])[0]:
        assert E[q, jstar[q]] == E[q].max()                          # the exact best competitor
    # the top rows are those of the exact integer products q_j . q_y (the row itself left out)
    for q in range(0, len(cols), 17):
        sy = np.abs(Y[q].astype(np.float64)).max() / 127.0
        qy = np.rint(Y[q].astype(np.float64) / sy).astype(np.int64)
        P = st.Q.numpy().astype(np.int64) @ qy
        P[cols[q]] = np.iinfo(np.int64).min
        assert sorted(P[top[q]].tolist(), reverse=True) == sorted(P, reverse=True)[:16]


def test_many_near_rows_are_never_certified_by_the_int8_bound_alone():
    """A direction that many rows nearly tie (more than NEAR_MAX within the bound) stays open."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal(32)
    W = np.tile(base, (400, 1)) + 1e-6 * rng.standard_normal((400, 32))
    W = np.vstack([W, rng.standard_normal((2000, 32))]).astype(np.float32)
    st = _prepared(torch.from_numpy(W))
    assert int8_ready(st)                                  # r = 32: a multiple of 8, Q resident
    cols = np.arange(64)
    Y = st.Z.numpy()[cols].copy()
    done, gap, jstar, top, lead, _ = int8_pass(st, cols, Y)
    E = _exact_scores(st, Y)
    own = E[np.arange(64), cols].copy()
    E[np.arange(64), cols] = -np.inf
    assert (own[done] > E[done].max(1)).all()
    assert NEAR_MAX < 400

