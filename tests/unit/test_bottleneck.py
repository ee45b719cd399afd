"""vocablens.argmax.bottleneck: the blockwise Gram matrices equal the whole-matrix formula (float64
rounding), with and without bias and softcap, for N <= V and N > V; context_hidden equals the
residual stream's last layer through the final norm."""

from __future__ import annotations

import pytest
import torch

from tiny_models import ids, make_tiny
from vocablens.argmax.bottleneck import softmax_bottleneck
from vocablens.errors import BadInput
from vocablens.logit_transform import transform_logits
from vocablens.models import Borders


def whole_formula(W, H, bias, scale, softcap):
    """The whole-matrix reference: W in float64, L = H W^T + b, A = L - lse, Grams W^T W and A A^T."""
    Wd, Hd = W.double(), H.double()
    G = Wd.T @ Wd if Wd.shape[0] >= Wd.shape[1] else Wd @ Wd.T
    L = Hd @ Wd.T
    if bias is not None:
        L = L + bias.double()
    L = transform_logits(L, scale, softcap)
    A = L - torch.logsumexp(L, 1, keepdim=True)
    GA = A @ A.T if A.shape[0] <= A.shape[1] else A.T @ A
    return torch.linalg.eigvalsh(G).flip(0).clamp_min(0).sqrt(), torch.linalg.eigvalsh(GA).flip(0).clamp_min(0).sqrt()


@pytest.fixture
def one_thread():
    """Tiny blocks are many tiny GEMMs: on a busy machine each multi-threaded one waits for a thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("V,d,N", [(700, 12, 40), (50, 12, 90), (9, 16, 20)])
@pytest.mark.parametrize("bias,softcap", [(False, None), (True, None), (True, 3.0)])
def test_blockwise_equals_whole_matrix(V, d, N, bias, softcap, one_thread):
    g = torch.Generator().manual_seed(V + N)
    W = torch.randn(V, d, generator=g)
    H = 2 * torch.randn(N, d, generator=g)
    b = torch.randn(V, generator=g) if bias else None
    sW, sA = whole_formula(W, H, b, 0.7, softcap)
    # blocks of 16 KiB: several row blocks of W and column blocks of A (row blocks of A when N > V)
    res = softmax_bottleneck(W, H, bias=b, logit_scale=0.7, softcap=softcap, block_bytes=16384)
    big = softmax_bottleneck(W, H, bias=b, logit_scale=0.7, softcap=softcap)  # one block
    for r in (res, big):  # squared: the eigenvalues of the Grams, equal to float64 rounding of the largest
        torch.testing.assert_close(r.sigma_W ** 2, sW ** 2, rtol=1e-10, atol=1e-12 * float(sW[0]) ** 2)
        torch.testing.assert_close(r.sigma_A ** 2, sA ** 2, rtol=1e-10, atol=1e-12 * float(sA[0]) ** 2)
        assert r.n_contexts == N and r.V == V and r.d == d and r.softcap == bool(softcap)
    ref = softmax_bottleneck(W.double(), H.double(), bias=None if b is None else b.double(), logit_scale=0.7,
                             softcap=softcap, block_bytes=1 << 30)
    assert (res.rank_W, res.rank_A) == (ref.rank_W, ref.rank_A)


def test_low_rank_found_blockwise(one_thread):
    """A rank-5 W and its log-probabilities keep their exact ranks when read in tiny blocks."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(300, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 12, generator=g, dtype=torch.float64)
    H = torch.randn(40, 12, generator=g, dtype=torch.float64)
    res = softmax_bottleneck(W, H, block_bytes=4096)
    assert res.rank_W == 5 and res.rank_A == 6 and res.bound_A == 13


def test_nonfinite_block_refused():
    W = torch.randn(100, 8)
    W[77, 3] = float("nan")
    with pytest.raises(BadInput, match="NaN or inf"):
        softmax_bottleneck(W, block_bytes=256)


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt_project", "gemma2"])
def test_context_hidden_equals_residual_stream(family):
    from vocablens.argmax.bottleneck import context_hidden

    b = Borders.from_model(make_tiny(family))
    x = ids(3, 7)
    with torch.no_grad():  # the old path, batch by batch (a batch's GEMMs round as its size makes them)
        ref = torch.cat([b.unembedding.normed(b.residual_stream(x[s:s + 2])[0][-1]).float().reshape(-1, b.d_emb)
                         for s in (0, 2)])
    assert torch.equal(context_hidden(b, x, batch=2), ref)
    with pytest.raises(BadInput, match="token ids"):
        context_hidden(b, torch.full((1, 3), 10_000))


@pytest.mark.parametrize("V,d,N", [(300, 8, 25), (20, 8, 60)])
def test_logprob_gram_equals_float64_log_softmax(V, d, N, one_thread):
    """ops.gram.logprob_gram (streamed over V in blocks) against A = log_softmax(L) in float64, whole:
    the Gram itself, entry by entry, both branches (N <= V: A A^T; N > V: A^T A)."""
    from vocablens.ops.gram import logprob_gram, weight_gram

    g = torch.Generator().manual_seed(V * N)
    W = torch.randn(V, d, generator=g)
    H = 3 * torch.randn(N, d, generator=g, dtype=torch.float64)
    b = torch.randn(V, generator=g)
    L = transform_logits(H @ W.double().T + b.double(), 0.5, 4.0)
    A = torch.log_softmax(L, 1)
    ref = A @ A.T if N <= V else A.T @ A
    got = logprob_gram(W, H, b, 0.5, 4.0, block_bytes=2048)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))
    Wd = W.double()
    torch.testing.assert_close(weight_gram(W, 512), Wd.T @ Wd, rtol=1e-12, atol=1e-12 * float((Wd.T @ Wd).abs().max()))
