"""``lens decompose``: a stream vector as nonnegative Jacobian-lens token directions (nonnegative OMP +
NNLS). Oracle: the directions built here from the model's own head and final-norm gain and the lens's
matrix (d_t = J_lᵀ (g ⊙ W_U[t])); a vector made of two of them is recovered with its coefficients."""

from __future__ import annotations

import json

import torch

import tiny_models as tm
from vocablens.lens.decompose import decompose, token_direction
from vocablens.lens.jacobian import JacobianLens
from vocablens.models import Borders


def _lens(b: Borders, seed: int = 0) -> JacobianLens:
    g = torch.Generator().manual_seed(seed)
    L, d = b.n_layers, b.d_model
    return JacobianLens(torch.eye(d) + 0.3 * torch.randn(L, d, d, generator=g), list(range(L)), L)


def test_two_directions_are_recovered_with_their_coefficients():
    model = tm.make_tiny("llama")
    b = Borders.from_model(model)
    jl = _lens(b)
    layer = 1
    R = model.lm_head.weight.detach().double() * model.model.norm.weight.detach().double()  # [V, d]
    D = R @ jl.J[layer].double()  # row t = (J_lᵀ r_t)ᵀ
    a, c = 7, 40
    h = 2.0 * D[a] + 0.5 * D[c]
    res = decompose(b, jl, layer, h.float(), k=5)
    got = dict(zip(res.ids.tolist(), res.coef.tolist()))
    assert set(got) == {a, c}
    assert abs(got[a] - 2.0) < 1e-4 and abs(got[c] - 0.5) < 1e-4
    assert res.fve > 1 - 1e-6 and res.residual_norm < 1e-3 * res.norm_h
    assert all(x >= 0 for x in res.coef.tolist())
    assert res.fve_path == sorted(res.fve_path)  # each step explains at least as much
    u = token_direction(b, jl, layer, a)
    assert torch.allclose(u.double(), D[a] / D[a].norm(), atol=1e-5)


def test_a_vector_against_every_direction_stops_at_once():
    b = Borders.from_model(tm.make_tiny("llama"))
    jl = _lens(b)
    R = b.unembedding.readout_rows(slice(0, b.real_vocab_size)).double()
    D = R @ jl.J[0].double()
    h = -D.sum(0)  # not guaranteed to be negative on every direction: the OMP picks only positive ones
    res = decompose(b, jl, 0, h.float(), k=3)
    assert len(res.ids) <= 3 and all(x > 0 for x in res.coef.tolist())
    assert 0.0 <= res.fve <= 1.0


def test_cli_decompose_json(tmp_path, capsys):
    from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

    d = save_tiny(tmp_path / "tiny", tiny_tokenizer())
    import vocablens

    m = vocablens.load(str(d))
    _lens(m.borders).save(tmp_path / "jl", dtype=torch.float32)
    code, out, err = run_cli(capsys, "lens", "decompose", "the class statement", "-m", d, "--layer", "1", "-k", "4",
                             "--lens", tmp_path / "jl", "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["layer"] == 1 and 1 <= len(rec["terms"]) <= 4 and 0 <= rec["fve"] <= 1
    assert rec["fve"] == rec["fve_path"][-1] or len(rec["fve_path"]) >= len(rec["terms"])
    code, out, err = run_cli(capsys, "lens", "decompose", "x", "-m", d, "--layer", "9", "--lens", tmp_path / "jl")
    assert code == 2 and "--layer must be a stream layer" in err
