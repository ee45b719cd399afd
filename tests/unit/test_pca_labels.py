"""The report's word-embedding figures can be read (issue 40, fault 4c): no label overlaps another or
hides a point, in 3-D (labels in front of the WebGL points) and on the flat map (every word labelled).

The failing input is the default model's 60 words: their PCA coordinates are copied below (SmolLM2-135M
W_E, ``word_pca`` with the default groups), so these tests need no model.
"""

from __future__ import annotations

import math

import pytest
import torch

from figure_labels import LABELS_JS, label_problems
from vocablens.geometry.embedding import DEFAULT_WORD_GROUPS, PCA3D, WordPCA
from vocablens.render.labels import place_labels, project_scene, text_size

from browser import CHROMIUM, require_browser

#: the default model's 60 words on their top-3 principal directions, in DEFAULT_WORD_GROUPS order
COORDS = [
    (2.259, -0.234, 0.373), (2.325, 0.263, -0.284), (2.213, 0.480, -0.410), (1.916, 0.594, -0.504),
    (1.786, 0.540, -0.506), (1.557, 0.603, -0.612), (1.309, 0.693, -0.557), (1.294, 0.627, -0.697),
    (1.082, 0.603, -0.660), (1.320, 0.090, -0.342), (-0.830, 1.540, 0.302), (-1.026, 1.618, 0.247),
    (-1.020, 1.646, 0.279), (-0.964, 1.634, 0.246), (-0.756, 1.529, 0.393), (-0.889, 1.450, 0.248),
    (-0.737, 1.344, 0.459), (-0.358, -0.539, 0.028), (-0.312, -0.493, 0.046), (-0.523, -0.521, -0.088),
    (-0.567, -0.492, -0.073), (-0.462, -0.406, -0.004), (-0.105, -0.441, 0.133), (-0.205, -0.482, 0.076),
    (-0.352, -0.395, 0.108), (-0.570, -0.349, -0.099), (-0.462, -0.365, -0.029), (0.178, -0.326, 0.233),
    (0.191, -0.329, 0.247), (-0.123, -0.350, 0.079), (-0.383, -0.183, 0.117), (-0.686, -0.031, -0.164),
    (-0.601, -0.252, -0.219), (-0.116, -0.277, 0.120), (0.059, -0.233, 0.149), (-0.642, -0.328, -0.173),
    (-0.820, -0.231, -0.187), (0.013, -0.594, -0.283), (-0.622, -0.447, -0.602), (-0.775, -0.363, -0.619),
    (-1.171, -0.310, -0.669), (-0.257, -0.343, -0.151), (-1.122, -0.232, -0.640), (-0.585, -0.246, -0.228),
    (0.830, -0.402, 1.476), (0.328, -0.264, 1.165), (0.393, -0.362, 1.159), (0.080, -0.317, 1.035),
    (0.777, -0.459, 1.412), (0.644, -0.373, 1.554), (0.246, -0.467, -0.131), (0.157, -0.509, -0.310),
    (-0.435, -0.337, -0.522), (-0.307, -0.503, -0.517), (0.008, -0.599, -0.435), (-0.470, -0.403, -0.626),
    (-0.138, -0.230, 0.098), (-0.705, 0.031, -0.248), (-0.566, -0.097, -0.136), (-0.307, -0.170, -0.057),
]


def default_words_pca() -> WordPCA:
    words = [w for ws in DEFAULT_WORD_GROUPS.values() for w in ws]
    groups = [g for g, ws in DEFAULT_WORD_GROUPS.items() for _ in ws]
    n = len(words)
    g = torch.Generator().manual_seed(0)
    p = PCA3D(ids=torch.arange(n), mean=torch.zeros(8), directions=torch.eye(3, 8), coords=torch.tensor(COORDS),
              explained_variance=torch.tensor([0.192, 0.101, 0.068]), random_directions=torch.eye(3, 8),
              random_coords=0.05 * torch.randn(n, 3, generator=g), random_explained_variance=torch.tensor([0.001] * 3),
              seed=0)
    return WordPCA(tuple(words), tuple(groups), p, ())


def test_project_scene_is_plotlys_perspective():
    """A camera on the z axis, 2 units out, looking at the centre; the range [-1, 1] scales to
    [-0.5, 0.5], the perspective's vertical field of view is pi/4, so a point x units right and
    z units up (model units) at depth D lands (x / D) / tan(pi/8) of the half-width right of centre."""
    cam = {"eye": (0.0, 0.0, 2.0), "center": (0.0, 0.0, 0.0), "up": (0.0, 1.0, 0.0)}
    t = 1 / math.tan(math.pi / 8)
    got = project_scene([(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 0, 1), (0, 0, 1)], [(-1, 1)] * 3, cam, 400, 400)
    want = [(200, 200), (200 + 200 * t * 0.5 / 2, 200), (200, 200 - 200 * t * 0.5 / 2),
            (200 + 200 * t * 0.5 / 1.5, 200), (200, 200)]
    assert got == [pytest.approx(w) for w in want]
    # a wider scene keeps the vertical scale and stretches nothing: x scales by height / width
    assert project_scene([(1, 0, 0)], [(-1, 1)] * 3, cam, 800, 400)[0] == pytest.approx((400 + 200 * t * 0.5 / 2, 200))


def _check_spots(xy, sizes, spots, width, height, point_px):
    placed = [s for s in spots if s is not None]
    for i, a in enumerate(placed):
        assert 0 <= a.box[0] and 0 <= a.box[1] and a.box[2] <= width and a.box[3] <= height
        for b in placed[i + 1:]:
            assert not (a.box[0] < b.box[2] and b.box[0] < a.box[2] and a.box[1] < b.box[3] and b.box[1] < a.box[3])
        for x, y in xy:   # no label within a point's radius of any point
            cx, cy = min(max(x, a.box[0]), a.box[2]), min(max(y, a.box[1]), a.box[3])
            assert (cx - x) ** 2 + (cy - y) ** 2 >= point_px ** 2
    for (x, y), (w, h), s in zip(xy, sizes, spots):
        if s is not None:   # the box is where the offset says, and of the label's size
            assert s.box == pytest.approx((x + s.dx - w / 2, y + s.dy - h / 2, x + s.dx + w / 2, y + s.dy + h / 2))


def test_place_labels_on_the_default_words_dense_centre():
    """The 60 words' flat map (PC 1 x PC 2 at 2-D map scale): 37 of them in a 420 x 180 px blob."""
    from vocablens.render.pca import pca_map_figure

    wp = default_words_pca()
    fig = pca_map_figure(wp)
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    m = fig.layout.margin
    w, h = fig.layout.width - m.l - m.r, fig.layout.height - m.t - m.b
    xy = [((x - xr[0]) / (xr[1] - xr[0]) * w, (yr[1] - y) / (yr[1] - yr[0]) * h) for x, y, _ in COORDS]
    sizes = [text_size(word, 11) for word in wp.words]
    spots = place_labels(xy, sizes, w, h, point_px=5.0, max_leader=160.0)
    _check_spots(xy, sizes, spots, w, h, 5.0)
    assert all(s is not None for s in spots)
    assert sorted(a.text for a in fig.layout.annotations) == sorted(wp.words)
    # two points on one pixel: both labelled, apart
    two = place_labels([(50, 50), (50, 50)], [(30, 14), (30, 14)], 100, 100, point_px=4, max_leader=40)
    _check_spots([(50, 50), (50, 50)], [(30, 14), (30, 14)], two, 100, 100, 4)
    assert None not in two
    # no room at all: the label is left to the hover text
    assert place_labels([(5, 5)], [(30, 14)], 20, 20, point_px=4, max_leader=10) == [None]


def test_pca_figures_structure_and_labels_off_their_points():
    """Per view G point traces (hover: every word); the labels are annotations at their word's point,
    shifted off it (labels drawn on their marker hid behind it: "prin…", "Spain"); the buttons switch
    traces, axis ranges and labels; the section holds both figures."""
    from vocablens.render.html import figure_html
    from vocablens.render.pca import POINT_PX, pca_figure, pca_map_figure, pca_section

    wp = default_words_pca()
    fig, flat = pca_figure(wp), pca_map_figure(wp)
    G = len(DEFAULT_WORD_GROUPS)
    assert len(fig.data) == 2 * G and [t.visible for t in fig.data] == [True] * G + [False] * G
    assert sorted(w for t in fig.data[:G] for w in t.hovertext) == sorted(wp.words)
    at = dict(zip(wp.words, COORDS))
    for a in fig.layout.scene.annotations:
        assert (a.x, a.y, a.z) == pytest.approx(at[a.text])
    for a in flat.layout.annotations:
        assert (a.x, a.y) == pytest.approx(at[a.text][:2])
    for a in list(fig.layout.scene.annotations) + list(flat.layout.annotations):
        off = math.hypot(a.ax, a.ay) if a.showarrow else math.hypot(a.xshift, a.yshift)
        assert off > POINT_PX
    pca, rnd = (b.args for b in fig.layout.updatemenus[0].buttons)
    assert pca[0]["visible"] == [True] * G + [False] * G and rnd[0]["visible"] == [False] * G + [True] * G
    assert pca[1]["scene.annotations"] == [a.to_plotly_json() for a in fig.layout.scene.annotations]
    assert rnd[1]["scene.xaxis.range"][1] < 1 < pca[1]["scene.xaxis.range"][1]
    assert {a["text"] for a in rnd[1]["scene.annotations"]} <= set(wp.words)
    html = pca_section(wp).html
    assert figure_html(fig, "pca-3d") in html and figure_html(flat, "pca-2d") in html


@pytest.mark.browser
def test_pca_labels_read_in_chromium(tmp_path):
    """The section as Chromium draws it, at the report's width and a narrow window: in 3-D (both views)
    and on the flat map, no label box overlaps another or comes within 2 px of a point's centre
    (measured in the DOM; the 3-D points through the scene's own camera matrices); the map labels
    all 60 words, the 3-D view most, and every point has its word on hover. Before: all 60 labels at
    their points in WebGL, the dense centre's piled on each other."""
    playwright = require_browser()
    from vocablens.render.pca import pca_section
    from vocablens.render.report import render_report

    wp = default_words_pca()
    page_file = tmp_path / "pca.html"
    page_file.write_text(render_report("pca", [], [pca_section(wp)]), encoding="utf-8")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.set_default_timeout(30_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_function("() => document.querySelectorAll('#pca-3d g.annotation-scene').length > 0"
                               " && document.querySelectorAll('#pca-2d g.annotation').length > 0")
        for width in (1300, 900):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(300)
            flat = page.evaluate(LABELS_JS, "pca-2d")
            assert label_problems(flat) == []
            assert sorted(lb["text"] for lb in flat["labels"]) == sorted(wp.words)
            solid = page.evaluate(LABELS_JS, "pca-3d")
            assert label_problems(solid) == []
            shown = [lb["text"] for lb in solid["labels"]]
            assert len(set(shown)) == len(shown) >= 50 and set(shown) <= set(wp.words)
            assert sorted(pt["text"] for pt in solid["points"]) == sorted(wp.words)
            # the figures keep their size (labels are placed in pixels): a narrow window scrolls them
            sizes = page.evaluate("() => ['pca-3d', 'pca-2d'].map((id) => document.getElementById(id).getBoundingClientRect().width)")
            assert sizes == [1150, 1150]
        page.click("#pca-3d .updatemenu-button >> nth=1")   # the random directions: their own labels
        page.wait_for_function("() => document.getElementById('pca-3d')._fullLayout.scene.xaxis.title.text.startsWith('random')")
        page.wait_for_timeout(300)
        rnd = page.evaluate(LABELS_JS, "pca-3d")
        assert label_problems(rnd) == [] and len(rnd["labels"]) >= 40
        assert {pt["text"] for pt in rnd["points"]} == set(wp.words)
        assert errors == []
        browser.close()
