"""vocablens.ops.kl: chunked KL(reference ‖ q) through the LM head, values and gradients against float64."""

from __future__ import annotations

import pytest
import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops import kl_readout, linear_kl


def _case(S=3, N=7, d=12, V=97, seed=0, offset=0.0, wscale=1.0):
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(S, N, d, generator=g)
    W = torch.randn(V, d, generator=g) * wscale
    b = torch.randn(V, generator=g)
    ref = torch.randn(N, V, generator=g) * 3 + offset
    return H, W, b, ref


def _ref64(H, W, b, ref, scale, softcap):
    z = (H.double() @ W.double().T + b.double()) * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lq = torch.log_softmax(z, -1)
    lp = torch.log_softmax(ref.double(), -1)
    return z, lq, lp


@pytest.mark.parametrize("scale,softcap", [(1.0, None), (0.37, None), (1.0, 5.0), (2.5, 3.0)])
@pytest.mark.parametrize("chunk_rows", [None, 4, 5])
def test_readout_equals_float64(scale, softcap, chunk_rows):
    H, W, b, ref = _case()
    t = torch.tensor([0, 5, 96, 3, 3, 50, 1])
    r = kl_readout(H, W, ref, bias=b, logit_scale=scale, softcap=softcap, targets=t, rank=True, top_k=4,
                   entropy=True, max_abs_dp=True, chunk_rows=chunk_rows)
    z, lq, lp = _ref64(H, W, b, ref, scale, softcap)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    torch.testing.assert_close(r.kl.double(), kl, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r.lse.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(r.entropy.double(), -(lq.exp() * lq).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r.target_logprob.double(), lq[..., t].diagonal(dim1=1, dim2=2), rtol=1e-5, atol=1e-5)
    tv, ti = torch.topk(lq, 4, -1)
    # ids: exactly torch.topk's wherever float32 can tell the values apart (softcaps squeeze them)
    torch.testing.assert_close(lq.gather(2, r.topk_ids), tv, rtol=1e-5, atol=1e-5)
    gaps = (tv[..., :-1] - tv[..., 1:]).amin(-1) > 1e-4
    assert torch.equal(r.topk_ids[gaps], ti[gaps]) and bool(gaps.any())
    torch.testing.assert_close(r.topk_logprobs.double(), tv, rtol=1e-5, atol=1e-5)
    zt = z.gather(2, t.view(1, -1, 1).expand(3, -1, 1))
    tie = ((z - zt).abs() < 1e-5).sum(-1) > 1  # float32 cannot order near-ties of the target
    assert torch.equal(r.target_rank[~tie], (z > zt).sum(-1)[~tie])
    torch.testing.assert_close(r.max_abs_dp.double(), (lq.exp() - lp.exp()).abs().amax(-1), rtol=1e-4, atol=1e-6)


def test_readout_depends_only_on_logit_differences_and_handles_masked_reference():
    H, W, b, ref = _case(N=4)
    for off in (1e4, 1e6, 1e8):
        shifted = ref + off  # float32: the offset costs the inputs' own precision, nothing more
        r = kl_readout(H, W, shifted, bias=b)
        _, lq, lp = _ref64(H, W, b, shifted, 1.0, None)
        torch.testing.assert_close(r.kl.double(), (lp.exp() * (lp - lq)).sum(-1), rtol=1e-5, atol=1e-5)
    masked = ref.clone()
    masked[:, 50:] = float("-inf")
    r = kl_readout(H, W, masked, bias=b)
    _, lq, lp = _ref64(H, W, b, masked, 1.0, None)
    kl = (lp.exp() * (lp - lq)).nan_to_num().sum(-1)
    assert torch.isfinite(r.kl).all()
    torch.testing.assert_close(r.kl.double(), kl, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale,softcap", [(1.0, None), (0.5, 4.0)])
def test_linear_kl_and_ce_gradients_equal_float64_autograd(scale, softcap):
    H, W, b, ref = _case(N=6)
    valid = torch.tensor([True, True, False, True, True, True])
    t = torch.tensor([1, 2, 3, 90, 0, 7])
    for mode in ("kl", "ce"):
        H64 = H.double().requires_grad_(True)
        z, lq, lp = _ref64(H64, W, b, ref, scale, softcap)
        if mode == "kl":
            per = (lp.exp() * (lp - lq)).sum(-1)
        else:
            per = -lq.gather(2, t.view(1, -1, 1).expand(3, -1, 1))[..., 0]
        per = per * valid.double()
        (g64,) = torch.autograd.grad(per.sum() * 0.25, H64)
        kw = dict(reference=ref) if mode == "kl" else dict(targets=t)
        got = linear_kl(H, W, valid=valid, bias=b, logit_scale=scale, softcap=softcap, grad_scale=0.25,
                        chunk_rows=5, **kw)
        torch.testing.assert_close(got.loss, per.detach().sum(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.grad.double(), g64, rtol=1e-4, atol=1e-6)
        off = linear_kl(H, W, valid=valid, bias=b, logit_scale=scale, softcap=softcap, want_grad=False, **kw)
        assert off.grad is None
        torch.testing.assert_close(off.loss, got.loss, rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_named():
    H, W, b, ref = _case()
    with pytest.raises(BadInput, match="top_k"):
        kl_readout(H, W, ref, top_k=True)
    with pytest.raises(BadInput, match="top_k"):
        kl_readout(H, W, ref, top_k=1.5)
    with pytest.raises(ShapeMismatch, match="reference"):
        kl_readout(H, W, ref[:, :5])
    with pytest.raises(BadInput, match="rank"):
        kl_readout(H, W, ref, rank=True)
    with pytest.raises(BadInput):
        linear_kl(H, W, ref, torch.zeros(7, dtype=torch.long))
    with pytest.raises(BadInput, match="softcap"):
        kl_readout(H, W, ref, softcap=-1.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_readout_cache_blocks_threads_and_far_tail_equal_float64(threads):
    """Row blocks of the statistics pass (block-maxima top-k, V a multiple of 64), pair blocks of 8
    tokens across chunks, one or two worker threads, and logits spread over ~1000 nats (exp's input
    floored at -87 where the far tail would underflow) all give the float64 values."""
    H, W, b, ref = _case(S=3, N=21, d=16, V=64 * 40, seed=3, wscale=12.0)
    t = torch.arange(21) * 101
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = [kl_readout(H, W, ref, bias=b, targets=t, rank=True, top_k=3, entropy=True, max_abs_dp=True, **kw)
                for kw in ({}, {"chunk_rows": 7})]
    finally:
        torch.set_num_threads(old)
    z, lq, lp = _ref64(H, W, b, ref, 1.0, None)
    assert float((z.amax(-1, keepdim=True) - z).amax()) > 300  # the underflow regime
    for r in outs:
        torch.testing.assert_close(r.kl.double(), (lp.exp() * (lp - lq)).sum(-1), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(r.lse.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(r.entropy.double(), -(lq.exp() * lq).sum(-1), rtol=1e-4, atol=1e-6)
        tv, ti = torch.topk(lq, 3, -1)
        torch.testing.assert_close(r.topk_logprobs.double(), tv, rtol=1e-5, atol=1e-4)
        assert torch.equal(r.topk_ids, ti)
        torch.testing.assert_close(r.target_logprob.double(), lq[..., t].diagonal(dim1=1, dim2=2), rtol=1e-5, atol=1e-4)
        zt = z.gather(2, t.view(1, -1, 1).expand(3, -1, 1))
        assert torch.equal(r.target_rank, (z > zt).sum(-1))
        torch.testing.assert_close(r.max_abs_dp.double(), (lq.exp() - lp.exp()).abs().amax(-1), rtol=1e-4, atol=1e-6)
    for f in ("kl", "lse", "entropy", "topk_logprobs", "target_logprob"):  # chunking changes no value
        torch.testing.assert_close(getattr(outs[0], f), getattr(outs[1], f), rtol=1e-5, atol=1e-4)


def test_readout_worker_threads_keep_no_grad_for_inputs_that_require_grad():
    """The statistics' worker threads run under the caller's grad mode (grad mode is thread-local):
    a reference and hidden states that require grad (a model's own outputs) read as without grad.
    Failed before: 'exp(): functions with out=... arguments don't support automatic differentiation'."""
    H, W, b, ref = _case(S=2, N=40, d=16, V=64 * 8, seed=5, wscale=1.0)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = kl_readout(H.requires_grad_(), W.requires_grad_(), ref.requires_grad_(), bias=b, entropy=True)
        want = kl_readout(H.detach(), W.detach(), ref.detach(), bias=b, entropy=True)
    finally:
        torch.set_num_threads(old)
    assert not got.kl.requires_grad
    assert torch.equal(got.kl, want.kl) and torch.equal(got.entropy, want.entropy)


@pytest.mark.parametrize("S,N", [(1, 9), (5, 19)])
def test_readout_of_the_reference_itself_is_kl_zero_and_far_kl_is_exact(S, N):
    """A lens row whose logits are its reference gives KL 0 to float32 rounding (the reference side
    goes through the same shift, exp and sums as the lens side), and a KL of hundreds of nats is
    within 2e-6 relative of float64 (the products p·(z - m) are summed by ATen's row sums, not a
    sequential dot)."""
    H, W, b, _ = _case(S=S, N=N, d=16, V=64 * 40, seed=7, wscale=6.0)
    ref = H[-1] @ W.T + b  # the last layer's own logits: the same GEMM the readout runs
    r = kl_readout(H, W, ref, bias=b, entropy=True)
    assert float(r.kl[-1].abs().max()) <= 1e-6
    z, lq, lp = _ref64(H, W, b, ref, 1.0, None)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    assert float(kl.max()) > 50 or S == 1
    torch.testing.assert_close(r.kl.double(), kl, rtol=2e-6, atol=2e-6)


def test_run_blocks_dynamic_runs_each_job_once_and_a_stalled_worker_leaves_its_share():
    """With ``dynamic``, worker threads pull jobs one at a time: every job runs exactly once, and a
    worker the OS deschedules (here: sleeping in its first job) leaves the rest to the other one
    instead of holding half the jobs (the static split gives each worker 20 of 40)."""
    import threading
    import time

    from vocablens.ops.chunking import run_blocks

    seen, lock, slept = [], threading.Lock(), []

    def work(lo, hi, w):
        if w == 0 and not slept:
            slept.append(1)
            time.sleep(0.5)
        with lock:
            seen.extend((i, w) for i in range(lo, hi))

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_blocks(work, 40, "cpu", dynamic=True)
        static = []
        run_blocks(lambda lo, hi, w: static.append((lo, hi, w)), 40, "cpu")
    finally:
        torch.set_num_threads(old)
    assert sorted(i for i, _ in seen) == list(range(40))
    assert sum(w == 1 for _, w in seen) >= 30
    assert sorted(static) == [(0, 20, 0), (20, 40, 1)]


def test_logits_readout_gives_kl_readouts_statistics_of_the_same_logits():
    """Statistics of given logits (no GEMM) equal kl_readout's over the same logits, and float64's."""
    from vocablens.ops import logits_readout

    H, W, b, ref = _case(S=1, N=19, d=16, V=64 * 40, seed=11, wscale=4.0)
    t = torch.arange(19) * 7
    kw = dict(targets=t, rank=True, top_k=4, entropy=True, max_abs_dp=True)
    z = torch.addmm(b, H[0], W.T)
    got = logits_readout(z, ref, **kw)
    want = kl_readout(H[0], W, ref, bias=b, **kw)
    for f in ("kl", "lse", "entropy", "topk_logprobs", "target_logprob", "max_abs_dp"):
        torch.testing.assert_close(getattr(got, f), getattr(want, f), rtol=1e-5, atol=1e-5)
    assert torch.equal(got.topk_ids, want.topk_ids) and torch.equal(got.target_rank, want.target_rank)
    _, lq, lp = _ref64(H[0], W, b, ref, 1.0, None)
    torch.testing.assert_close(got.kl.double(), (lp.exp() * (lp - lq)).sum(-1), rtol=1e-5, atol=1e-4)
    self_kl = logits_readout(ref, ref, entropy=True)
    assert float(self_kl.kl.abs().max()) <= 1e-6
    with pytest.raises(ShapeMismatch):
        logits_readout(z[:, :5], ref)
    with pytest.raises(BadInput):
        logits_readout(z, ref, top_k=1.5)
