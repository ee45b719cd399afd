"""Chunked log-probabilities and the fused cross-entropy against a float64 naive reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops import linear_cross_entropy, token_logprobs
from vocablens.ops.chunking import chunk_sizes, train_chunk_sizes


def ref_loss(h, W, t, b=None, *, reduction="mean", ls=0.0, zl=0.0, cap=None, scale=1.0, ignore_index=-100):
    """Float64 naive reference: full logits, then the per-token formula."""
    z = F.linear(h.double(), W.double(), None if b is None else b.double()) * scale
    if cap:
        z = cap * torch.tanh(z / cap)
    V = z.shape[-1]
    lse = torch.logsumexp(z, -1)
    valid = t != ignore_index
    ts = torch.where(valid, t, torch.zeros_like(t))
    loss = lse - (1 - ls) * z.gather(-1, ts[..., None]).squeeze(-1) + zl * lse ** 2
    if ls:
        loss = loss - (ls / V) * z.sum(-1)
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    n = valid.sum()
    return loss.sum() / n if int(n) else loss.sum() * 0.0


def _inputs(N, d, V, dtype, seed, bias=False, ignore_frac=0.2):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g).to(dtype)
    W = (torch.randn(V, d, generator=g) * 0.3).to(dtype)
    b = (torch.randn(V, generator=g) * 0.5).to(dtype) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    t[torch.rand(N, generator=g) < ignore_frac] = -100
    return h, W, b, t


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(N=st.integers(1, 40), d=st.integers(1, 24), V=st.integers(2, 300), dtype=st.sampled_from(["float32", "bfloat16"]),
       reduction=st.sampled_from(["mean", "sum", "none"]), bias=st.booleans(), ls=st.sampled_from([0.0, 0.1]),
       zl=st.sampled_from([0.0, 1e-3]), cap=st.sampled_from([None, 4.0]), chunk=st.integers(1, 17),
       ignore=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 10**6), vtile=st.sampled_from([None, 7, 64]))
def test_cross_entropy_matches_float64_reference(N, d, V, dtype, reduction, bias, ls, zl, cap, chunk, ignore, seed,
                                                 vtile):
    # vtile=None: one-pass fused path (full rows); otherwise the two-pass vocabulary-tiled path
    dt = getattr(torch, dtype)
    h, W, b, t = _inputs(N, d, V, dt, seed, bias, ignore)
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    bb = b.clone().requires_grad_() if b is not None else None
    out = linear_cross_entropy(hh, WW, t, bb, reduction=reduction, label_smoothing=ls, z_loss=zl, softcap=cap,
                               chunk_tokens=chunk, chunk_vocab=vtile)
    assert out.dtype == torch.float32
    g = torch.randn(N, generator=torch.Generator().manual_seed(seed + 1)) if reduction == "none" else torch.tensor(0.7)
    (out * g).sum().backward()
    h2, W2 = h.double().requires_grad_(), W.double().requires_grad_()
    b2 = b.double().requires_grad_() if b is not None else None
    ref = ref_loss(h2, W2, t, b2, reduction=reduction, ls=ls, zl=zl, cap=cap)
    (ref * g.double()).sum().backward()
    assert torch.isfinite(out).all()
    # fp32: float32 rounding; bf16: logits rounded to bf16 by the GEMM (inputs are exact in both)
    rtol = 1e-5 if dtype == "float32" else 2e-2
    scale = max(1.0, float(ref.detach().abs().max()))
    assert float((out.detach().double() - ref.detach()).abs().max()) <= rtol * scale * (1 + d / 8)
    for got, want in [(hh.grad, h2.grad), (WW.grad, W2.grad)] + ([(bb.grad, b2.grad)] if b is not None else []):
        assert got.dtype == dt
        gs = max(1.0, float(want.abs().max()))
        assert float((got.double() - want).abs().max()) <= (2e-5 if dtype == "float32" else 5e-2) * gs
    if ignore == 1.0:
        assert float(out.detach().abs().sum()) == 0.0 and float(hh.grad.abs().sum()) == 0.0


def test_liger_968_reduction_none_per_token_upstream_grads():
    # Liger-Kernel#968: BT=8, H=10, V=15, two ignored, upstream g = [1,0,3,.5,-2,7,1,1]
    h, W, _, t = _inputs(8, 10, 15, torch.float32, 3, ignore_frac=0.0)
    t[1] = t[5] = -100
    g = torch.tensor([1, 0, 3, 0.5, -2, 7, 1, 1])
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    (linear_cross_entropy(hh, WW, t, reduction="none", chunk_tokens=3) * g).sum().backward()
    h2, W2 = h.clone().requires_grad_(), W.clone().requires_grad_()
    (F.cross_entropy(h2 @ W2.T, t, reduction="none") * g).sum().backward()
    torch.testing.assert_close(hh.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(WW.grad, W2.grad, rtol=1e-5, atol=1e-6)


def test_all_ignored_batch_is_zero_not_nan():
    # Liger#177 (ZeroDivisionError), torchtune#2341 (NaN): vocablens returns 0 and zero gradients
    h, W, _, _ = _inputs(4, 6, 11, torch.float32, 0)
    t = torch.full((4,), -100)
    for red in ("mean", "sum"):
        hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
        out = linear_cross_entropy(hh, WW, t, reduction=red)
        out.backward()
        assert float(out.detach()) == 0.0 and not torch.isnan(out.detach())
        assert float(hh.grad.abs().sum()) == 0.0 and float(WW.grad.abs().sum()) == 0.0


def test_no_grad_and_inputs_without_grad():
    h, W, b, t = _inputs(9, 5, 13, torch.float32, 1, bias=True)
    ref = float(ref_loss(h, W, t, b))
    with torch.no_grad():  # Liger#930: UnboundLocalError under no_grad
        assert math.isclose(float(linear_cross_entropy(h, W.requires_grad_(), t, b)), ref, rel_tol=1e-5)
    W.requires_grad_(False)
    # Liger#1156: hidden needs no grad, weight and bias do
    WW, bb = W.clone().requires_grad_(), b.clone().requires_grad_()
    out = linear_cross_entropy(h, WW, t, bb)
    out.backward()
    W2, b2 = W.double().requires_grad_(), b.double().requires_grad_()
    ref_loss(h, W2, t, b2).backward()
    torch.testing.assert_close(WW.grad.double(), W2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bb.grad.double(), b2.grad, rtol=1e-5, atol=1e-6)
    # nothing requires grad: a plain float tensor
    out = linear_cross_entropy(h, W, t, reduction="none")
    assert not out.requires_grad and out.shape == (9,)


def test_cce_bias_path_loss_nonnegative():
    # ml-cross-entropy#52: e[16,8], c[12,8], b~N(0,1) gave a loss below the reference, even negative
    g = torch.Generator().manual_seed(52)
    e, c, b = torch.randn(16, 8, generator=g), torch.randn(12, 8, generator=g), torch.randn(12, generator=g)
    t = torch.randint(0, 12, (16,), generator=g)
    out = linear_cross_entropy(e, c, t, b, reduction="none")
    torch.testing.assert_close(out, F.cross_entropy(e @ c.T + b, t, reduction="none"), rtol=1e-5, atol=1e-5)
    assert bool((out >= 0).all())


def test_bf16_weight_grad_accumulation_independent_of_chunks():
    # Liger#512: bf16 x[N,64], W[V,64]; with float32 accumulation 64 chunks are as good as 1
    g = torch.Generator().manual_seed(5)
    N, d, V = 1024, 64, 512
    x = torch.randn(N, d, generator=g).bfloat16()
    W = (torch.randn(V, d, generator=g) * 0.1).bfloat16()
    t = torch.randint(0, V, (N,), generator=g)
    W2 = W.double().requires_grad_()
    F.cross_entropy(x.double() @ W2.T, t, reduction="sum").backward()
    errs = []
    for n_chunks in (1, 64):
        WW = W.clone().requires_grad_()
        linear_cross_entropy(x, WW, t, reduction="sum", chunk_tokens=N // n_chunks).backward()
        errs.append(float((WW.grad.double() - W2.grad).abs().max()))
    scale = float(W2.grad.abs().max())
    assert errs[1] <= 1.5 * errs[0] + 1e-3 * scale
    assert errs[1] <= 1e-2 * scale


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_token_logprobs_topk_entropy_vocab_tiled(dtype):
    dt = getattr(torch, dtype)
    h, W, b, t = _inputs(23, 12, 257, dt, 11, bias=True, ignore_frac=0.0)
    z = F.linear(h.double(), W.double(), b.double()) * 0.8
    z = 6.0 * torch.tanh(z / 6.0)
    lp = torch.log_softmax(z, -1)
    for kw in [dict(chunk_tokens=5, chunk_vocab=19), dict(chunk_tokens=23, chunk_vocab=257), dict(chunk_bytes=1000)]:
        r = token_logprobs(h, W, t, bias=b, logit_scale=0.8, softcap=6.0, top_k=4, entropy=True, **kw)
        tol = 1e-5 if dtype == "float32" else 5e-2
        assert r.logprob.dtype == torch.float32 and r.lse.dtype == torch.float32
        assert float((r.logprob - lp.gather(1, t[:, None]).squeeze(1)).abs().max()) < tol
        assert float((r.lse - torch.logsumexp(z, -1)).abs().max()) < tol
        assert float((r.entropy + (lp.exp() * lp).sum(-1)).abs().max()) < tol
        assert float((r.topk_logprobs - lp.topk(4).values).abs().max()) < tol
        if dtype == "float32":
            assert torch.equal(r.topk_ids, lp.topk(4).indices)
        assert bool((r.logprob <= 0).all())


def test_token_logprobs_batched_shape_and_ties_lowest_id():
    W = torch.zeros(10, 3)  # all logits equal: uniform, ties everywhere
    h = torch.randn(2, 4, 3)
    r = token_logprobs(h, W, torch.zeros(2, 4, dtype=torch.long), top_k=3, entropy=True, chunk_vocab=4, chunk_tokens=3)
    assert r.logprob.shape == (2, 4) and r.topk_ids.shape == (2, 4, 3)
    torch.testing.assert_close(r.logprob, torch.full((2, 4), -math.log(10)))
    torch.testing.assert_close(r.entropy, torch.full((2, 4), math.log(10)))
    assert r.topk_ids.reshape(-1, 3).tolist() == [[0, 1, 2]] * 8


def test_token_logprobs_minus_inf_bias_entries():
    h, W, _, _ = _inputs(6, 4, 20, torch.float32, 2)
    b = torch.zeros(20)
    b[:10] = -math.inf  # half the vocabulary masked out (padding rows)
    r = token_logprobs(h, W, torch.full((6,), 15), bias=b, entropy=True, top_k=2, chunk_vocab=7)
    lp = torch.log_softmax(h @ W.T + b, -1)
    torch.testing.assert_close(r.logprob, lp[:, 15])
    ent = -(lp.exp() * torch.where(lp.isinf(), torch.zeros_like(lp), lp)).sum(-1)
    torch.testing.assert_close(r.entropy, ent)
    assert bool((r.topk_ids >= 10).all())


def test_chunk_sizes_respect_budget():
    assert chunk_sizes(4096, 32000, 16 * 2**20) == (131, 32000)
    assert chunk_sizes(4096, 32000) == (128, 32000)  # default: 1/32 of the [N, V] float32 logits
    n, v = chunk_sizes(100, 10**7, 2**20)
    assert n * v * 4 <= 2**20 and v < 10**7
    assert chunk_sizes(5, 1000, 2**30) == (5, 1000)


def test_bad_input_errors_name_shapes():
    h, W, _, t = _inputs(4, 6, 11, torch.float32, 0, ignore_frac=0.0)
    with pytest.raises(ShapeMismatch, match=r"hidden \(4, 5\) and weight \(11, 6\)"):
        linear_cross_entropy(h[:, :5], W, t)
    with pytest.raises(ShapeMismatch, match="dtype"):
        linear_cross_entropy(h.bfloat16(), W, t)
    with pytest.raises(ShapeMismatch, match="integer"):
        linear_cross_entropy(h, W, t.float())
    with pytest.raises(ShapeMismatch, match=r"targets \(3,\)"):
        linear_cross_entropy(h, W, t[:3])
    with pytest.raises(BadInput, match="id 11 outside \\[0, 11\\)"):
        linear_cross_entropy(h, W, torch.tensor([0, 1, 2, 11]))
    with pytest.raises(BadInput, match="id -5"):
        token_logprobs(h, W, torch.tensor([0, 1, 2, -5]))
    with pytest.raises(BadInput, match="empty"):
        token_logprobs(h[:0], W)
    with pytest.raises(BadInput, match="empty"):
        linear_cross_entropy(h[:0], W, t[:0])
    with pytest.raises(BadInput, match="reduction"):
        linear_cross_entropy(h, W, t, reduction="avg")
    with pytest.raises(BadInput, match="top_k"):
        token_logprobs(h, W, top_k=12)
    with pytest.raises(ShapeMismatch, match="must be float32"):
        token_logprobs(h.to(torch.int32), W)
    with pytest.raises(ShapeMismatch, match=r"bias \(10,\)"):
        token_logprobs(h, W, bias=torch.zeros(10))


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_underflowed_target_prob_and_masked_column_fall_back_exactly(reduction):
    # p_target underflows float32 (logit gap ~ 300) and column 0 (used for ignored rows) is -inf
    g = torch.Generator().manual_seed(9)
    h = torch.randn(6, 4, generator=g) * 30
    W = torch.randn(40, 4, generator=g) * 3
    b = torch.zeros(40)
    b[0] = -math.inf
    z = h @ W.T + b
    t = z[:, 1:].argmin(-1) + 1  # the least likely real token: loss in the hundreds
    t[2] = -100
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    out = linear_cross_entropy(hh, WW, t, b, reduction=reduction)
    out.sum().backward()
    h2, W2 = h.double().requires_grad_(), W.double().requires_grad_()
    ref = ref_loss(h2, W2, t, b, reduction=reduction)
    ref.sum().backward()
    assert bool(torch.isfinite(out).all()) and float(ref.detach().max()) > 100
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(hh.grad.double(), h2.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(WW.grad.double(), W2.grad, rtol=1e-4, atol=1e-3)



def test_train_chunk_sizes_low_precision_grad_uses_256_token_chunks():
    # N=2048, V=49152: 128-token full-row chunks by default, 256 for bf16/fp16 with gradients
    assert train_chunk_sizes(2048, 49152) == (128, 49152)
    assert train_chunk_sizes(2048, 49152, low_precision_grad=True) == (256, 49152)
    assert train_chunk_sizes(100, 49152, low_precision_grad=True) == (100, 49152)
    # an explicit budget is honoured as before
    assert train_chunk_sizes(2048, 49152, 4 * 2**20, low_precision_grad=True) == train_chunk_sizes(2048, 49152, 4 * 2**20)


@pytest.mark.parametrize("chunk_vocab", [None, 37, 200])
def test_target_rank_and_topk_over_the_real_columns(chunk_vocab):
    """rank and topk_cols against float64 logits: the rank counts the first ``topk_cols`` columns whose
    logit exceeds the target's (the target itself never), the top-k reads those columns only, the
    log-probabilities are normalized over all V; the same whether the vocabulary is tiled or not."""
    g = torch.Generator().manual_seed(11)
    N, d, V, cols = 9, 16, 230, 200
    h, W = torch.randn(N, d, generator=g), torch.randn(V, d, generator=g) / 2
    W[cols:] += 3 * torch.randn(d, generator=g)  # padding rows that would win the top-k if read
    b = torch.randn(V, generator=g)
    t = torch.randint(0, cols, (N,), generator=g)
    t[0] = int(torch.argmax((h[0].double() @ W.double().T + b.double())[:cols]))  # a target on top: rank 0
    r = token_logprobs(h, W, t, bias=b, softcap=5.0, top_k=3, topk_cols=cols, rank=True, chunk_vocab=chunk_vocab)
    z = 5.0 * torch.tanh((h.double() @ W.double().T + b.double()) / 5.0)
    lp = torch.log_softmax(z, -1)
    zt = z.gather(1, t[:, None])
    assert torch.equal(r.target_rank, (z[:, :cols] > zt).sum(1)) and int(r.target_rank[0]) == 0
    assert (r.logprob.double() - lp.gather(1, t[:, None])[:, 0]).abs().max() <= 1e-5
    tv, ti = torch.topk(lp[:, :cols], 3)
    assert torch.equal(r.topk_ids, ti) and (r.topk_logprobs.double() - tv).abs().max() <= 1e-5
    with pytest.raises(BadInput, match="rank needs targets"):
        token_logprobs(h, W, rank=True)
    with pytest.raises(BadInput, match="top_k"):
        token_logprobs(h, W, t, top_k=5, topk_cols=4)
    with pytest.raises(BadInput, match="topk_cols"):
        token_logprobs(h, W, t, topk_cols=V + 1)
