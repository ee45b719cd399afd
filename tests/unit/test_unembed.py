"""The one unembedding object: every family, every way of reading logits through it."""

import pytest
import torch

from tiny_models import FAMILIES, ids, make_tiny
from vocablens.errors import BadInput
from vocablens.logit_transform import transform_logits, transform_logits_backward
from vocablens.models import Borders


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    model = make_tiny(request.param)
    return request.param, model, Borders.from_model(model)


def test_unembedding_gives_model_logits(tiny):
    _, _, b = tiny
    U = b.unembedding
    with torch.no_grad():
        resid, logits = b.residual_stream(ids())
        assert (U(resid[-1]) - logits).abs().max().item() <= 1e-4
        # a subset of rows gives the same columns of the full logits (up to GEMM rounding)
        rows = [0, 5, b.vocab_size - 1]
        full = U(resid[-1])
        assert (U(resid[-1], rows=rows) - full[..., rows]).abs().max().item() <= 1e-5
        # float32 copy: same logits within float32 rounding
        assert (U.float32()(resid[-1].float()) - logits).abs().max().item() <= 1e-4


def test_readout_is_linear_part_of_the_head(tiny):
    """readout(fold_norm_gain=False, scaled=True) @ u == logit_scale · W_U P u (no bias, no cap)."""
    _, _, b = tiny
    U = b.unembedding
    u = torch.randn(3, b.d_model)
    R = U.readout(fold_norm_gain=False, scaled=True)
    ref = u
    if b.project_out is not None:
        ref = b.project_out(u).detach()
    ref = (ref @ b.unembedding.weight.detach().float().T) * b.logit_scale
    assert R.shape == (b.vocab_size, b.d_model)
    assert (u @ R.T - ref).abs().max().item() <= 1e-4


def test_identity_hash_ignores_float32_vs_bf16():
    model = make_tiny("llama")
    h32 = Borders.from_model(model).unembedding.identity_hash()
    h16 = Borders.from_model(make_tiny("llama").to(torch.bfloat16)).unembedding.identity_hash()
    assert h32 == h16 and len(h32) == 64
    other = Borders.from_model(make_tiny("llama", seed=1)).unembedding.identity_hash()
    assert other != h32


def test_rows_out_of_range():
    b = Borders.from_model(make_tiny("llama"))
    with pytest.raises(BadInput):
        b.unembedding.logits(torch.zeros(1, b.d_emb), rows=[b.vocab_size])


def test_transform_and_its_derivative():
    z = torch.linspace(-80, 80, 41, dtype=torch.float64, requires_grad=True)
    y = transform_logits(z, 0.5, 30.0)
    assert torch.allclose(y, 30.0 * torch.tanh(0.5 * z / 30.0))
    g = torch.randn(41, dtype=torch.float64)
    (y * g).sum().backward()
    assert torch.allclose(transform_logits_backward(g.clone(), y.detach(), 0.5, 30.0), z.grad)
    w = torch.randn(5)
    assert transform_logits(w) is w
    assert torch.equal(transform_logits(w.clone(), 2.0, inplace=True), w * 2)


def test_tanh_only_in_logit_transform():
    """The transform softcap(scale·z) is written once: no other module of src/ calls tanh."""
    import pathlib
    import re

    import vocablens

    root = pathlib.Path(vocablens.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "logit_transform.py" and re.search(r"\btanh_?\(", p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("fold,scaled", [(True, False), (False, True)])
def test_streamed_scores_equal_readout_matrix(tiny, fold, scaled):
    """Unembedding.scores(v) == readout() @ v (float64 oracle), streamed in small blocks, for
    one direction, a batch, a slice and ids; readout_rows == readout rows; None is refused."""
    _, _, b = tiny
    U = b.unembedding
    R = U.readout(fold, scaled=scaled, dtype=torch.float64)  # [V, d] oracle
    v = torch.randn(4, b.d_model)
    ref = v.double() @ R.T  # [4, V]
    tol = 1e-4 * max(1.0, float(ref.abs().max()))
    assert (U.scores(v, fold, scaled=scaled, block_rows=7).double() - ref).abs().max() <= tol
    assert (U.scores(v[0], fold, scaled=scaled).double() - ref[0]).abs().max() <= tol
    got = U.scores(v[1], fold, scaled=scaled, rows=slice(3, 50), block_rows=10)
    assert got.shape == (47,) and (got.double() - ref[1, 3:50]).abs().max() <= tol
    ids_ = [5, 0, b.vocab_size - 1]
    assert (U.scores(v, fold, scaled=scaled, rows=ids_).double() - ref[:, ids_]).abs().max() <= tol
    assert (U.readout_rows(ids_, fold, scaled=scaled).double() - R[ids_]).abs().max() <= 1e-5
    with pytest.raises(BadInput):
        U.readout_rows(None)


def test_uncapped_logits_skip_only_the_softcap(tiny):
    _, _, b = tiny
    U = b.unembedding
    h = torch.randn(2, U.weight.shape[1])
    z = torch.nn.functional.linear(h.double(), U.weight.double(), None if U.bias is None else U.bias.double())
    got = U.logits(h, rows=[1, 2], capped=False).double()
    assert (got - U.logit_scale * z[:, [1, 2]]).abs().max() <= 1e-4
    assert (U.logits(h, rows=[1, 2]).double() - transform_logits(got.clone(), 1.0, U.softcap)).abs().max() <= 1e-4


def test_constant_plus_linear_part_is_the_models_uncapped_logit(tiny):
    """Unembedding.constant: with the final norm linearized at the actual stream x (its bias β), the
    model's own pre-softcap logits of chosen rows = readout_rows(no gain, scaled) @ linear part + constant
    (float64 oracle from the model's final norm and W_U; head bias, project_out's bias, LayerNorm bias)."""
    from vocablens.models.blocks import linearize_norm

    _, _, b = tiny
    U = b.unembedding
    with torch.no_grad():
        resid, _ = b.residual_stream(ids(1, 4))
        x = resid[-1, 0, 2]
        rows = [3, 0, b.vocab_size - 1]
        fl = linearize_norm(b.final_norm, x)
        got = U.readout_rows(rows, False, scaled=True).double() @ fl.linear(x).double() + U.constant(rows, fl.bias).double()
        h = U.normed(x[None])[0].double()
        z = h @ b.unembedding.weight.detach().double()[rows].T + (0 if b.unembedding.bias is None else b.unembedding.bias.detach().double()[rows])
        assert (got - b.logit_scale * z).abs().max() <= 1e-4 * max(1.0, float(z.abs().max()))
        with pytest.raises(BadInput):
            U.constant([b.vocab_size])
