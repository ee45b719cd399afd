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
    with pytest.raises(BadInput, match=r"--plot must end in \.html"):
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
