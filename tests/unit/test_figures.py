"""render/figures.save_figure: the one writer of ``--plot`` files (HTML or image by suffix)."""

import os
import stat

import pytest

from vocablens.errors import BadInput, WriteFailed
from vocablens.render.figures import figure_kind, save_figure


def _plotly():
    import plotly.graph_objects as go

    return go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2]))


def _builder(kind):
    if kind == "html":
        return _plotly()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 3, 2])
    return fig


def test_html_and_png_by_suffix(tmp_path):
    html = save_figure(_builder, tmp_path / "f.html")
    text = html.read_text()
    assert text.lower().startswith("<!doctype html>") and "plotly" in text and "<script src=" not in text
    png = save_figure(_builder, tmp_path / "f.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert save_figure(_builder, tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
    umask = os.umask(0)
    os.umask(umask)
    for p in (html, png):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.html", "f.png", "f.svg"]  # no temporaries


def test_plain_plotly_figure_to_html(tmp_path):
    assert "plotly" in save_figure(_plotly(), tmp_path / "g.htm").read_text()


def test_bad_suffix_and_plotly_png_without_kaleido(tmp_path):
    with pytest.raises(BadInput, match=r"`plot` must end in \.html"):
        figure_kind(tmp_path / "f.jpg")
    try:
        import kaleido  # noqa: F401
    except ImportError:
        with pytest.raises(BadInput, match="kaleido"):
            save_figure(_plotly(), tmp_path / "f.png")
        assert not any(tmp_path.iterdir())


def test_existing_file_kept_when_drawing_fails(tmp_path):
    target = tmp_path / "keep.html"
    target.write_text("precious")

    class Broken:
        def to_html(self):
            pass

        def write_html(self, path, **kw):
            open(path, "w").write("half")
            raise OSError(28, "No space left on device")

    with pytest.raises(WriteFailed, match="disk is full"):
        save_figure(Broken(), target)
    assert target.read_text() == "precious" and [p.name for p in tmp_path.iterdir()] == ["keep.html"]


# --- figure layout: legends and titles never overlap a plot, an axis title or each other ---------------

from browser import CHROMIUM, require_browser

#: boxes of one plotly figure's parts, in page pixels: legends, axis titles, tick labels, plot areas,
#: annotations (subplot titles), colour bars, and the whole svg
BOXES_JS = """(id) => {
  const gd = document.getElementById(id), svg = gd.querySelector('.main-svg').getBoundingClientRect();
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = (sel) => [...gd.querySelectorAll(sel)].filter(e => e.getBoundingClientRect().width > 0).map(box);
  const titles = [...gd.querySelectorAll('g[class^="g-"]')].filter(e => /^g-[xy]\\d*title$/.test(e.getAttribute('class')));
  const legends = [...gd.querySelectorAll('g')].filter(e => /^legend\\d*$/.test(e.getAttribute('class')));
  return {svg: [svg.left, svg.top, svg.right, svg.bottom], legend: legends.map(box), plot: all('rect.nsewdrag'),
          title: titles.filter(e => e.textContent.trim()).map(box), tick: all('g.xtick text, g.ytick text'),
          annotation: all('g.annotation'), colorbar: all('g.colorbar'),
          ytitles: titles.filter(e => /^g-y/.test(e.getAttribute('class'))).map(e => e.textContent.trim())};
}"""


def _overlap(a, b, tol=1.0) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def layout_problems(boxes: dict) -> list[str]:
    """What collides in one figure (from :data:`BOXES_JS`): a legend over a plot, an axis title, a tick
    label, a subplot title, a colour bar or another legend; an axis title over a plot or tick labels;
    and any part outside the figure (clipped)."""
    out = []
    against = {"legend": ("plot", "title", "tick", "annotation", "colorbar", "legend"),
               "title": ("plot", "tick", "title", "annotation", "colorbar")}
    for kind, others in against.items():
        for i, a in enumerate(boxes[kind]):
            for other in others:
                for j, b in enumerate(boxes[other]):
                    if (other != kind or j > i) and _overlap(a, b):
                        out.append(f"{kind} {i} overlaps {other} {j}")
    s = boxes["svg"]
    for kind in ("legend", "title", "annotation", "tick", "plot"):
        for i, a in enumerate(boxes[kind]):
            if a[0] < s[0] - 1 or a[1] < s[1] - 1 or a[2] > s[2] + 1 or a[3] > s[3] + 1:
                out.append(f"{kind} {i} is clipped")
    return out


def _settle_result():
    """A settle result shaped like SmolLM2's (30 blocks, 256 positions, net FLOPs down to -235%)."""
    import torch

    from vocablens.vocab_space.settle import ExitPoint, SettleResult

    L, N = 30, 256
    settle_layer = torch.arange(N) % (L + 1)
    hist = torch.bincount(settle_layer, minlength=L + 1)
    exits = [ExitPoint(t, 15 + 10 * t, 0.5 - 0.4 * t, 0.2 - 5 * (t - 0.5), 0.1 + 0.8 * t)
             for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)]
    return SettleResult("logit", N, L, settle_layer, hist, hist.cumsum(0).float() / N,
                        (hist.cumsum(0).float() / N).clamp(min=0.05), exits, 7.23e6, 56.62e6, min_layer=15)


def test_settle_figure_one_quantity_per_titled_axis():
    """Every y axis of the settle figure has a title naming the one quantity its traces show; the
    early exit's net FLOPs (down to -235%) never share an axis with shares of positions; each panel's
    legend sits below its own panel."""
    from vocablens.render.vocab_space.settle import COMPUTE, POSITIONS, settle_figure

    fig = settle_figure(_settle_result())
    by_axis = {}
    for t in fig.data:
        by_axis.setdefault(t.yaxis, []).append(t)
    assert sorted(by_axis) == ["y", "y2", "y3"]
    for ax, traces in by_axis.items():
        title = fig.layout["yaxis" + ax[1:]].title.text
        assert title and {t.meta for t in traces} == {title}, (ax, title, [t.meta for t in traces])
    axis_of = {t.name: t.yaxis for t in fig.data}
    assert fig.layout[f"yaxis{axis_of['net FLOPs saved (after lens reads)'][1:]}"].title.text == COMPUTE
    assert axis_of["net FLOPs saved (after lens reads)"] != axis_of["exit top-1 = final"]
    for t in fig.data:
        if t.meta == POSITIONS:
            assert 0 <= min(t.y) and max(t.y) <= 1, t.name
    assert min(fig.data[-1].y) == pytest.approx(-2.25)  # net FLOPs: on its own axis, not squeezing shares
    for col, legend in enumerate(("legend", "legend2", "legend3"), 1):
        lg, dom = fig.layout[legend], fig.layout["xaxis" + ("" if col == 1 else str(col))].domain
        assert lg.y < 0 and lg.yanchor == "top" and dom[0] <= lg.x < dom[1]
        assert {t.legend for t in fig.data if t.xaxis == "x" + ("" if col == 1 else str(col))} == {legend}


@pytest.mark.browser
def test_settle_figure_layout_in_headless_chromium(tmp_path):
    """Drawn by plotly.js at the report's width and a narrow one: no legend over a plot, an axis title,
    a tick label or another legend; no axis title over a plot; nothing clipped; three titled y axes."""
    playwright = require_browser()
    from vocablens.render.vocab_space.settle import settle_figure

    page_file = tmp_path / "settle.html"
    settle_figure(_settle_result()).write_html(page_file, include_plotlyjs=True, full_html=True, div_id="settle")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for width in (1300, 900):
            page = browser.new_page(viewport={"width": width, "height": 700})
            page.goto(page_file.as_uri())
            page.wait_for_selector("#settle .main-svg")
            boxes = page.evaluate(BOXES_JS, "settle")
            assert len(boxes["legend"]) == 3 and len(boxes["plot"]) == 3 and len(boxes["title"]) == 6
            assert all(boxes["ytitles"]) and len(boxes["ytitles"]) == 3
            assert layout_problems(boxes) == [], (width, layout_problems(boxes))
        browser.close()
