"""One comparison of lenses on the same tokens: against the tuned-lens evaluation and a full-softmax oracle."""

from __future__ import annotations

import math

import torch

import tiny_models as tm
from vocablens.lens.compare import compare_lenses
from vocablens.lens.evaluate import evaluate
from vocablens.lens.jacobian import JacobianLens
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders


def test_compare_matches_evaluate_and_a_full_softmax_oracle():
    model = tm.make_tiny("llama")
    b = Borders.from_model(model)
    L, d = b.n_layers, b.d_model
    g = torch.Generator().manual_seed(3)
    tuned = TunedLens.for_model(b)
    with torch.no_grad():
        tuned.weight.copy_(0.1 * torch.randn(L, d, d, generator=g))
    J = torch.eye(d) + 0.2 * torch.randn(1, d, d, generator=g)
    jac = JacobianLens(J, [1], L)  # a matrix for layer 1 only: layer 0 scores NaN
    rows = tm.ids(batch=2, T=6, seed=7)
    res = compare_lenses(b, {"logit": None, "tuned": tuned, "jacobian": jac}, rows, n_bytes=40)
    ref = evaluate(b, tuned, rows, n_bytes=40)
    for i in range(L + 1):
        assert math.isclose(res.metrics["logit"]["kl"][i], ref.logit_kl[i], rel_tol=1e-5, abs_tol=1e-7)
        assert math.isclose(res.metrics["tuned"]["ce"][i], ref.tuned_ce[i], rel_tol=1e-5)
        assert math.isclose(res.metrics["tuned"]["top1_agreement"][i], ref.tuned_top1[i])
        assert math.isclose(res.metrics["logit"]["bpb"][i], ref.logit_bpb[i], rel_tol=1e-5)
    assert math.isnan(res.metrics["jacobian"]["kl"][0]) and res.metrics["jacobian"]["kl"][L] == 0.0
    # the Jacobian lens at layer 1 by a full softmax over V, plain torch
    with torch.no_grad():
        kl = []
        for r in rows:
            resid, logits = b.residual_stream(r[None])
            p = torch.log_softmax(logits[0].double(), -1)
            q = torch.log_softmax(b.unembedding(resid[1, 0].float() @ J[0].T).double(), -1)
            kl.append((p.exp() * (p - q)).sum(-1))
    assert math.isclose(res.metrics["jacobian"]["kl"][1], float(torch.cat(kl).mean()), rel_tol=1e-4)
    assert res.mean_kl("jacobian") == res.metrics["jacobian"]["kl"][1]
    d_ = res.to_dict()
    assert d_["kinds"] == ["logit", "tuned", "jacobian"] and len(d_["layers"]) == L + 1


def test_report_section_shows_the_three_lenses_side_by_side():
    from vocablens.lens import logit_lens
    from vocablens.render.prediction_trajectories import trajectory_figure
    from vocablens.render.tuned import tuned_lens_section
    from tiny_dirs import tiny_tokenizer

    b = Borders.from_model(tm.make_tiny("llama"))
    L, d = b.n_layers, b.d_model
    ids = tm.ids(batch=1, T=5, seed=2)[0]
    tuned = TunedLens.for_model(b)
    jac = JacobianLens(torch.eye(d)[None].repeat(L - 1, 1, 1), list(range(1, L)), L, {"name": "tiny"},
                       {"n_prompts": 3, "corpus": "c", "stored_dtype": "float16", "source": "vocablens"})
    res = [logit_lens(b, ids, positions="all", k=1, translator=t, kind=kd,
                      layers=None if kd != "jacobian" else [*jac.layers, L])
           for kd, t in (("logit", None), ("tuned", tuned), ("jacobian", jac))]
    fig = trajectory_figure(*res[:2], tiny_tokenizer(), "kl", res[2])
    assert [a.text for a in fig.layout.annotations][:3] == ["logit lens", "tuned lens", "jacobian lens"]
    assert list(fig.data[2].y) == [*jac.layers, L]  # the published lens's rows: no layer 0
    jac.check_model(b)  # it records no model: accepted on its shapes, and says so
    tuned.check_model(b)
    sec = tuned_lens_section(*res[:2], tiny_tokenizer(), tuned.info(), jacobian=res[2], jacobian_info=jac.info())
    assert sec.title == "Logit, tuned and Jacobian lens" and "3 prompts" in sec.html and "stored float16" in sec.html
    assert "unverified: the file names no model" in sec.html  # the Jacobian lens's provenance
    assert "format vocablens, verified: unembedding hash" in sec.html  # the tuned lens's


def test_the_three_heatmaps_are_wide_enough_for_their_tokens():
    """The report's three-lens heatmaps were ~280 px each with 9 px text: tokens were cut
    ("NotFoundErro") or spilled over. Each cell is now as wide as its longest token at 11 px, and the
    page scrolls sideways rather than squeezing the panels."""
    from vocablens.lens import logit_lens
    from vocablens.render.tokens import display_token
    from vocablens.render.prediction_trajectories import trajectory_figure
    from vocablens.render.tuned import tuned_lens_section
    from tiny_dirs import tiny_tokenizer

    b = Borders.from_model(tm.make_tiny("llama"))
    ids = tm.ids(batch=1, T=6, seed=3)[0]
    tok = tiny_tokenizer()
    res = [logit_lens(b, ids, positions="all", k=1) for _ in range(3)]  # three panels (their kind only titles them)
    fig = trajectory_figure(*res[:2], tok, "entropy", res[2])
    longest = max(len(display_token(tok, int(t))) for r in res for ly in r.layers for t in ly.top_ids[:, 0])
    plot_px = fig.layout.width - fig.layout.margin.l - fig.layout.margin.r
    for axis in (fig.layout.xaxis, fig.layout.xaxis2, fig.layout.xaxis3):
        panel_px = (axis.domain[1] - axis.domain[0]) * plot_px
        assert panel_px / len(ids) >= max(56, 0.62 * 11 * longest) and panel_px >= 320, (panel_px, longest)
    assert all(tr.textfont.size >= 11 for tr in fig.data)
    sec = tuned_lens_section(*res[:2], tok, jacobian=res[2])
    assert sec.html.count("<div class='scroll'>") == 3  # one per colour, each scrolls rather than shrinks
