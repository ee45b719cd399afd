"""Aligning two models' FFN neurons and attention heads through their shared vocabulary."""

import copy

import pytest
import torch

from tiny_models import make_tiny
from vocablens.vocab_space.align import align_models, shared_vocabulary, unit_top_tokens
from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import block_view


class _Tok:
    """A tokenizer stand-in: ``get_vocab`` over V token strings."""

    def __init__(self, names):
        self.names = list(names)

    def get_vocab(self):
        return {t: i for i, t in enumerate(self.names)}


def _tok(V, prefix="t"):
    return _Tok(f"{prefix}{i}" for i in range(V))


def _permuted(model, noise=0.01, seed=0):
    """A copy whose FFN neurons are permuted in every layer (same function), plus Gaussian noise on
    the value vectors (``noise`` x their std). Returns (copy, permutations)."""
    B = copy.deepcopy(model)
    b = Borders.from_model(B)
    g = torch.Generator().manual_seed(seed)
    perms = []
    with torch.no_grad():
        for i in range(b.n_layers):
            v = block_view(b, i)
            d_ff = v.d_ff
            p = torch.randperm(d_ff, generator=g)
            for mod in (v.mlp_in, v.mlp_gate):
                if mod is not None:
                    mod.weight.copy_(mod.weight[p])
            v.mlp_out.weight.copy_(v.mlp_out.weight[:, p])
            w = v.mlp_out.weight
            w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
            perms.append(p)
    return B, perms


@pytest.fixture(scope="module")
def llama():
    m = make_tiny("llama")
    # more neurons than the default tiny config makes the recovery a real test
    return m


def test_permutation_is_recovered(llama):
    A = Borders.from_model(llama)
    Bm, perms = _permuted(llama, noise=0.05)
    B = Borders.from_model(Bm)
    V = A.vocab_size
    res = align_models(A, _tok(V), B, _tok(V), what="ffn")
    assert res.shared.identical and res.shared.size == V
    for m, p in zip(res.matches, perms):
        assert m.block_b == m.block_a                    # a layer is most similar to itself
        # neuron j of B is neuron p[j] of A: A's neuron i sits at position inv[i] in B
        inv = torch.argsort(p)
        assert (m.partner == inv).float().mean() >= 0.95
        assert m.mean_corr > 0.9
    # the layer map's diagonal dominates
    sim = res.block_similarity
    assert torch.all(sim.diagonal() >= sim.max(1).values - 1e-6)


def test_ffn_corr_equals_pearson_over_vocabulary(llama, monkeypatch):
    """The Gram-matrix shortcut (the shared readout streamed in blocks of 7 tokens) equals the Pearson
    correlation of explicitly projected scores."""
    import vocablens.vocab_space.align

    monkeypatch.setattr(vocablens.vocab_space.align, "ROW_BLOCK", 7)
    A = Borders.from_model(llama)
    Bm, _ = _permuted(llama, noise=0.5, seed=3)
    B = Borders.from_model(Bm)
    V = A.vocab_size
    res = align_models(A, _tok(V), B, _tok(V), what="ffn", blocks_a=[1], blocks_b=[1])
    m = res.matches[0]
    RA = A.unembedding.readout(True).double()
    RB = B.unembedding.readout(True).double()
    va = block_view(A, 1).W_out.detach().double()
    vb = block_view(B, 1).W_out.detach().double()
    for i in range(0, va.shape[0], 17):
        j = int(m.partner[i])
        pa, pb = RA @ va[i], RB @ vb[j]
        ref = torch.corrcoef(torch.stack([pa, pb]))[0, 1]
        assert abs(float(m.corr[i]) - float(ref)) < 1e-4


def test_heads_cosine_equals_explicit_matrices(monkeypatch):
    """The factored trace (readout and embedding streamed in blocks of 7 tokens) equals the cosine of
    explicit token-centred [S, S] OV matrices."""
    import vocablens.vocab_space.align

    monkeypatch.setattr(vocablens.vocab_space.align, "ROW_BLOCK", 7)
    model = make_tiny("llama")
    A = Borders.from_model(model)
    Bm = copy.deepcopy(model)
    with torch.no_grad():
        for p in Bm.parameters():
            p.add_(0.3 * torch.randn_like(p) * p.std())
    B = Borders.from_model(Bm)
    V = A.vocab_size
    res = align_models(A, _tok(V), B, _tok(V), what="heads", blocks_a=[0], blocks_b=[1])

    @torch.no_grad()
    def X(b, layer, h):
        E = b.W_E.detach().double() * b.embed_scale
        R = b.unembedding.readout(True).double()
        Wv, Wo = block_view(b, layer).W_OV(h)
        M = (E - E.mean(0)) @ Wv.double() @ Wo.double() @ (R - R.mean(0)).t()
        return M.flatten()

    m = res.matches[0]
    for h in range(block_view(A, 0).n_heads):
        j = int(m.partner[h])
        xa, xb = X(A, 0, h), X(B, 1, j)
        ref = float(xa @ xb / (xa.norm() * xb.norm()))
        assert abs(float(m.corr[h]) - ref) < 1e-4


def test_fine_tuned_copy_keeps_identity():
    """A few SGD steps of next-token training leave each neuron matched to itself."""
    model = make_tiny("llama")
    Bm = copy.deepcopy(model).train()
    opt = torch.optim.SGD(Bm.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randint(0, model.config.vocab_size, (4, 16), generator=g)
        loss = Bm(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    A, B = Borders.from_model(model), Borders.from_model(Bm.eval())
    V = A.vocab_size
    res = align_models(A, _tok(V), B, _tok(V))
    for m in res.matches:
        assert (m.partner == torch.arange(len(m.partner))).float().mean() >= 0.95


def test_shared_vocabulary_maps_by_string():
    a = _Tok(["x", "y", "z"] + [f"t{i}" for i in range(300)])
    b = _Tok([f"t{i}" for i in range(300)][::-1] + ["y", "new"])
    sv = shared_vocabulary(a, b, 303, 302, min_shared=256)
    assert sv.size == 301 and not sv.identical
    va, vb = a.get_vocab(), b.get_vocab()
    inv_a = {i: t for t, i in va.items()}
    inv_b = {i: t for t, i in vb.items()}
    assert all(inv_a[int(i)] == inv_b[int(j)] for i, j in zip(sv.ids_a, sv.ids_b))
    with pytest.raises(BadInput):
        shared_vocabulary(_tok(300, "a"), _tok(300, "b"), 300, 300, min_shared=256)


def test_bad_arguments(llama):
    A = Borders.from_model(llama)
    V = A.vocab_size
    with pytest.raises(BadInput):
        align_models(A, _tok(V), A, _tok(V), what="mlp")
    with pytest.raises(BadInput):
        align_models(A, _tok(V), A, _tok(V), blocks_a=[A.n_layers])


def test_top_tokens_of_a_value_vector(llama):
    A = Borders.from_model(llama)
    top = unit_top_tokens(A, "ffn", 0, 3, k=4)
    scores = A.unembedding.readout(True) @ block_view(A, 0).W_out[3].detach().float()
    assert top == torch.topk(scores, 4).indices.tolist()


@pytest.mark.slow
def test_default_model_permuted_copy_is_recovered():
    """The real pair: SmolLM2-135M against a copy of itself with every block's FFN neurons permuted and
    noise of 5% of the value vectors' std added: the alignment recovers the permutation."""
    import vocablens.models as M

    lm = M.load("smollm2")
    Bm, perms = _permuted(lm.model, noise=0.05, seed=1)
    A, B = lm.borders, Borders.from_model(Bm, lm.tokenizer)
    blocks = [0, 15, 29]
    res = align_models(A, lm.tokenizer, B, lm.tokenizer, what="ffn", blocks_a=blocks, blocks_b=blocks)
    assert res.shared.identical and res.shared.size == 49152
    for m in res.matches:
        inv = torch.argsort(perms[m.block_a])
        assert m.block_b == m.block_a
        assert (m.partner == inv).float().mean() >= 0.95


def test_best_pairs_order_ties_by_block_then_unit():
    """Aligning a model with itself gives hundreds of correlation-1.000 ties whose order followed the
    last float bits of each machine; now ties at the table's 3 decimals go by block of A, then unit."""
    from types import SimpleNamespace

    from vocablens.render.align import PAIR_ORDER, best_pairs

    g = torch.Generator().manual_seed(0)
    matches = []
    for layer in (3, 1, 2):  # layers listed out of order, as a --blocks-a list may be
        corr = 1.0 + (torch.rand(50, generator=g, dtype=torch.float64) - 0.5) * 4e-6  # 1.000 ± 2e-6
        corr[7] = 0.9
        corr[11] = float("nan")
        matches.append(SimpleNamespace(block_a=layer, block_b=layer, partner=torch.randperm(50, generator=g),
                                       corr=corr))
    res = SimpleNamespace(matches=matches)
    got = best_pairs(res, 200)
    ones = [(la, ua) for la, ua, _, _, c in got if round(c, 3) == 1.0]
    assert ones == sorted((la, u) for la in (1, 2, 3) for u in range(50) if u not in (7, 11))
    assert [(la, ua) for la, ua, *_ in got[-3:]] == [(1, 7), (2, 7), (3, 7)]  # 0.9 after every tie
    assert len(got) == 3 * 49  # NaN pairs left out
    # the same pairs in another order (another machine's rounding) give the same list
    for m in matches:
        m.corr = m.corr.flip(0).flip(0) + torch.where(torch.arange(50) % 2 == 0, 1e-7, -1e-7).double()
    assert [(la, ua) for la, ua, *_ in best_pairs(res, 200)] == [(la, ua) for la, ua, *_ in got]
    assert [r[:4] for r in best_pairs(res, 2)] == [(1, 0, 1, int(matches[1].partner[0])), (1, 1, 1, int(matches[1].partner[1]))]
    assert "ties by block of A, then unit of A" in PAIR_ORDER
