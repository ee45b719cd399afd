"""``.figure()`` and ``.to_pandas()`` of what ``vocablens.Model`` hands back, on a tiny random model.

A figure is the one the report (or the explorer) draws: the report section built by its own builder
on the same result holds exactly the figure ``.figure()`` returns (``figure_html`` with the section's
div id), and the section's data is what the handle computed (the analysis called as the report calls
it). The explorer's attribution plot is drawn in JavaScript: its Python twin has the explorer's traces
and reads the explorer's fields. A frame has one row per item, its values the result's own fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_dirs import save_tiny, tiny_tokenizer
from vocablens.errors import BadInput

pytest.importorskip("pandas")

APP_JS = Path(__file__).resolve().parents[2] / "src" / "vocablens" / "serve" / "static" / "app.js"
PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("shows") / "m", tiny_tokenizer())
    return vocablens.load(str(d))


@pytest.fixture(scope="module")
def argmax(m):
    return m.argmax(stored="off")


class _Doubling:  # h -> 2h: a translator kind of its own (through RMSNorm it reads as the logit lens)
    def translate(self, layer, h):
        return 2 * h


def _words(m) -> list[str]:
    return sorted(w for w in m.tokenizer.get_vocab() if w.isascii() and w.isalpha() and len(w) > 1)[:8]


def test_one_prompt_through_one_lens_is_the_reports_logit_lens_heatmap(m):
    from vocablens.lens import logit_lens
    from vocablens.render.html import figure_html
    from vocablens.render.lens import lens_section

    res = m.lens(PROMPT, positions="all", k=5)
    ref = logit_lens(m.borders, m.encode(PROMPT), positions="all", k=5)  # as the report's lens section runs it
    for a, b in zip(res[0].layers, ref.layers):
        assert torch.equal(a.top_ids, b.top_ids)
    section = lens_section(res[0], m.tokenizer, PROMPT)
    assert figure_html(res.figure(), "logit-lens-heatmap") in section.html
    fig = res.figure()
    assert fig.data[0].type == "heatmap" and list(fig.data[0].y) == [str(i) for i in range(m.borders.n_layers + 1)]
    assert len(fig.data[0].x) == m.encode(PROMPT).shape[1]


@pytest.mark.parametrize("colour", ["entropy", "kl", "final_prob"])
def test_one_prompt_through_two_lenses_is_the_reports_trajectory_figure(m, colour):
    from vocablens.render.html import figure_html
    from vocablens.render.tuned import tuned_lens_section

    m.add_lens("doubled", _Doubling())
    try:
        res = m.lens(PROMPT, kind=["logit", "doubled"], positions="all", k=1)
    finally:
        m.translators.pop("doubled")
    section = tuned_lens_section(res[0, "logit"], res[0, "doubled"], m.tokenizer)
    fig = res.figure(colour=colour)
    assert figure_html(fig, f"tuned-lens-{colour}") in section.html
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    if colour == "entropy":  # the default colouring is the section's first
        assert res.figure().to_plotly_json() == fig.to_plotly_json()
    with pytest.raises(BadInput, match="colour must be one of"):
        res.figure(colour="rainbow")


def test_a_batch_is_one_heatmap_per_kind_with_a_column_per_prompt(m):
    from vocablens.render.lens_batch import lens_batch_figure

    prompts = ["the cat sat", "a b", "hello world"]
    res = m.lens(prompts, k=3)
    fig = res.figure()
    assert fig.to_plotly_json() == lens_batch_figure(res.value, m.tokenizer, prompts).to_plotly_json()
    assert len(fig.data) == 1 and len(fig.data[0].x) == 3 and list(fig.data[0].y)[-1] == m.borders.n_layers
    with pytest.raises(BadInput, match="colour= applies to the trajectories"):
        res.figure(colour="kl")


def test_the_reports_other_figures_are_their_sections(m):
    """anatomy, pca, settle and undertrained: each section's figure is the result's ``.figure()``."""
    from vocablens.render.anatomy import anatomy_section
    from vocablens.render.pca import pca_section
    from vocablens.render.html import figure_html
    from vocablens.render.undertrained import undertrained_section
    from vocablens.render.vocab_space import settle_section

    a = m.anatomy()
    assert figure_html(a.figure(), "anatomy-params") in anatomy_section([a.value]).html
    p = m.pca(_words(m), prefix="")
    assert figure_html(p.figure(), "pca-3d") in pca_section(p.value).html
    s = m.settle("unused", rows=torch.randint(0, 200, (4, 16), generator=torch.Generator().manual_seed(0)),
                 seq_len=16, max_tokens=64)
    assert figure_html(s.figure(), "settle-curve") in settle_section(s.value).html
    u = m.undertrained(candidates=5)
    assert figure_html(u.figure(), "undertrained-scatter") in undertrained_section(u.value, m.tokenizer).html
    with pytest.raises(BadInput, match="takes no option colour"):
        p.figure(colour="kl")


def test_explain_draws_the_explorers_attribution_bars(m):
    e = m.explain(PROMPT, position=-2)
    fig = e.figure()
    attn, ffn = fig.data
    assert (attn.type, attn.name, ffn.name, fig.layout.barmode) == ("bar", "attention", "FFN", "relative")
    assert list(attn.x) == list(ffn.x) == list(range(m.borders.n_layers))
    assert list(attn.y) == [b.attn_dla for b in e.blocks] and list(ffn.y) == [b.mlp_dla for b in e.blocks]
    blocks = e.to_json()["blocks"]  # what the explorer draws from (/api/explain)
    assert list(attn.y) == pytest.approx([b["attn_dla"] for b in blocks], abs=1e-6)
    assert list(ffn.y) == pytest.approx([b["mlp_dla"] for b in blocks], abs=1e-6)
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("block", "direct logit attribution")
    js = APP_JS.read_text(encoding="utf-8")
    plot = js[js.index('Plotly.react("attr-plot"'):js.index("attr-summary", js.index('Plotly.react("attr-plot"'))]
    for s in ('y: data.blocks.map((b) => b.attn_dla), name: "attention"', 'y: data.blocks.map((b) => b.mlp_dla), name: "FFN"',
              'barmode: "relative"', '"block"', '"direct logit attribution"'):
        assert s in plot, s  # the explorer's plot is still the one drawn here


@pytest.mark.parametrize(("what", "article"), [("score", "a"), ("neighbors", "a"), ("tie_check", "a"), ("project", "a"),
                                               ("argmax", "an")])
def test_results_drawn_nowhere_say_so(m, argmax, what, article):
    res = {"score": lambda: m.score(PROMPT), "neighbors": lambda: m.neighbors(["the"], k=2),
           "tie_check": m.tie_check, "project": m.project, "argmax": lambda: argmax}[what]()
    with pytest.raises(BadInput, match=f"no figure is drawn for {article} {what} result"):
        res.figure()


def test_frames_of_the_two_matrices(m):
    tie = m.tie_check()
    (row,) = tie.to_pandas().to_dict("records")
    assert row == tie.value.to_dict()
    p = m.pca(_words(m), prefix="")
    f = p.to_pandas()
    assert list(f["word"]) == list(p.words) and list(f["group"]) == list(p.groups)
    assert list(f["id"]) == p.pca.ids.tolist()
    assert f[["pc1", "pc2", "pc3"]].to_numpy().tolist() == p.pca.coords.tolist()


def test_explain_frame_has_a_row_per_block(m):
    e = m.explain(PROMPT)
    f = e.to_pandas()
    assert list(f["block"]) == list(range(m.borders.n_layers))
    for b, row in zip(e.blocks, f.to_dict("records")):
        assert (row["attn_dla"], row["mlp_dla"], row["mlp_bias_dla"]) == (b.attn_dla, b.mlp_dla, b.mlp_bias_dla)
        assert row["head_dla"] == b.head_dla.tolist() and row["attn_top_tokens"] == m.tokens(b.attn_top_ids)
        assert sum(row["head_dla"]) + row["attn_bias_dla"] == pytest.approx(row["attn_dla"], abs=1e-5)


def test_projection_frames(m):
    v = m.project(block=1, neurons=[3, 7], k=4)
    f = v.to_pandas()
    assert list(f["block"]) == v.blocks.tolist() == [1, 1] and list(f["neuron"]) == v.neurons.tolist() == [3, 7]
    assert [list(x) for x in f["top_ids"]] == v.top_ids.tolist()
    assert [list(x) for x in f["top_tokens"]] == [m.tokens(r) for r in v.top_ids.tolist()]
    s = m.project(token=86, k=3)
    f = s.to_pandas()
    (ts,) = s.value
    assert list(f["direction"]) == ["promote"] * 3 + ["suppress"] * 3
    assert list(f["neuron"]) == ts.promote_neurons.tolist() + ts.suppress_neurons.tolist()
    assert list(f["block"]) == ts.promote_blocks.tolist() + ts.suppress_blocks.tolist()
    c = m.project(block=0, head=0, k=5)
    f = c.to_pandas()
    assert len(f) == 5 and list(f["source_id"]) == c.src_ids.tolist() and list(f["target_id"]) == c.tgt_ids.tolist()


def test_settle_argmax_undertrained_and_generation_frames(m, argmax):
    s = m.settle("unused", rows=torch.randint(0, 200, (4, 16), generator=torch.Generator().manual_seed(1)),
                 seq_len=16, max_tokens=64)
    f = s.to_pandas()
    assert list(f["layer"]) == list(range(m.borders.n_layers + 1)) and list(f["histogram"]) == s.histogram.tolist()
    assert int(f["histogram"].sum()) == s.n_positions and list(f["settled_fraction"]) == s.settled_fraction.tolist()
    a = argmax
    f = a.to_pandas()
    assert len(f) == a.result.verdict.numel() and list(f["id"]) == list(range(len(f)))
    assert f["verdict"].value_counts().to_dict() == {k: v for k, v in a.result.counts().items() if v}
    u = m.undertrained(candidates=5)
    f = u.to_pandas()
    assert list(f["id"]) == [t["id"] for t in u.to_json()["tokens"]] and len(f) == 5
    assert list(f["indicator"]) == pytest.approx([float(u.indicators.values[i]) for i in f["id"]], abs=1e-6)
    g = m.generate("the cat", max_new_tokens=4, top=2)
    f = g.to_pandas()
    assert list(f["step"]) == [1, 2, 3, 4] and list(f["id"]) == [t.id for t in g.tokens]
    assert list(f["logprob"]) == [t.logprob for t in g.tokens]
    assert [list(x) for x in f["top_tokens"]] == [m.tokens([i for i, _ in t.top]) for t in g.tokens]
