"""Writing one figure to a file: ``.html`` (plotly, plotly.js inlined, opens with no network) or an
image (``.png``, ``.svg``, ``.pdf``, drawn with matplotlib), chosen by the path's suffix.

Every ``--plot FILE`` option goes through :func:`save_figure`, which writes through
:func:`vocablens.files.atomic_path` (a temporary file renamed into place, usual permissions).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from vocablens.errors import BadInput
from vocablens.files import atomic_path

HTML_SUFFIXES = (".html", ".htm")
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def figure_kind(path: str | os.PathLike) -> str:
    """``"html"`` or ``"image"`` from the path's suffix.

    Raises:
        BadInput: any other suffix (checked before any work, so a command can fail early).
    """
    suffix = Path(path).suffix.lower()
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in IMAGE_SUFFIXES:
        return "image"
    raise BadInput(f"`plot` must end in {', '.join(HTML_SUFFIXES + IMAGE_SUFFIXES)}; got {Path(path).name!r}")


def save_figure(fig_or_builder: Any | Callable[[str], Any], path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write a figure to ``path``, atomically; the suffix picks the format.

    Args:
        fig_or_builder: a plotly ``Figure`` (HTML; images need the ``image`` extra: kaleido and a
            Chrome or Chromium on the machine), or a
            callable ``builder(kind)`` with kind ``"html"`` or ``"image"`` that returns a plotly
            ``Figure`` or a matplotlib ``Figure`` (the usual pair: plotly for HTML, matplotlib for
            images, so no extra package is needed). matplotlib runs on its Agg backend.
        path: ``.html``/``.htm``, ``.png``, ``.svg`` or ``.pdf``.
        dpi: resolution of matplotlib raster images.

    Returns:
        The path written.

    Raises:
        BadInput: an unknown suffix, or a plotly figure for an image without kaleido or a browser.
        WriteFailed: the directory is missing, read-only or full (nothing written).
    """
    path = Path(path)
    kind = figure_kind(path)
    if kind == "image":
        import matplotlib

        matplotlib.use("Agg")
    fig = fig_or_builder(kind) if callable(fig_or_builder) and not hasattr(fig_or_builder, "to_html") \
        else fig_or_builder
    is_plotly = hasattr(fig, "to_html")
    if kind == "image" and is_plotly:
        try:
            import kaleido  # noqa: F401
        except ImportError:
            raise BadInput(f"writing {path.name} from a plotly figure needs the image extra "
                           "(pip install 'vocablens[image]': kaleido), or write .html") from None
    with atomic_path(path) as tmp:
        if is_plotly and kind == "html":
            fig.write_html(str(tmp), include_plotlyjs=True, full_html=True)
        elif is_plotly:
            _write_image(fig, tmp, path)
        else:
            try:
                fig.savefig(str(tmp), dpi=dpi, format=path.suffix.lower().lstrip("."))
            finally:
                import matplotlib.pyplot as plt

                plt.close(fig)
    return path


def _write_image(fig, tmp: Path, path: Path) -> None:
    """``fig.write_image(tmp)`` through kaleido, which drives a Chrome or Chromium found on the machine
    (``BROWSER_PATH``, else the usual names such as Debian's ``chromium``); it downloads nothing.

    Raises:
        BadInput: no such browser found (one line: how to install one).
    """
    try:
        fig.write_image(str(tmp))
    except RuntimeError as exc:
        if "requires Google Chrome" not in str(exc):
            raise
        raise BadInput(f"writing {path.name} needs Chrome or Chromium for kaleido (Debian/Ubuntu: apt-get "
                       "install chromium; or set BROWSER_PATH), or write .html") from None


__all__ = ["HTML_SUFFIXES", "IMAGE_SUFFIXES", "figure_kind", "save_figure"]
