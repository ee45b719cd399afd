"""vocablens.argmax: exact unargmaxable tokens (every certificate re-checked here in float64),
the final-norm reachability bounds and the softmax bottleneck."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial import ConvexHull

from vocablens.argmax import find_unargmaxable
from vocablens.argmax.bottleneck import softmax_bottleneck
from vocablens.argmax.norm import NormModel, norm_reachability, probe_norm
from vocablens.errors import BadInput, ShapeMismatch


# ------------------------------------------------------------------------------ independent checks
def check_certificates(W, bias, res, tokens=None):
    """Re-verify certificates in float64 from scratch; returns the number checked.

    argmaxable (and duplicate representatives that can tie): l_t(x) > l_j(x) for every other row in
    play (twins excluded for a representative). unargmaxable: weights >= 0 summing to 1 on other
    rows, ||w_t - sum mu w||_2 <= tol * scale and sum mu b >= b_t.
    """
    W64 = torch.as_tensor(W).double()
    b64 = None if bias is None else torch.as_tensor(bias).double()
    play = res.in_play
    scale = float((W64[play] - W64[play].mean(0)).norm(dim=1).max()) or 1.0
    V = W64.shape[0]
    toks = list(range(V)) if tokens is None else [int(t) for t in tokens]
    n = 0
    arg = [t for t in toks if int(res.verdict[t]) == 0
           or (int(res.verdict[t]) == 2 and not math.isnan(float(res.margin[t])))]
    for s in range(0, len(arg), 256):
        chunk = arg[s:s + 256]
        X = torch.stack([res.certificate_x(W, t) for t in chunk], 1)      # [d, k]
        LG = W64 @ X                                                        # [V, k] float64
        if b64 is not None:
            LG = LG + b64[:, None]
        for q, t in enumerate(chunk):
            other = play.clone()
            other[t] = False
            if int(res.verdict[t]) == 2:
                other &= res.group != res.group[t]
            if bool(other.any()):
                m = float(LG[t, q] - LG[other, q].max())
                assert m > 0, (t, m)
                assert m >= float(res.margin[t]) * (1 - 1e-6) - 1e-9, (t, m, float(res.margin[t]))
            n += 1
    for t in toks:
        if int(res.verdict[t]) == 1:
            ids, w = res.combination(t)
            assert t not in ids.tolist()
            assert bool((w >= 0).all()) and abs(float(w.sum()) - 1) < 1e-9
            assert bool(play[ids].all())
            r = float((W64[ids].T @ w - W64[t]).norm())
            assert r <= res.tol * scale + 1e-300, (t, r)
            assert abs(r - float(res.residual[t])) <= 1e-12 * scale + 1e-9 * r
            if b64 is not None:
                assert float(b64[ids] @ w) >= float(b64[t]) - 1e-9 * (1 + abs(float(b64[t])))
            n += 1
    return n


def planted(V=1500, d=24, n_planted=6, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d)) + offset
    pl = rng.choice(V, n_planted, replace=False)
    mean = W.mean(0)
    for p in pl:
        a, b = rng.choice(V, 2, replace=False)
        # strictly inside: halfway between the midpoint of two rows and the centroid
        W[p] = 0.5 * (W[a] + W[b]) / 2 + 0.5 * mean
    return torch.from_numpy(W.astype(np.float32)), sorted(pl.tolist())


def lp_reference(W, bias, i):
    """Brute-force LP over all V-1 constraints: strict argmaxability of row i (Motzkin)."""
    from scipy.optimize import linprog

    W = np.asarray(W, dtype=np.float64)
    V, d = W.shape
    b = np.zeros(V) if bias is None else np.asarray(bias, dtype=np.float64)
    others = [j for j in range(V) if j != i]
    D = W[others] - W[i]
    A = np.hstack([D, (b[others] - b[i])[:, None], np.ones((len(others), 1))])
    c = np.zeros(d + 2)
    c[-1] = -1
    bounds = [(-1, 1)] * d + [(0, 1 if bias is not None else 0), (None, 1)]
    r = linprog(c, A_ub=A, b_ub=np.zeros(len(others)), bounds=bounds, method="highs")
    assert r.status == 0
    return r.x[-1] > 1e-9


# ------------------------------------------------------------------------------ planted cases
def test_planted_interior_rows_found_and_nothing_else():
    W, pl = planted()
    res = find_unargmaxable(W)
    assert sorted(res.ids("unargmaxable").tolist()) == pl
    c = res.counts()
    assert c == {"argmaxable": 1500 - 6, "unargmaxable": 6, "duplicate": 0, "undecided": 0,
                 "padding": 0, "untrained": 0}
    assert check_certificates(W, None, res) == 1500
    assert res.settled["gemm"] + res.settled["reflect"] + res.settled["proof"] == 1500
    assert all(res.timings[s] >= 0 for s in ("prepare", "gemm", "reflect", "proof", "verify"))


def test_planted_with_offset_and_verify_all():
    # d = 8, V = 250: Gaussian rows are not all vertices; every verdict is checked by a full LP
    W, pl = planted(V=250, d=8, n_planted=4, seed=3, offset=2.0)
    res = find_unargmaxable(W, verify="all")
    flagged = set(res.ids("unargmaxable").tolist())
    assert flagged >= set(pl) and len(flagged) > len(pl)
    assert all((int(res.verdict[t]) == 0) == lp_reference(W.numpy(), None, t) for t in range(250))
    assert res.verified_f64 == 250 - len(flagged)
    check_certificates(W, None, res)


@pytest.mark.parametrize("d,seed", [(2, 0), (3, 1), (3, 2)])
def test_low_dimension_matches_convex_hull(d, seed):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((300, d))
    hull = ConvexHull(W)
    res = find_unargmaxable(torch.from_numpy(W))
    assert set(res.ids("argmaxable").tolist()) == set(hull.vertices.tolist())
    assert res.counts()["unargmaxable"] == 300 - len(hull.vertices)
    check_certificates(W, None, res)


def test_low_dimension_with_bias_matches_upper_hull():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((200, 2))
    b = rng.standard_normal(200)
    hull = ConvexHull(np.hstack([W, b[:, None]]))
    upper = set()
    for simplex, eq in zip(hull.simplices, hull.equations):
        if eq[2] > 1e-12:          # facet whose outward normal points up: its vertices win somewhere
            upper.update(simplex.tolist())
    res = find_unargmaxable(torch.from_numpy(W), torch.from_numpy(b))
    assert set(res.ids("argmaxable").tolist()) == upper
    check_certificates(W, b, res)
    # bias can only rescue tokens
    nob = find_unargmaxable(torch.from_numpy(W))
    assert set(nob.ids("argmaxable").tolist()) <= upper
    assert len(upper) > len(nob.ids("argmaxable"))


def test_bias_against_brute_force_lp():
    W, pl = planted(V=400, d=8, n_planted=8, seed=7)
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(400).astype(np.float32)) * 0.5
    res = find_unargmaxable(W, b)
    lifted = (res.stage == 4).nonzero().flatten().tolist()       # decided by the lifted LP
    rescued = [t for t in lifted if int(res.verdict[t]) == 0]
    assert set(pl) <= set(lifted) and rescued                     # the bias rescues some rows
    for t in lifted:
        assert (int(res.verdict[t]) == 0) == lp_reference(W.numpy(), b.numpy(), t)
    assert res.counts()["undecided"] == 0
    assert res.settled["bias"] == len(lifted) > res.counts()["unargmaxable"]
    check_certificates(W, b, res)


def test_one_dimensional_rows():
    W = torch.tensor([[-2.0], [0.5], [3.0], [1.0], [-1.0]])
    for _ in range(10):   # regression: torch._int_mm is wrong for one-column int8 blocks
        res = find_unargmaxable(W)
        assert res.ids("argmaxable").tolist() == [0, 2], (res.counts(), res.reasons)
        assert res.counts()["unargmaxable"] == 3, (res.counts(), res.reasons)
    assert res.ids("unargmaxable").tolist() == [1, 3, 4]
    check_certificates(W, None, res)
    # with bias, d = 1: w = (-1, 0, 1), b = (0, -1, 0) — the lifted-hull vertex (0, -1) never wins
    res = find_unargmaxable(torch.tensor([[-1.0], [0.0], [1.0]]), torch.tensor([0.0, -1.0, 0.0]))
    assert res.ids("unargmaxable").tolist() == [1]
    res = find_unargmaxable(torch.tensor([[-1.0], [0.0], [1.0]]), torch.tensor([0.0, 0.5, 0.0]))
    assert res.ids("argmaxable").tolist() == [0, 1, 2]
    check_certificates(torch.tensor([[-1.0], [0.0], [1.0]]), torch.tensor([0.0, 0.5, 0.0]), res)


# ------------------------------------------------------------------------------ duplicates, zero rows
def test_duplicates_are_their_own_category():
    W, pl = planted(V=600, d=12, n_planted=2, seed=11)
    W = W.clone()
    W[10] = W[20]          # a vertex duplicated: can tie for first
    W[30] = W[pl[0]]       # an interior row duplicated: cannot even tie
    W[40] = -0.0 * W[40]   # -0.0 and +0.0 are the same row
    W[41] = 0.0 * W[41]
    res = find_unargmaxable(W)
    c = res.counts()
    assert set(res.ids("duplicate").tolist()) >= {10, 20, 30, pl[0]}
    assert int(res.group[10]) == int(res.group[20]) != -1
    assert res.group_can_tie[int(res.group[10])] is True
    assert res.group_can_tie[int(res.group[30])] is False
    assert int(res.group[40]) == int(res.group[41]) != -1
    assert c["duplicate"] == 6 and c["undecided"] == 0
    check_certificates(W, None, res)


def test_duplicates_with_bias():
    W = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    b = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    res = find_unargmaxable(W, b)
    assert int(res.verdict[0]) == 1 and float(res.residual[0]) == 0.0   # beaten by its twin's bias
    assert res.ids("duplicate").tolist() == [1, 2]
    assert res.group_can_tie[int(res.group[1])] is True
    b2 = torch.tensor([0.0, 0.5, 0.25, 0.0, 0.0, 0.0])
    res2 = find_unargmaxable(W, b2)
    assert res2.ids("argmaxable").tolist() == [1, 3, 4, 5]
    assert res2.ids("unargmaxable").tolist() == [0, 2]
    check_certificates(W, b2, res2)


def test_zero_row_depends_on_where_the_origin_is():
    W, _ = planted(V=600, d=24, n_planted=0, seed=4)
    W = W.clone()
    W[0] = 0.0
    res = find_unargmaxable(W)
    assert res.ids("unargmaxable").tolist() == [0]          # centred data: origin inside the hull
    check_certificates(W, None, res)
    W2 = W + 3.0
    W2[0] = 0.0
    res2 = find_unargmaxable(W2)
    assert int(res2.verdict[0]) == 0                        # offset data: the origin is a vertex
    check_certificates(W2, None, res2)


def test_padding_and_untrained_excluded_by_default():
    W, pl = planted(V=300, d=16, n_planted=1, seed=2)
    W = torch.cat([W, (3 * W[5]).repeat(4, 1)])             # 4 identical rows beyond row 5
    pad = torch.zeros(304, dtype=torch.bool)
    pad[300:] = True
    res = find_unargmaxable(W, padding=pad)
    assert res.counts()["padding"] == 4
    assert res.ids("unargmaxable").tolist() == pl
    assert not bool(res.in_play[300:].any())
    check_certificates(W, None, res)
    inc = find_unargmaxable(W, padding=pad, include_padding=True)
    assert inc.counts()["padding"] == 0 and inc.counts()["duplicate"] == 4
    # the padding rows now steal: row 5 = (1/3) pad + (2/3) (a point near the centroid)
    assert int(res.verdict[5]) == 0 and int(inc.verdict[5]) == 1
    check_certificates(W, None, inc)
    un = torch.zeros(304, dtype=torch.bool)
    un[7] = True
    res3 = find_unargmaxable(W, padding=pad, untrained=un)
    assert res3.counts()["untrained"] == 1 and int(res3.verdict[7]) == 5


def test_exact_int_matmul_on_awkward_shapes():
    from vocablens.argmax.certificates import exact_int_matmul as _exact_int_matmul

    g = torch.Generator().manual_seed(0)
    for n, r in [(5, 1), (17, 1), (9, 2), (40, 3), (70, 13), (130, 64)]:
        Q = torch.randint(-127, 128, (n, r), generator=g, dtype=torch.int8)
        f = _exact_int_matmul(Q)
        assert torch.equal(f(Q[:7], Q).long(), Q[:7].long() @ Q.long().T)


# ------------------------------------------------------------------------------ bad input
def test_bad_input_messages():
    W = torch.randn(10, 4)
    W[3, 1] = float("nan")
    W[7, 0] = float("inf")
    with pytest.raises(BadInput, match=r"2 row\(s\) with NaN or inf \(ids \[3, 7\]"):
        find_unargmaxable(W)
    with pytest.raises(ShapeMismatch, match="matrix"):
        find_unargmaxable(torch.randn(5))
    with pytest.raises(ShapeMismatch, match="at least one row"):
        find_unargmaxable(torch.zeros(0, 3))
    with pytest.raises(ShapeMismatch, match="bias must have shape"):
        find_unargmaxable(torch.randn(5, 2), torch.zeros(4))
    with pytest.raises(BadInput, match="bias has 1 NaN"):
        find_unargmaxable(torch.randn(5, 2), torch.tensor([0, 0, float("nan"), 0, 0]))
    with pytest.raises(BadInput, match="verify"):
        find_unargmaxable(torch.randn(5, 2), verify="some")


def test_single_row_and_all_zero_matrix():
    res = find_unargmaxable(torch.randn(1, 7))
    assert res.counts()["argmaxable"] == 1 and math.isinf(float(res.margin[0]))
    res = find_unargmaxable(torch.zeros(6, 3))
    assert res.counts()["duplicate"] == 6
    assert res.group_can_tie == {0: True}                    # all logits are equal: all tie
    res = find_unargmaxable(torch.zeros(6, 3), torch.tensor([0.0, 1, 0, 0, 0, 0]))
    assert res.ids("argmaxable").tolist() == [1] and res.counts()["unargmaxable"] == 5


def test_rank_deficient_rows():
    rng = np.random.default_rng(9)
    B = rng.standard_normal((3, 10))
    C = rng.standard_normal((200, 3))
    W = C @ B                                                 # rank 3 in d = 10
    res = find_unargmaxable(torch.from_numpy(W))
    hull = ConvexHull(C)
    assert res.rank == 3
    assert set(res.ids("argmaxable").tolist()) == set(hull.vertices.tolist())
    check_certificates(W, None, res)


def test_interrupt_reports_undecided(monkeypatch):
    W, _ = planted(V=300, d=6, n_planted=2, seed=1)

    def stop(stage, done, total):
        if stage == "gemm":
            raise KeyboardInterrupt

    res = find_unargmaxable(W, progress=stop)
    assert res.interrupted
    assert res.counts()["undecided"] == 300
    assert set(res.reasons.values()) == {"interrupted"}


# ------------------------------------------------------------------------------ final norm
def test_probe_norm_rmsnorm_and_layernorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    rms = LlamaRMSNorm(16, eps=1e-6)
    rms.weight.data = torch.rand(16, generator=g) + 0.5
    m = probe_norm(rms, 16)
    assert m.kind == "rmsnorm" and not m.centred
    assert torch.allclose(m.gain, rms.weight.double(), atol=1e-5)
    assert float(m.shift.abs().max()) == 0.0 and m.radius == 4.0
    ln = torch.nn.LayerNorm(16)
    ln.weight.data = torch.rand(16, generator=g) + 0.5
    ln.bias.data = torch.randn(16, generator=g)
    m2 = probe_norm(ln, 16)
    assert m2.kind == "layernorm" and m2.centred
    assert torch.allclose(m2.gain, ln.weight.data.double(), atol=1e-5)
    assert torch.allclose(m2.shift, ln.bias.data.double(), atol=1e-6)
    assert probe_norm(torch.nn.Linear(16, 16), 16) is None


def test_norm_reachability_two_tokens_closed_form():
    # l0 = 3 u1 - 10, l1 = 0 on ||u|| <= sqrt(2): p0* = sigmoid(3 sqrt(2) - 10)
    W = torch.tensor([[3.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    b = torch.tensor([-10.0, 0.0, -1e9])
    model = NormModel(gain=torch.ones(2, dtype=torch.float64), shift=torch.zeros(2, dtype=torch.float64),
                      radius=math.sqrt(2), centred=False, kind="rmsnorm", max_error=0.0)
    r = norm_reachability(W, [0, 1], model, bias=b, iters=300)
    p_star = 1 / (1 + math.exp(-(3 * math.sqrt(2) - 10)))
    assert float(r.p_lower[0]) <= p_star * (1 + 1e-9)
    assert float(r.p_upper[0]) >= p_star * (1 - 1e-9)
    assert abs(float(r.p_lower[0]) - p_star) < 1e-3 * p_star
    assert abs(float(r.p_upper[0]) - p_star) < 1e-2 * p_star
    assert int(r.argmaxable[0]) == 0                      # argmaxable in theory, not on this ball
    assert int(r.argmaxable[1]) == 1
    assert float(r.u[0].norm()) <= math.sqrt(2) * (1 + 1e-9)
    # unconstrained, token 0 is argmaxable (x large along e1)
    assert int(find_unargmaxable(W[:2], b[:2]).verdict[0]) == 0


# ------------------------------------------------------------------------------ bottleneck
def test_bottleneck_ranks_on_known_matrices():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(300, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 12, generator=g, dtype=torch.float64)
    H = torch.randn(40, 12, generator=g, dtype=torch.float64)
    b = softmax_bottleneck(W, H)
    assert b.rank_W == 5 and b.rank_A == 6 and b.bound_A == 13
    full = softmax_bottleneck(torch.randn(300, 12, generator=g), torch.randn(40, 12, generator=g))
    assert full.rank_W == 12 and full.rank_A == 13
    assert abs(full.share_W[1] - float(full.sigma_W[0] ** 2 / (full.sigma_W ** 2).sum())) < 1e-12
    with_b = softmax_bottleneck(torch.randn(300, 12, generator=g), torch.randn(40, 12, generator=g),
                                bias=torch.randn(300, generator=g))
    assert with_b.rank_A <= 14 and with_b.bound_A == 14
    with pytest.raises(ShapeMismatch):
        softmax_bottleneck(W, torch.randn(4, 3))


# ------------------------------------------------------------------------------ the real default model
@pytest.fixture(scope="module")
def smol_argmax(smollm2):
    from vocablens.argmax.model import argmax_for_borders

    return argmax_for_borders(smollm2.borders, norm_tokens=12)


SMOL_DUPLICATES = [[5, 9, 11, 36743], [7, 45175], [8, 10, 13, 15, 16, 36744, 48047], [12, 14]]


@pytest.mark.slow
def test_real_default_model(smollm2, smol_argmax):
    ma = smol_argmax
    res = ma.result
    # recorded: every distinct row of SmolLM2-135M's head is argmaxable; 15 rows in 4 exact-duplicate
    # groups (unused special tokens and glitch merges) can only tie
    assert res.counts() == {"argmaxable": 49137, "unargmaxable": 0, "duplicate": 15, "undecided": 0,
                            "padding": 0, "untrained": 0}
    assert res.n_unique == 49141 and res.rank == 576 and ma.bias_mode == "off"
    from vocablens.render.argmax import duplicate_groups

    groups = duplicate_groups(ma)
    assert [g["ids"] for g in groups] == SMOL_DUPLICATES and all(g["can_tie"] for g in groups)
    assert res.settled["gemm"] > 48000
    assert res.settled["gemm"] + res.settled["reflect"] + res.settled["proof"] == 49141
    W = smollm2.borders.unembedding.weight.detach()
    # float64 re-check: all certificates after stage 1, the 100 smallest margins, 200 at random,
    # and the duplicate representatives
    later = (res.stage >= 2).nonzero().flatten().tolist()
    small = torch.argsort(torch.nan_to_num(res.margin, nan=math.inf))[:100].tolist()
    rnd = torch.randperm(49152, generator=torch.Generator().manual_seed(0))[:200].tolist()
    toks = sorted(set(later + small + rnd + [5, 7, 8, 12]))
    assert check_certificates(W, None, res, toks) == len(toks)
    # the final norm (RMSNorm): duplicates cannot reach 1/2, borderline tokens can win
    r = ma.reach
    assert r is not None and r.model.kind == "rmsnorm"
    dup_rows = [q for q, t in enumerate(r.tokens.tolist()) if int(res.verdict[t]) == 2]
    assert dup_rows and all(int(r.argmaxable[q]) == 0 and float(r.p_upper[q]) < 0.5 for q in dup_rows)
    assert bool((r.p_lower <= r.p_upper + 1e-12).all())
    arg_rows = [q for q, t in enumerate(r.tokens.tolist()) if int(res.verdict[t]) == 0]
    assert arg_rows and all(int(r.argmaxable[q]) == 1 for q in arg_rows)


@pytest.mark.slow
def test_cli_argmax_json(smollm2, smol_argmax, capsys, monkeypatch):
    import vocablens.argmax.model as model_mod
    import vocablens.cli.argmax as cli_mod
    from vocablens.cli.common import run_app

    monkeypatch.setattr(cli_mod, "load_model", lambda *a, **k: smollm2)
    monkeypatch.setattr(model_mod, "argmax_for_borders", lambda *a, **k: smol_argmax)
    assert run_app(["argmax", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["counts"]["duplicate"] == 15 and d["counts"]["unargmaxable"] == 0
    assert d["duplicates"][0]["tokens"] == ["<file_sep>", "<issue_comment>", "<jupyter_start>", "PlaneProtection"]
    assert set(d["timings_s"]) >= {"prepare", "gemm", "reflect", "proof", "bias", "verify", "total"}
    assert len(d["per_token"]["verdict"]) == 49152
    assert d["norm"]["kind"] == "rmsnorm"
    assert run_app(["argmax"]) == 0
    text = capsys.readouterr().out
    assert "exact duplicate rows" in text and "<jupyter_text>" in text
    assert run_app(["argmax", "--bias", "sometimes"]) == 2
    assert "--bias must be auto, on or off" in capsys.readouterr().err
    monkeypatch.undo()
    from vocablens.argmax.model import argmax_for_borders

    with pytest.raises(BadInput, match="no bias"):              # the head has no bias
        argmax_for_borders(smollm2.borders, bias="on")
    from vocablens.render.argmax import argmax_section

    sec = argmax_section(smol_argmax, smollm2.tokenizer)
    assert sec.id == "argmax" and "&lt;file_sep&gt;" in sec.html


@pytest.mark.slow
def test_cli_bottleneck_real_contexts(smollm2, capsys, monkeypatch, tmp_path):
    import vocablens.cli.argmax as cli_mod
    from vocablens.cli.common import run_app
    from vocablens.render.bottleneck import bottleneck_section

    monkeypatch.setattr(cli_mod, "load_model", lambda *a, **k: smollm2)
    plot = tmp_path / "spectra.html"
    assert run_app(["bottleneck", "--json", "--contexts", "600", "--seq-len", "120", "--plot", str(plot)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rank_W"] == 576 and d["n_contexts"] == 600
    assert d["rank_logprobs"] == 577 == d["rank_bound"]        # d + 1 for a head without bias
    assert abs(d["stable_rank_W"] - 2.0014) < 1e-3
    assert plot.exists() and "plotly" in plot.read_text()[:20000].lower()
    assert run_app(["bottleneck", "--contexts", "600", "--plot", str(plot)]) == 2   # no overwrite
    assert run_app(["bottleneck", "--contexts", "100"]) == 2
    W = smollm2.borders.unembedding.weight.detach()
    sec = bottleneck_section(softmax_bottleneck(W[:2000]))
    assert sec.id == "bottleneck" and "bottleneck-spectra" in sec.html


# ------------------------------------------------------------------------------ budgets, scale, memory
def test_zero_budget_leaves_every_row_undecided():
    W, _ = planted(V=400, d=8, n_planted=2, seed=1)
    res = find_unargmaxable(W, time_budget_s=0)
    assert res.counts()["undecided"] == 400
    assert set(res.reasons.values()) == {"budget"}
    assert res.cut_short[0] == "prepare" and res.budget_s == 0
    with pytest.raises(BadInput, match="time_budget_s"):
        find_unargmaxable(W, time_budget_s=-1)


def test_budget_is_kept_inside_every_stage_and_never_guesses():
    # the budget is checked once per block inside every stage (prepare included), so a run ends
    # within about a block of its budget; whatever it decided agrees with the unbudgeted run
    import time as _time

    W, pl = planted(V=6000, d=24, n_planted=8, seed=2)
    full = find_unargmaxable(W)
    assert set(pl) <= set(full.ids("unargmaxable").tolist())
    seen_cuts = set()
    threads = torch.get_num_threads()
    for budget in (0.005, 0.05, 0.3, 1.0):
        c0 = _time.process_time()
        res = find_unargmaxable(W, time_budget_s=budget)
        cpu = _time.process_time() - c0
        # CPU seconds, not wall: until the (wall) deadline the run can use at most `threads` CPU-s per
        # second, after it at most a block's work; a loaded machine stretches the wall time (a wall
        # bound failed at load 13: 4.5 s for a 0.3 s budget) but not the work done
        assert cpu <= threads * (1.1 * budget + 2.0), (budget, cpu)
        und = res.verdict == 3
        assert torch.equal(res.verdict[~und], full.verdict[~und]), budget
        if res.cut_short:
            seen_cuts.add(res.cut_short[0])
            assert all(res.reasons[int(t)] == "budget" for t in und.nonzero().flatten())
        check_certificates(W, None, res, tokens=torch.nonzero(~und).flatten()[::7])
    assert "prepare" in seen_cuts or "gemm" in seen_cuts


def test_budget_cut_after_the_certificates_never_guesses():
    import time as _time

    W, pl = planted(V=1500, d=24, n_planted=6, seed=0)
    t_start = _time.perf_counter()

    def slow(stage, done, total):        # the budget runs out right after the all-pairs stage
        if stage == "gemm" and done == total:   # (reached in ~0.05 s: 1,500 x 24)
            _time.sleep(max(0.0, t_start + 5.5 - _time.perf_counter()))

    res = find_unargmaxable(W, time_budget_s=5.0, progress=slow)
    assert res.cut_short[:2] == ("reflect", "proof")
    und = set(res.ids("undecided").tolist())
    assert und >= set(pl) and all(res.reasons[t] == "budget" for t in und)
    assert res.counts()["unargmaxable"] == 0                      # nothing decided without proof
    assert res.settled["gemm"] == 1500 - len(und)
    full = find_unargmaxable(W)
    decided = [t for t in range(1500) if t not in und]
    assert all(int(res.verdict[t]) == int(full.verdict[t]) for t in decided)
    check_certificates(W, None, res)


def test_row_budget_ends_in_undecided():
    W, _ = planted(V=250, d=8, n_planted=4, seed=3, offset=2.0)
    ref = find_unargmaxable(W, reflect_iters=0)
    res = find_unargmaxable(W, reflect_iters=0, row_budget_s=0.0)
    why = [r for r in res.reasons.values() if r.startswith("row budget")]
    assert why and res.counts()["undecided"] == len(why)
    for t in range(250):                       # every decided verdict agrees with the full run
        if int(res.verdict[t]) != 3:
            assert int(res.verdict[t]) == int(ref.verdict[t])
    check_certificates(W, None, res)


def test_planted_rows_get_short_certificates_through_shared_means():
    W, pl = planted(V=1500, d=24, n_planted=6, seed=0)
    res = find_unargmaxable(W)
    assert sorted(res.combo_mean) == pl                 # the sparse path proved every planted row
    for t in pl:
        ids, w = res.combination(t)
        assert t not in ids.tolist() and abs(float(w.sum()) - 1) < 1e-12
        assert len(res.combos[t][0]) <= 32              # explicit part: the few rows it sits between
    assert res.counts()["unargmaxable"] == 6 and int(res.ids("undecided").numel()) == 0


def test_exact_int_matmul_wide_rows_are_split_exactly():
    from vocablens.argmax.kernels import fp32_exact_mm as _fp32_exact_mm

    g = torch.Generator().manual_seed(1)
    Q = torch.full((6, 2100), 127, dtype=torch.int8)         # 127^2 * 2100 > 2^24: one float32 GEMM rounds
    Q[3:] = torch.randint(-127, 128, (3, 2100), generator=g, dtype=torch.int8)
    f = _fp32_exact_mm(2100)
    assert torch.equal(f(Q, Q).long(), Q.long() @ Q.long().T)


def test_tiny_blocks_give_the_same_verdicts_and_bounds(monkeypatch):
    # every block shrunk to a few KiB, so block edges fall everywhere: dedupe and whitening by ~20
    # rows, the all-pairs product by 256 x 256, reflect and proofs one column at a time, verify's
    # own and twin rows masked across row blocks, the norm rows W' made by blocks (whole and
    # gathered); verdicts equal to the default blocks', certificates valid
    import vocablens.argmax.certificates as cert
    import vocablens.argmax.norm as nm
    import vocablens.argmax.blocks as blocks

    W, pl = planted(V=900, d=24, n_planted=5, seed=3)
    W[1] = W[0]
    b = torch.from_numpy(np.random.default_rng(2).standard_normal(900).astype(np.float32)) * 0.01
    g = torch.Generator().manual_seed(5)
    model = NormModel(gain=torch.rand(24, generator=g, dtype=torch.float64) + 0.5,
                      shift=torch.randn(24, generator=g, dtype=torch.float64) * 0.1, radius=24 ** 0.5,
                      centred=True, kind="layernorm", max_error=0.0)
    comp = torch.ones(900, dtype=torch.bool)
    comp[::7] = False
    toks = pl[:3] + [20, 21, 22]

    def run():
        res = {k: find_unargmaxable(W, bias, verify="all", block=256) for k, bias in (("nb", None), ("b", b))}
        reach = [norm_reachability(W, toks, model, bias=b, competitors=c, logit_scale=1.5, iters=40)
                 for c in (None, comp)]
        return res, reach

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # hundreds of tiny products: no thread wake-ups
    try:
        ref, ref_reach = run()
        monkeypatch.setattr(blocks, "BLOCK_BYTES", 4096)
        monkeypatch.setattr(cert, "GEMM_BYTES", 4096)
        monkeypatch.setattr(nm, "NORM_BLOCK_BYTES", 2048)
        got, got_reach = run()
    finally:
        torch.set_num_threads(threads)
    for k, bias in (("nb", None), ("b", b)):
        assert torch.equal(got[k].verdict, ref[k].verdict), k
        assert got[k].ids("unargmaxable").tolist() == ref[k].ids("unargmaxable").tolist()
        assert got[k].counts()["undecided"] == 0 and got[k].verified_f64 >= 899 - 5
        assert check_certificates(W, bias, got[k]) >= 899
    assert sorted(got["nb"].ids("unargmaxable").tolist()) == pl
    for r0, r1 in zip(ref_reach, got_reach):
        assert torch.equal(r0.argmaxable, r1.argmaxable)
        for f in ("p_lower", "p_upper", "margin_lower", "margin_upper"):
            assert torch.allclose(getattr(r0, f), getattr(r1, f), rtol=1e-9, atol=1e-12), f


_MEMORY_SCRIPT = r"""
import json, resource, sys
import numpy as np, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from test_argmax import planted
from vocablens.argmax import find_unargmaxable
V, d, n_pl, cap_mb = (int(a) for a in sys.argv[2:6])
W, pl = planted(V=V, d=d, n_planted=n_pl, seed=0)
W[1] = W[0]                                     # a duplicate pair: settled in stage prepare
b = torch.from_numpy(np.random.default_rng(1).standard_normal(V).astype(np.float32)) * 0.01
for bias in (None, b):                          # warm up every code path's libraries
    find_unargmaxable(W[:400], None if bias is None else bias[:400])
vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + cap_mb * 2 ** 20, resource.RLIM_INFINITY))
out = {"planted": pl}
for name, bias in (("nobias", None), ("bias", b)):
    r = find_unargmaxable(W, bias)
    out[name] = {"settled": r.settled, "timings": r.timings, "counts": r.counts(),
                 "unarg": r.ids("unargmaxable").tolist(), "cut": list(r.cut_short)}
print("OK " + json.dumps(out))
"""


def test_scan_memory_stays_linear_in_V_under_an_address_space_cap(tmp_path):
    # 12,000 x 32 rows with 12 planted interior rows and a duplicate pair, without and with a bias,
    # under an address-space cap of 150 MiB over the process's own baseline (every transient is one
    # block of 16-32 MiB: the scan needs about 110 MiB here, 140 MiB before the blocks were capped
    # by bytes): the scores of all pairs at once would need 576 MB in float32 (V^2 order); every
    # stage must be reached and settle its share (prepare: the twins; gemm: most rows; reflect: the
    # near misses; proof: the planted rows, through the screen without bias; bias: the lifted LPs;
    # verify: re-checks).
    import os
    import subprocess
    import sys

    script = tmp_path / "mem.py"
    script.write_text(_MEMORY_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MALLOC_ARENA_MAX="2", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script), os.path.dirname(__file__), "12000", "32", "12", "150"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads([l for l in out.stdout.splitlines() if l.startswith("OK ")][0][3:])
    nb, wb = got["nobias"], got["bias"]
    assert nb["unarg"] == got["planted"] and nb["counts"]["duplicate"] == 2 and not nb["cut"]
    assert nb["counts"]["argmaxable"] == 12000 - 14 and nb["counts"]["undecided"] == 0
    for stage in ("prepare", "gemm", "reflect", "proof", "verify"):
        assert nb["settled"][stage] > 0, stage
    assert nb["settled"]["gemm"] > 11000 and nb["settled"]["proof"] >= 12     # the planted rows and near misses
    # with a bias: the lower-bias twin is dominated in prepare, the planted rows go through the
    # NNLS proofs (no bias) to the lifted LP of stage bias
    b = np.random.default_rng(1).standard_normal(12000).astype(np.float32)[:2]
    loser = 0 if b[0] < b[1] else 1                          # the twin with the smaller bias
    assert wb["unarg"] == sorted(set(got["planted"]) | {loser}) and wb["counts"]["undecided"] == 0
    assert wb["settled"]["prepare"] == 1 and wb["settled"]["bias"] == 12 and not wb["cut"]
    for stage in ("prepare", "gemm", "reflect", "proof", "bias", "verify"):
        assert wb["timings"][stage] > 0, stage


class _NamedTokenizer:
    """The few tokenizer methods argmax reads: ids 90..95 are reserved special tokens."""

    def __init__(self, V):
        self.names = [f"tok{i}" for i in range(V - 6)] + [f"<|reserved_special_token_{k}|>" for k in range(6)]

    def __len__(self):
        return len(self.names)

    def convert_ids_to_tokens(self, ids):
        return [self.names[i] for i in ids] if isinstance(ids, list) else self.names[ids]

    def decode(self, ids, **kw):
        return "".join(self.names[i] for i in ids)


def test_reserved_tokens_are_their_own_group_and_the_cli_budget(capsys, monkeypatch):
    import types

    import vocablens.cli.argmax as cli_mod
    from tiny_models import make_tiny
    from vocablens.argmax.model import RESERVED_NAME, argmax_for_borders
    from vocablens.cli.common import run_app
    from vocablens.models import Borders
    from vocablens.render.argmax import argmax_to_dict

    for name in ("<|reserved_special_token_12|>", "<unused17>", "[unused3]", "<reserved_5>"):
        assert RESERVED_NAME.match(name), name
    for name in ("reserved", "<|endoftext|>", "unused", "<unk>", "Ġunused3"):
        assert not RESERVED_NAME.match(name), name
    b = Borders.from_model(make_tiny("llama"))
    V = b.vocab_size
    tok = _NamedTokenizer(V)
    ma = argmax_for_borders(b, tokenizer=tok, norm=False)
    assert ma.reserved.tolist() == list(range(V - 6, V))
    d = argmax_to_dict(ma, tok)
    ref = find_unargmaxable(b.unembedding.weight.detach())
    assert d["reserved"]["count"] == 6 and d["reserved"]["first_id"] == V - 6
    assert d["reserved"]["counts"]["argmaxable"] == sum(int(ref.verdict[t]) == 0 for t in range(V - 6, V))
    assert ma.result.verdict.tolist() == ref.verdict.tolist()      # deferring changes no verdict
    from vocablens.render.argmax import argmax_section

    cut = argmax_for_borders(b, tokenizer=tok, time_budget_s=0)
    assert cut.norm_note.startswith("skipped") and cut.result.cut_short
    html = argmax_section(cut, tok).html
    assert "Cut short" in html and "vocablens argmax" in html and "Reserved / unused special tokens" in html
    from vocablens import Model

    lm = Model(b.model, tok, b, types.SimpleNamespace(to_dict=lambda: {}))  # the CLI reads the handle
    monkeypatch.setattr(cli_mod, "load_model", lambda *a, **k: lm)
    assert run_app(["argmax", "--json", "--budget", "0.000001", "--no-norm"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["cut_short"] and j["counts"]["undecided"] == V
    assert {x["reason"] for x in j["undecided"]} == {"budget"}
    assert j["reserved"]["counts"]["undecided"] == 6 and len(j["reserved"]["undecided"]) == 6
    assert run_app(["argmax", "--budget", "-1"]) == 2
    assert "--budget must be" in capsys.readouterr().err


_DIST_SCRIPT = r"""
import json, sys, types
import numpy as np, torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from test_argmax import planted
from vocablens.argmax import find_unargmaxable
dist.init_process_group("gloo")
W, _ = planted(V=250, d=8, n_planted=4, seed=3, offset=2.0)
b = torch.from_numpy(np.random.default_rng(1).standard_normal(250).astype(np.float32)) * 0.5
out = {}
for name, bias in (("nobias", None), ("bias", b)):
    r = find_unargmaxable(W, bias, block=64, row_budget_s=None)
    out[name] = {"verdict": r.verdict.tolist(), "settled": r.settled, "n_combos": len(r.combos)}
import vocablens.argmax.preparation as prep
import vocablens.argmax.blocks as blocks
blocks.BLOCK_BYTES = 512         # 16-row whitening blocks: both ranks whiten a share, then all-reduce
calls, inner = [], prep._sum_over_ranks
prep._sum_over_ranks = lambda t, size, op="sum": (calls.append((tuple(t.shape), op)), inner(t, size, op))
r = find_unargmaxable(W, None, block=64, row_budget_s=None)
out["split"] = {"verdict": r.verdict.tolist(), "calls": calls}
import vocablens.argmax.certificates as cert
prep._sum_over_ranks = inner
# the ranks' kernels differ (each times its own): exact products as int32 on rank 0, float32 on rank 1
out_dtype = torch.int32 if dist.get_rank() == 0 else torch.float32
_products = types.SimpleNamespace(align=1, kind="test",
                                  mm=lambda A, a, b: (A.double() @ _Q[a:b].double().T).to(out_dtype))
def _fake(Q, device="cpu"):
    global _Q
    _Q = Q
    return _products
cert.exact_products = _fake
r = find_unargmaxable(W, None, block=64, row_budget_s=None)
out["mixed"] = {"verdict": r.verdict.tolist()}
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(out))
dist.barrier()  # no rank tears down its gloo pairs while another still uses them
dist.destroy_process_group()
"""


def test_two_ranks_with_gloo_give_the_single_process_verdicts(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "dist.py"
    script.write_text(_DIST_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    import socket

    with socket.socket() as sock:        # a free port: a fixed one can meet another run of this test
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(port), str(script), os.path.dirname(__file__)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads([l for l in out.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    W, _ = planted(V=250, d=8, n_planted=4, seed=3, offset=2.0)
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(250).astype(np.float32)) * 0.5
    for name, bias in (("nobias", None), ("bias", b)):
        ref = find_unargmaxable(W, bias, block=64, row_budget_s=None)     # no wall-clock limit: deterministic
        assert got[name]["verdict"] == ref.verdict.tolist()
        assert got[name]["settled"] == ref.settled | {"verify": got[name]["settled"]["verify"]}
        assert got[name]["n_combos"] == len(ref.combos)
        assert ref.counts()["unargmaxable"] > 4                  # the proofs had work to share
    # the whitening split over the ranks (its sums all-reduced) gives the same verdicts
    assert got["split"]["verdict"] == find_unargmaxable(W, None, block=64, row_budget_s=None).verdict.tolist()
    # ranks whose maxima come in different dtypes reduce them as numbers (failed: as raw bytes)
    assert got["mixed"]["verdict"] == got["nobias"]["verdict"]
    assert got["split"]["calls"] == [[[8], "sum"], [[8, 8], "sum"], [[250, 8], "sum"], [[1], "max"]]
