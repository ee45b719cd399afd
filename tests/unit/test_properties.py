"""Property-based tests (hypothesis) of the ops over V (issue 24): log-probabilities, KL readouts and the
sampling filters depend only on logit differences (offsets up to 1e8), not on the chunk or window size
nor the method, agree with a float64 reference computed on the same input values, sum to 1 where they
should, and never give NaN for finite input. (Cross-entropy's own float64 and offset properties are
tests/unit/test_ops_exact.py::test_cross_entropy_and_logprobs_match_float64_reference.)"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_sampling import ref_probs
from vocablens.ops import logits_readout, probs_after_filters, token_logprobs
from vocablens.ops.sampling import TOP_P_SLACK

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OFFSETS = st.sampled_from([0.0, -57.0, 1e3, 1e6, 1e8])
SPREADS = st.sampled_from([1e-3, 0.3, 3.0, 30.0])


def _logits(B, V, spread, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, V, generator=g, dtype=torch.float64) * spread).to(dtype)


# ------------------------------------------------------------------ sampling filters
filters = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.05, 0.7, 1.0, 3.0]), "top_k": st.integers(1, 400),
    "top_p": st.floats(0.01, 1.0), "min_p": st.floats(0.0, 0.5)})


@FAST
@given(B=st.integers(1, 3), V=st.sampled_from([2, 7, 300, 3000]), spread=SPREADS, offset=OFFSETS, kw=filters,
       window=st.sampled_from([1, 16, 1024]), seed=st.integers(0, 2**31))
def test_filters_depend_only_on_differences_and_not_on_window_or_method(B, V, spread, offset, kw, window, seed):
    x = _logits(B, V, spread, seed)
    base = probs_after_filters(x, window=window, **kw)
    assert torch.isfinite(base).all() and (base >= 0).all()
    np.testing.assert_allclose(base.sum(1).numpy(), 1.0, atol=1e-12)
    # float64 rounds x + offset by up to offset * 1.1e-16: probabilities move by about that, relative
    tol = 1e-9 + 4e-16 * offset * 8 / kw.get("temperature", 1.0)
    for other in (probs_after_filters(x + offset, window=window, **kw), probs_after_filters(x, method="dense", **kw),
                  probs_after_filters(x, method="sort", **kw)):
        assert torch.equal(other > 0, base > 0)
        assert float((other - base).abs().max()) <= tol


@FAST
@given(B=st.integers(1, 3), V=st.sampled_from([2, 7, 300, 3000]), spread=SPREADS, kw=filters,
       seed=st.integers(0, 2**31))
def test_filters_agree_with_float64_reference_and_across_dtypes(B, V, spread, kw, seed):
    x32 = _logits(B, V, spread, seed, torch.float32)
    got32 = probs_after_filters(x32, **kw)
    got64 = probs_after_filters(x32.double(), **kw)  # the same values in float64
    want = ref_probs(x32.double(), **kw)
    assert got32.dtype == torch.float32 and torch.isfinite(got32).all()
    assert np.array_equal(got64.numpy() > 0, want > 0)
    np.testing.assert_allclose(got64.numpy(), want, atol=1e-12, rtol=0)
    if "min_p" not in kw:  # min-p compares a float32 exp with min_p: its own boundary may round either way
        # the same kept set (a kept probability below float32's range underflows to 0: not a cut)
        assert not (got32 > 0)[got64 == 0].any() and (got32 > 0)[got64 > 1e-30].all()
    np.testing.assert_allclose(got32.double().numpy(), want, atol=2e-6, rtol=0)


@FAST
@given(V=st.integers(2, 200), seed=st.integers(0, 2**31), p=st.floats(0.01, 0.999))
def test_top_p_keeps_the_smallest_prefix_reaching_p(V, seed, p):
    x = _logits(1, V, 2.0, seed)
    kept = probs_after_filters(x, top_p=p)[0] > 0
    q = torch.softmax(x[0], 0)
    order = torch.argsort(x[0], descending=True)
    n = int(kept.sum())
    assert kept[order[:n]].all()  # a prefix of the descending order
    mass = float(q[order[:n]].sum())
    assert mass >= p - TOP_P_SLACK - 1e-12  # it reaches p
    assert n == 1 or float(q[order[: n - 1]].sum()) < p - TOP_P_SLACK + 1e-12  # one fewer does not


# ------------------------------------------------------------------ log-probabilities and KL readouts
def _selector(V, d):
    """W [V, d] whose logits are exactly columns of the hidden state (one 1 per row): logits are exact."""
    W = torch.zeros(V, d)
    W[torch.arange(V), torch.arange(V) % d] = 1.0
    return W


@FAST
@given(N=st.integers(1, 5), V=st.sampled_from([2, 17, 300, 4099]), spread=SPREADS, offset=OFFSETS,
       tokens=st.sampled_from([None, 1, 3]), vocab=st.sampled_from([None, 5, 1000]), seed=st.integers(0, 2**31))
def test_token_logprobs_sum_to_one_and_ignore_chunks_and_offsets(N, V, spread, offset, tokens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(N, V, generator=g, dtype=torch.float64) * spread + offset).float()
    W = _selector(V, V)  # logits == h exactly (float32 values, offset included)
    t = torch.randint(0, V, (N,), generator=g)
    r = token_logprobs(h, W, t, top_k=V, entropy=True, chunk_tokens=tokens, chunk_vocab=vocab)
    one = token_logprobs(h, W, t, top_k=V, entropy=True)
    lp64 = torch.log_softmax(h.double(), -1)  # float64 on the same float32 values
    for x in (r.logprob, r.topk_logprobs, r.entropy, r.lse):
        assert torch.isfinite(x).all()
    tol = 2e-6 * (lp64.abs() + math.log(V) + 1)
    assert torch.all((r.logprob.double() - lp64.gather(1, t[:, None])[:, 0]).abs() <= tol.gather(1, t[:, None])[:, 0])
    np.testing.assert_allclose(r.topk_logprobs.double().exp().sum(1).numpy(), 1.0, atol=1e-5)
    ent = -(lp64.exp() * lp64).sum(-1)
    assert torch.all((r.entropy.double() - ent).abs() <= 1e-5 * (ent + 1)) and (r.entropy >= -1e-6).all()
    assert float(r.entropy.max()) <= math.log(V) + 1e-5
    # chunk sizes change the order of float32 sums only
    assert torch.allclose(r.logprob, one.logprob, rtol=0, atol=4e-6 * (math.log(V) + 1))
    assert torch.equal(r.topk_ids, one.topk_ids) or torch.allclose(r.topk_logprobs, one.topk_logprobs, atol=1e-6)


@FAST
@given(N=st.integers(1, 6), V=st.sampled_from([2, 17, 300, 4099]), spread=SPREADS, offset=OFFSETS,
       ref_offset=OFFSETS, chunk=st.sampled_from([None, 4096, 70_000]), seed=st.integers(0, 2**31))
def test_kl_readout_against_float64_whatever_the_offsets_and_chunks(N, V, spread, offset, ref_offset, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(N, V, generator=g, dtype=torch.float64) * spread + offset).float()
    ref = (torch.randn(N, V, generator=g, dtype=torch.float64) * spread + ref_offset).float()
    r = logits_readout(z, ref, entropy=True, max_abs_dp=True, chunk_bytes=chunk)
    lq, lp = torch.log_softmax(z.double(), -1), torch.log_softmax(ref.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    for x in (r.kl, r.lse, r.entropy, r.max_abs_dp):
        assert torch.isfinite(x).all()
    assert (r.kl >= 0).all()
    # float32 rounding of log-probabilities of size |lq| (not of the offsets, which cancel exactly)
    tol = 4e-6 * ((lp.exp() * (lq.abs() + lp.abs())).sum(-1) + 1)
    assert torch.all((r.kl.double() - kl).abs() <= tol), (r.kl, kl)
    self_kl = logits_readout(z, z, chunk_bytes=chunk).kl
    assert float(self_kl.abs().max()) <= 4e-6 * (math.log(V) + 1)
    assert torch.all((r.max_abs_dp.double() - (lq.exp() - lp.exp()).abs().amax(-1)).abs() <= 1e-5)
