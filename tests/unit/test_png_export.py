"""A result's ``.figure()`` saves as PNG with the ``image`` extra (kaleido, in the test extra) and README's
Chromium (issue 48, item 10: ``fig.write_image`` raised "Image export requires the Kaleido package"):
the file is a PNG of the figure's size in pixels, and it is not a blank page."""

from __future__ import annotations

import struct

import pytest

from browser import CHROMIUM
from tiny_dirs import save_tiny, tiny_tokenizer


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("png") / "m", tiny_tokenizer())
    return vocablens.load(str(d))


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first, right after the 8-byte signature)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_a_figure_writes_a_png_of_its_size(m, tmp_path, monkeypatch):
    import numpy as np
    from matplotlib.image import imread

    from vocablens.render.figures import save_figure

    if not CHROMIUM:
        pytest.fail("Chromium is not installed: apt-get install -y --no-install-recommends chromium "
                    "(README's test command does)")
    monkeypatch.setenv("BROWSER_PATH", CHROMIUM)  # README's Chromium: kaleido downloads nothing
    fig = m.lens("the cat sat on the mat", k=2).figure()
    fig.update_layout(width=640, height=360)
    out = tmp_path / "lens.png"
    fig.write_image(out)  # plotly's own call, as a user types it
    assert _png_size(out.read_bytes()) == (640, 360)
    pixels = imread(out)  # [H, W, 3 or 4] floats in 0..1
    assert pixels.shape[:2] == (360, 640)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50  # the heatmap's colours, not a blank page
    fig = m.trajectory("the cat sat on the mat", kinds=("logit",)).figure()
    saved = save_figure(fig, tmp_path / "trajectory.png")  # what --plot f.png writes
    assert _png_size(saved.read_bytes()) == (fig.layout.width or 700, fig.layout.height or 500)  # plotly's default when unset


def test_no_browser_is_one_line(m, tmp_path, monkeypatch):
    from vocablens.errors import BadInput
    from vocablens.render.figures import save_figure

    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    monkeypatch.setenv("PATH", str(tmp_path))  # and none on PATH
    with pytest.raises(BadInput, match=r"needs Chrome or Chromium for kaleido \(Debian/Ubuntu: apt-get install chromium"):
        save_figure(m.lens("the cat", k=2).figure(), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
