"""Embedding lookup (two backwards), address arithmetic, and the last-position LM head."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops import embedding_lookup, lm_head_last, lookup_cost


@pytest.mark.parametrize("backward", ["index_add", "sort"])
def test_seed_example_repeated_id_accumulates(backward):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    W = emb.weight.detach().clone().requires_grad_()
    ids = torch.tensor([3, 7, 3])
    out = embedding_lookup(W, ids, backward=backward)
    assert torch.equal(out, emb(ids))
    assert torch.equal(out, F.one_hot(ids, 10).float() @ W.detach())
    out.sum().backward()
    assert W.grad.sum(dim=1).tolist() == [0, 0, 0, 8, 0, 0, 0, 4, 0, 0]


@pytest.mark.parametrize("backward", ["index_add", "sort"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_nn_embedding_and_onehot(backward, dtype):
    g = torch.Generator().manual_seed(1)
    W0 = torch.randn(50, 8, generator=g).to(dtype)
    ids = torch.randint(0, 50, (6, 7), generator=g)
    ids[0, :4] = 5  # repeats
    go = torch.randn(6, 7, 8, generator=g).to(dtype)
    W = W0.clone().requires_grad_()
    out = embedding_lookup(W, ids, scale=2.0, padding_idx=5, backward=backward)
    out.backward(go)
    ref_mod = torch.nn.Embedding(50, 8, padding_idx=5, _weight=W0.clone(), dtype=dtype)
    ref = ref_mod(ids) * torch.tensor(2.0, dtype=dtype)
    ref.backward(go)
    assert torch.equal(out, ref)
    assert W.grad.dtype == dtype
    assert float(W.grad[5].abs().sum()) == 0.0  # padding row: no gradient
    # float64 one-hot reference for the gradient
    W64 = W0.double().requires_grad_()
    oh = F.one_hot(ids, 50).double() @ W64 * 2.0
    oh.backward(go.double())
    W64.grad[5] = 0
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert float((W.grad.double() - W64.grad).abs().max()) <= tol * max(1.0, float(W64.grad.abs().max()))


def test_sort_and_index_add_backwards_agree():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(1000, 16, generator=g)
    ids = torch.randint(0, 30, (4096,), generator=g)  # heavy repetition
    go = torch.randn(4096, 16, generator=g)
    grads = []
    for bw in ("index_add", "sort"):
        Wg = W.clone().requires_grad_()
        embedding_lookup(Wg, ids, backward=bw).backward(go)
        grads.append(Wg.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    assert float(grads[0][30:].abs().sum()) == 0.0


def test_out_of_range_ids_raise():
    W = torch.randn(10, 4)
    with pytest.raises(BadInput, match=r"id 10 outside \[0, 10\)"):
        embedding_lookup(W, torch.tensor([0, 10]))
    with pytest.raises(BadInput, match="id -1"):
        embedding_lookup(W, torch.tensor([-1, 3]))  # vLLM's -1 sentinel: never a silent wrong row
    with pytest.raises(ShapeMismatch, match="integer"):
        embedding_lookup(W, torch.tensor([1.0]))
    with pytest.raises(ShapeMismatch, match=r"\[V, d\]"):
        embedding_lookup(torch.randn(10), torch.tensor([1]))
    with pytest.raises(BadInput, match="backward"):
        embedding_lookup(W, torch.tensor([1]), backward="atomic")
    with pytest.raises(BadInput, match="padding_idx"):
        embedding_lookup(W, torch.tensor([1]), padding_idx=10)


def test_lookup_cost_seed_numbers():
    W = torch.empty(151936, 1024, dtype=torch.bfloat16, device="meta")
    c = lookup_cost(W, torch.arange(64))
    assert c.bytes_read == 131_072  # 64 tokens x 1024 x 2 bytes
    assert c.row_bytes == 2048 and c.matrix_bytes == 311_164_928
    assert lookup_cost(W, torch.tensor([42])).row_offsets.tolist() == [86_016]  # 42 x 1024 x 2
    assert c.onehot_flops == 2 * 151936 * 1024 * 64
    Wr = torch.zeros(100, 8)
    c2 = lookup_cost(Wr, torch.tensor([3, 7, 3]))
    assert c2.addresses.tolist() == [Wr[i].data_ptr() for i in (3, 7, 3)]
    assert c2.bytes_read == 3 * 32 and c2.unique_bytes_read == 2 * 32


def test_lm_head_last_positions_and_mask():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(3, 5, 4, generator=g)
    W, b = torch.randn(11, 4, generator=g), torch.randn(11, generator=g)
    full = F.linear(h, W, b)
    full_c = 2.0 * torch.tanh(full / 2.0)
    torch.testing.assert_close(lm_head_last(h, W, b), full[:, -1])
    torch.testing.assert_close(lm_head_last(h, W, b, softcap=2.0), full_c[:, -1])
    torch.testing.assert_close(lm_head_last(h, W, b, positions=[0, -2]), full[:, [0, 3]])
    torch.testing.assert_close(lm_head_last(h, W, b, positions=torch.tensor([1, 4, 2])), full[[0, 1, 2], [1, 4, 2]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    torch.testing.assert_close(lm_head_last(h, W, b, attention_mask=mask), full[[0, 1, 2], [2, 4, 0]])
    assert lm_head_last(h.bfloat16(), W.bfloat16()).dtype == torch.float32
    torch.testing.assert_close(lm_head_last(h[0], W), (h[0] @ W.T)[-1:])


def test_lm_head_last_bad_input():
    h, W = torch.randn(2, 3, 4), torch.randn(7, 4)
    with pytest.raises(ShapeMismatch, match=r"hidden \(2, 3, 5\) and weight \(7, 4\)"):
        lm_head_last(torch.randn(2, 3, 5), W)
    with pytest.raises(BadInput, match="empty"):
        lm_head_last(torch.randn(2, 0, 4), W)
    with pytest.raises(BadInput, match="outside"):
        lm_head_last(h, W, positions=[3])
    with pytest.raises(BadInput, match="no attended"):
        lm_head_last(h, W, attention_mask=torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ShapeMismatch, match="attention_mask"):
        lm_head_last(h, W, attention_mask=torch.ones(2, 4))
    assert math.isfinite(float(lm_head_last(h, W).sum()))
