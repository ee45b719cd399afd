"""``.figure()`` and ``.to_pandas()`` of the workflows that moved from the CLI and the explorer into
``vocablens.Model`` (trajectory, bottleneck, align, anomaly), on a tiny random model: the trajectory's
figure has the explorer's traces and reads the explorer's JSON; the bottleneck's is the figure
``bottleneck --plot`` writes; each frame's values are the result's own fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_dirs import save_tiny, tiny_tokenizer

pytest.importorskip("pandas")

APP_JS = Path(__file__).resolve().parents[2] / "src" / "vocablens" / "serve" / "static" / "app.js"
PROMPT = "the cat sat on the mat"


class _Doubling:  # h -> 2h: a second lens kind (read through RMSNorm it is the logit lens)
    def translate(self, layer, h):
        return 2 * h


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("client-shows") / "m", tiny_tokenizer())
    return vocablens.load(str(d))


def test_trajectory_draws_the_explorers_rank_and_probability_plot(m):
    m.add_lens("doubled", _Doubling())
    try:
        t = m.trajectory(PROMPT, position=3, kinds=("logit", "doubled"))
    finally:
        m.translators.pop("doubled")
    d = t.to_json()  # what the explorer draws from (/api/trajectory)
    fig = t.figure()
    rank, prob, rank2, prob2 = fig.data
    L = m.borders.n_layers
    assert (rank.name, prob.name, prob.yaxis, rank2.name, prob2.name) == (
        "logit: rank", "logit: p", "y2", "doubled: rank", "doubled: p")
    assert (rank.line.color, prob.line.dash) == ("#0b5cad", "dot")
    assert list(rank2.y) == [r + 1 for r in d["doubled"]["rank"]]
    assert list(rank.x) == list(prob.x) == list(range(L + 1))
    assert list(rank.y) == [r + 1 for r in d["logit"]["rank"]] and list(prob.y) == pytest.approx(d["logit"]["prob"])
    assert (fig.layout.yaxis.type, fig.layout.yaxis.autorange, tuple(fig.layout.yaxis2.range)) == ("log", "reversed", (0, 1))
    js = APP_JS.read_text(encoding="utf-8")
    plot = js[js.index("async function loadTrajectory"):js.index("async function loadExplain")]
    for s in ('y: d.rank.map((r) => r + 1), name: `${name}: rank`', 'name: `${name}: p`, yaxis: "y2"',
              '"rank (1 = top)" }, type: "log", autorange: "reversed"', '["logit", "#0b5cad"], ["tuned", "#e4572e"]'):
        assert s in plot, s  # the explorer's plot is still the one drawn here
    f = t.to_pandas()
    assert list(f["kind"]) == ["logit"] * (L + 1) + ["doubled"] * (L + 1)
    f = f[f["kind"] == "logit"]
    assert list(f["layer"]) == list(range(L + 1)) and list(f["rank"]) == d["logit"]["rank"]
    assert list(f["top1"]) == d["logit"]["top1"] and list(f["prob"]) == pytest.approx(d["logit"]["prob"])


def test_bottleneck_figure_is_the_plot_it_writes_and_its_rows_the_spectra(m):
    from vocablens.render.bottleneck import bottleneck_figure

    b = m.bottleneck(contexts=m.borders.d_emb + 8, seq_len=16)
    assert b.figure().to_plotly_json() == bottleneck_figure(b.value).to_plotly_json()
    f = b.to_pandas()
    assert list(f["index"]) == list(range(1, len(f) + 1)) and len(f) == max(b.sigma_W.numel(), b.sigma_A.numel())
    assert list(f["sigma_W"][: b.sigma_W.numel()]) == b.sigma_W.tolist()
    assert list(f["sigma_logprobs"][: b.sigma_A.numel()]) == b.sigma_A.tolist()


def test_align_and_anomaly_frames(m, tmp_path):
    res = m.align(m, top=3)
    f = res.to_pandas()
    assert len(f) == 3 and f.to_dict("records") == res.to_json()["best_matches"]
    normal = ["the cat sat", "dogs run fast", "hello world", "some text here", "more of it", "and one more"]
    a = m.anomaly(normal, ["the cat", "zz qq xx", "hello there"], labels=[0, 1, 0], kind="logit")
    f = a.to_pandas()
    assert list(f["index"]) == [0, 1, 2] and list(f["label"]) == [0, 1, 0] and list(f["text"])[1] == "zz qq xx"
    for k, v in a.value.scores.items():
        assert list(f[k]) == v.tolist()
