"""The vocab-parallel lens statistics (:mod:`vocablens.ops.vocab_parallel.readout`) in a world of one
equal :func:`vocablens.ops.kl_readout` and :func:`vocablens.ops.logits_readout` (the one-process
oracle), for a biased, scaled and soft-capped head, targets, ranks, top-k over the real columns and
max |Δp|; 2 ranks are compared with one process end to end in tests/e2e/test_tensor_parallel.py."""

import pytest
import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops.kl import kl_readout, logits_readout
from vocablens.ops.vocab_parallel.readout import vocab_parallel_kl_readout, vocab_parallel_logits_readout


def _inputs(S=3, N=9, d=16, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(S, N, d, generator=g), torch.randn(V, d, generator=g), torch.randn(V, generator=g),
            3 * torch.randn(N, V, generator=g), torch.randint(0, V, (N,), generator=g))


def _same(a, b, atol=1e-5):
    for k, x in a.__dict__.items():
        y = getattr(b, k)
        assert (x is None) == (y is None), k
        if x is None:
            continue
        assert x.shape == y.shape, k
        if x.dtype in (torch.int64, torch.int32):
            assert torch.equal(x, y), k
        else:
            torch.testing.assert_close(y.double(), x.double(), atol=atol, rtol=1e-6, msg=k)  # float32 sums in another order


@pytest.mark.parametrize("head", [dict(), dict(logit_scale=0.7, softcap=5.0)])
def test_world_of_one_equals_kl_readout(head):
    H, W, b, ref, t = _inputs()
    kw = dict(targets=t, rank=True, top_k=4, topk_cols=45, entropy=True, max_abs_dp=True, **head)
    _same(kl_readout(H, W, ref, bias=b, **kw), vocab_parallel_kl_readout(H, W, ref, 0, W.shape[0], bias=b, **kw))
    _same(kl_readout(H[0], W, ref, **kw), vocab_parallel_kl_readout(H[0], W, ref, 0, W.shape[0], **kw))  # [N, d]


def test_world_of_one_equals_logits_readout():
    _, _, _, ref, t = _inputs()
    z = ref + 0.5 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(3))
    kw = dict(targets=t, rank=True, top_k=3, entropy=True, max_abs_dp=True)
    _same(logits_readout(z, ref, **kw), vocab_parallel_logits_readout(z, ref, 0, ref.shape[1], **kw))
    got = vocab_parallel_logits_readout(ref, ref, 0, ref.shape[1], targets=t)
    assert float(got.kl.abs().max()) <= 1e-6  # a distribution against itself


def test_bad_arguments_are_refused():
    H, W, b, ref, t = _inputs()
    with pytest.raises(BadInput):
        vocab_parallel_kl_readout(H, W, ref, 0, W.shape[0], rank=True)  # rank without targets
    with pytest.raises(BadInput):
        vocab_parallel_kl_readout(H, W, ref, 0, W.shape[0], top_k=W.shape[0] + 1)
    with pytest.raises(BadInput):
        vocab_parallel_kl_readout(H, W, ref, 10, W.shape[0])  # the shard does not fit V
    with pytest.raises(ShapeMismatch):
        vocab_parallel_kl_readout(H, W, ref[:, :-1], 0, W.shape[0])
