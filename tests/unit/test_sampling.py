"""vocablens.ops.sampling: exact filtered distributions against a float64 full-sort reference, and draws
that a chi-square test does not tell apart from them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops import probs_after_filters, sample


def ref_probs(logits: torch.Tensor, temperature=1.0, top_k=None, top_p=None, min_p=None) -> np.ndarray:
    """Float64 reference written independently, one row at a time, with a full sort (numpy)."""
    x = logits.double().numpy()
    out = np.zeros_like(x)
    for r, row in enumerate(x):
        s = row / temperature if temperature not in (0, 1) else row.copy()
        order = np.argsort(-s, kind="stable")
        v = s[order]
        keep = np.isfinite(v)
        if top_k is not None and top_k < len(v):
            keep &= v >= v[top_k - 1]  # ties at the k-th kept
        if top_p is not None and top_p < 1:
            t = np.where(keep, v, -np.inf)
            q = np.exp(t - t.max())
            q /= q.sum()
            cum = np.cumsum(q)
            m = min(int((cum < top_p - 1e-5).sum()), len(v) - 1)  # first rank reaching p (within TOP_P_SLACK)
            keep &= v >= v[m]
        if min_p:
            keep &= np.exp(v - v[0]) >= min_p
        w = np.where(keep, np.exp(v - v[0]), 0.0)
        out[r, order] = w / w.sum()
    return out


FILTERS = [
    dict(temperature=0.7),
    dict(top_k=20),
    dict(top_p=0.9),
    dict(min_p=0.05),
    dict(temperature=1.3, top_k=300, top_p=0.8, min_p=0.02),
]


def _logits(V: int, B: int = 3, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("V", [50, 49152])
@pytest.mark.parametrize("kw", FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("method", ["auto", "dense"])
def test_probs_equal_full_sort_reference(V, kw, method):
    for scale in (1.0, 4.0):
        x = _logits(V, scale=scale)
        x[1, :5] = float("-inf")  # masked columns
        got = probs_after_filters(x, method=method, **kw).numpy()
        want = ref_probs(x, **kw)
        assert np.array_equal(got > 0, want > 0), "kept sets differ"
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-12)


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    exp = probs * n
    assert counts[probs == 0].sum() == 0, "a filtered-out token was drawn"
    big = exp >= 5
    obs = np.append(counts[big], counts[~big & (probs > 0)].sum())
    ex = np.append(exp[big], exp[~big & (probs > 0)].sum())
    if ex[-1] < 5:  # fold a too-small remainder into the largest bin
        obs, ex = obs[:-1].copy(), ex[:-1].copy()
        obs[np.argmax(ex)] += counts[~big & (probs > 0)].sum()
        ex[np.argmax(ex)] += exp[~big & (probs > 0)].sum()
    if len(ex) < 2:
        return 1.0
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


@pytest.mark.parametrize("V", [50, 49152])
@pytest.mark.parametrize("kw", FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_chi_square_200k_draws(V, kw):
    x = _logits(V, B=1, scale=2.0, seed=3).float()
    g = torch.Generator().manual_seed(1234)
    draws = sample(x, generator=g, num_samples=200_000, **kw)[0].numpy()
    counts = np.bincount(draws, minlength=V)
    probs = ref_probs(x, **kw)[0]
    assert _chi2_p(counts, probs) > 1e-3


def test_top_p_fallback_past_the_window_is_exact():
    # a flat row: the nucleus holds thousands of tokens, far beyond a 64-token window
    x = _logits(4096, B=4, scale=1.0) * torch.tensor([[0.5], [8.0], [0.3], [10.0]], dtype=torch.float64)
    got = probs_after_filters(x, top_p=0.95, window=64).numpy()
    np.testing.assert_allclose(got, ref_probs(x, top_p=0.95), atol=1e-12, rtol=0)
    assert np.array_equal(got > 0, ref_probs(x, top_p=0.95) > 0)
    n = (got > 0).sum(1)
    assert n[0] > 64 and n[2] > 64 and n[1] < 64 and n[3] < 64  # rows on both paths in one batch


def test_ties_at_the_window_edge_and_at_the_kth():
    x = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0]], dtype=torch.float64)
    # top-k=3 keeps every token tied with the 3rd largest
    assert (probs_after_filters(x, top_k=3)[0] > 0).tolist() == [True] * 5 + [False, False]
    # a window that ends inside a tie must not cut it: equal to the reference
    for p in (0.8, 0.95, 0.99):
        got = probs_after_filters(x, top_p=p, window=3).numpy()
        np.testing.assert_allclose(got, ref_probs(x, top_p=p), atol=1e-15, rtol=0)
    # a tied maximum: top_k=1 keeps both maxima (not greedy), temperature 0 takes the lowest id
    y = torch.tensor([[1.0, 7.0, 7.0, 2.0]])
    assert probs_after_filters(y, top_k=1)[0].tolist() == [0.0, 0.5, 0.5, 0.0]
    assert int(sample(y, temperature=0)[0]) == 1


def test_min_p_extremes_and_top_p_one():
    x = _logits(200)
    np.testing.assert_allclose(probs_after_filters(x, min_p=0.0).numpy(), torch.softmax(x, 1).numpy(), atol=1e-15)
    np.testing.assert_allclose(probs_after_filters(x, top_p=1.0).numpy(), torch.softmax(x, 1).numpy(), atol=1e-15)
    one = probs_after_filters(x, min_p=1.0)
    assert torch.equal(one, torch.nn.functional.one_hot(x.argmax(1), 200).double())
    tiny = probs_after_filters(x, top_p=1e-9)  # always keeps at least the top token
    assert torch.equal(tiny, one)


def test_greedy_draws_no_random_numbers():
    x = _logits(1000).float()
    g = torch.Generator().manual_seed(7)
    state = g.get_state()
    assert torch.equal(sample(x, temperature=0, top_p=0.5, generator=g), x.argmax(1))
    assert torch.equal(g.get_state(), state)
    assert torch.equal(probs_after_filters(x, temperature=0), torch.nn.functional.one_hot(x.argmax(1), 1000).float())


def test_seeded_draws_reproduce():
    x = _logits(49152, B=4).float()
    a = sample(x, top_p=0.9, generator=torch.Generator().manual_seed(5), num_samples=50)
    b = sample(x, top_p=0.9, generator=torch.Generator().manual_seed(5), num_samples=50)
    assert torch.equal(a, b) and a.shape == (4, 50)


def test_mask_and_padding_columns_never_drawn():
    x = torch.zeros(2, 10)
    x[:, 8:] = 100.0  # padding rows that would win
    mask = torch.zeros(10, dtype=torch.bool)
    mask[:8] = True
    draws = sample(x, mask=mask, num_samples=5000, generator=torch.Generator().manual_seed(0))
    assert int(draws.max()) < 8
    p = probs_after_filters(x, mask=mask)
    assert torch.allclose(p[:, :8], torch.full((2, 8), 1 / 8)) and float(p[:, 8:].abs().max()) == 0.0
    assert int(sample(x, temperature=0, mask=mask)[0]) == 0


def test_bfloat16_is_its_float32_value():
    x = _logits(5000).to(torch.bfloat16)
    got = probs_after_filters(x, top_k=50, top_p=0.7)
    want = ref_probs(x.float(), top_k=50, top_p=0.7)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.double().numpy(), want, atol=2e-6, rtol=0)
    assert np.array_equal(got.numpy() > 0, want > 0)


def test_one_dimensional_input():
    x = _logits(30)[0]
    assert probs_after_filters(x, top_k=3).shape == (30,)
    assert sample(x, top_k=3, generator=torch.Generator().manual_seed(0)).shape == ()


@pytest.mark.parametrize("kw,name", [
    (dict(top_k=True), "top_k"), (dict(top_k=0), "top_k"), (dict(top_k=2.0), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(temperature=-0.1), "temperature"), (dict(temperature=True), "temperature"),
    (dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"),
])
def test_bad_arguments_name_the_argument(kw, name):
    with pytest.raises(BadInput, match=name):
        sample(torch.zeros(1, 5), **kw)
    with pytest.raises(BadInput, match=name):
        probs_after_filters(torch.zeros(1, 5), **kw)


def test_bad_logits():
    with pytest.raises(BadInput, match="masked entirely"):
        sample(torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]]))
    with pytest.raises(BadInput, match="NaN"):
        sample(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(BadInput, match="masked entirely"):
        sample(torch.zeros(1, 3), mask=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ShapeMismatch):
        sample(torch.zeros(2, 3, 4))
    with pytest.raises(ShapeMismatch):
        sample(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(BadInput, match="num_samples"):
        sample(torch.zeros(1, 3), num_samples=0)


# ------------------------------------------------------------------ limits (issue 24)
METHODS = ["auto", "dense", "sort"]
LIMIT_FILTERS = [dict(), dict(top_p=0.9), dict(top_k=50), dict(min_p=0.1), dict(top_k=50, top_p=0.9)]


@pytest.mark.parametrize("T", [1e-38, 1e-40, 1e-45, 5e-324])
@pytest.mark.parametrize("kw", LIMIT_FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "plain")
def test_tiny_temperatures_are_greedy(T, kw):
    # 1e-40 overflowed the float32 division (RuntimeError inf/nan), 1e-45 gave an IndexError with top-p
    V = 50_000 if T == 1e-45 else 4096  # both beyond the top-p window
    x = _logits(V, B=2, scale=3.0, seed=11).float()
    g = torch.Generator().manual_seed(0)
    for method in METHODS:
        p = probs_after_filters(x, temperature=T, method=method, **kw)
        assert torch.equal(p, torch.nn.functional.one_hot(x.argmax(1), V).float()), method
        assert torch.equal(sample(x, temperature=T, method=method, generator=g, **kw), x.argmax(1))


def test_small_temperature_tends_to_greedy_continuously():
    # a row with gaps 1 and 2 below the max: softmax(s / T) in float64, by hand
    x = torch.tensor([[3.0, 2.0, 1.0]])
    for T in (1.0, 0.3, 0.1, 0.02):
        w = np.exp(-np.array([0.0, 1.0, 2.0]) / T)
        np.testing.assert_allclose(probs_after_filters(x, temperature=T)[0].double().numpy(), w / w.sum(),
                                   rtol=1e-6, atol=1e-30)
    # an exact tie at the maximum: the limit is uniform over the tie
    assert probs_after_filters(torch.tensor([[1.0, 1.0, 0.0]]), temperature=1e-40)[0].tolist() == [0.5, 0.5, 0.0]


def test_huge_temperature_is_uniform():
    x = _logits(100, B=1).float()
    np.testing.assert_allclose(probs_after_filters(x, temperature=1e300)[0].numpy(), np.full(100, 0.01), rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_top_p_exact_boundary_is_the_same_in_both_dtypes(method):
    # .5 + .3 = .8 reaches top_p = .8: two tokens (float32 used to keep all four)
    probs = torch.tensor([[0.3, 0.1, 0.1, 0.5]], dtype=torch.float64)
    for dt in (torch.float32, torch.float64):
        kept = probs_after_filters(probs.log().to(dt), top_p=0.8, method=method)[0] > 0
        assert kept.tolist() == [True, False, False, True], (dt, method)


def test_top_p_random_boundaries_agree_across_dtypes_and_methods():
    # top_p set to an exact cumulative mass of the float64 probabilities: the kept set is the
    # prefix reaching it (within TOP_P_SLACK: fewer tokens when the rest of the prefix weighs < 1e-5)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        V = int(torch.randint(2, 60, (1,), generator=g))
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 2 + 1e-3
        q /= q.sum()
        v = q.sort(descending=True).values
        m = int(torch.randint(0, V - 1, (1,), generator=g))
        p = float(v[: m + 1].sum())
        logits = (q.log() + float(torch.randn(1, generator=g)) * 20)[None]
        counts = {(dt, meth): int((probs_after_filters(logits.to(dt), top_p=p, method=meth) > 0).sum())
                  for dt in (torch.float32, torch.float64) for meth in METHODS}
        assert set(counts.values()) == {m + 1}, (V, m, p, counts)
