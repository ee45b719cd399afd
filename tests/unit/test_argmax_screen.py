"""The half-width screen of stage gemm (vocablens.argmax.screen): the same verdicts as the full
product, sound bounds, and adversarial near-ties at the threshold."""

import numpy as np
import torch

from vocablens.argmax import find_unargmaxable


def _planted(V, d, k, seed):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d))
    W *= np.exp(0.4 * rng.standard_normal((V, 1)))          # heavy-ish norm spread
    pl = rng.choice(V, k, replace=False)
    others = np.setdiff1d(np.arange(V), pl)
    a, b = rng.choice(others, k), rng.choice(others, k)
    W[pl] = 0.25 * (W[a] + W[b]) + 0.5 * W[others].mean(0)
    return torch.from_numpy(W), sorted(pl.tolist())


def _same_verdicts(got, ref):
    """The screen's verdicts equal the full product's; its stage-1 rows are among the full
    product's (which also scores its near pairs exactly, vocablens.argmax.near: the screen does not)
    and every other row is settled by the same later stage."""
    assert torch.equal(got.verdict, ref.verdict)
    s1g, s1r = got.stage == 1, ref.stage == 1
    assert not (s1g & ~s1r).any()
    assert torch.equal(got.stage[~s1r], ref.stage[~s1r])


def test_screen_gives_the_full_products_verdicts_and_bounds():
    W, pl = _planted(1200, 64, 5, 0)
    near = W[10] * (1 + 1e-7)                 # a near-duplicate pair: its exact tail is needed
    W[11] = near
    ref = find_unargmaxable(W, block=256)
    got = find_unargmaxable(W, block=256, screen=True)
    _same_verdicts(got, ref)
    # the planted rows are found (and row 10, now just inside its scaled twin: 0 lies in the hull)
    assert set(pl) | {10} <= set(got.ids("unargmaxable").tolist())
    # stage-1 margins are certified lower bounds: never above the exact (float64) margin
    s1 = (got.stage == 1).nonzero().flatten()
    assert len(s1) >= 900
    for t in s1[:: 97].tolist():
        x = got.certificate_x(W, t).double()
        lg = W.double() @ x
        own = float(lg[t])
        lg[t] = -np.inf
        assert float(got.margin[t]) <= own - float(lg.max()) + 1e-9


def test_screen_near_ties_at_the_threshold():
    # rows built so that for row 0 some competitor's exact int8-grid product sits just below and
    # just above the certification threshold: the screen must agree with the full product
    rng = np.random.default_rng(3)
    d = 64
    W = rng.standard_normal((600, d))
    u = W[0] / np.linalg.norm(W[0])
    for k, f in enumerate((0.999999, 1.0, 1.000001, 0.99, 1.01)):
        W[1 + k] = f * W[0] + 1e-3 * (rng.standard_normal(d) - (rng.standard_normal(d) @ u) * u)
    W = torch.from_numpy(W)
    ref = find_unargmaxable(W, block=128)
    got = find_unargmaxable(W, block=128, screen=True)
    _same_verdicts(got, ref)
