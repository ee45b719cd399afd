"""docs/quickstart.ipynb, executed with nbclient on a fresh kernel (as the tour is,
tests/integration/test_tour_notebook.py): each step is one call on ``m = vocablens.load("smollm2")``
and shows its result -- the batch lens's figure, neighbours as a DataFrame, a score, the tuned lens
beside the logit lens, a token added and verified -- and loading prints no progress bar and no
IProgress warning. It loads the real default model, so it is marked slow."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"


def _text(output) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", output.get("data", {}).get("text/html", "")))


@pytest.mark.slow
def test_quickstart_runs_one_call_per_step_and_each_result_shows_itself(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))  # the kernel imports this checkout's vocablens
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # one call on m per step (the load cell: import, load, show)
    assert all(c.source.count("m.") <= 1 for c in code[1:]), [c.source for c in code]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outs = [o for c in code for o in c.outputs]
    assert not [o for o in outs if o.output_type == "error"]
    streams = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "IProgress" not in streams and "it/s]" not in streams and "%|" not in streams, streams
    load, lens, neighbors, score, both, expand = code
    assert "SmolLM2-135M-Instruct" in load.outputs[-1]["data"]["text/plain"]
    fig = lens.outputs[-1]["data"]["application/vnd.plotly.v1+json"]["data"][0]
    assert fig["type"] == "heatmap" and len(fig["x"]) == 3 and fig["y"][-1] == 30  # 3 prompts, layers 0..30
    assert fig["text"][-1][0] == "␣Paris"                                          # layer 30, first prompt
    _assert_static_png(lens.outputs[-1])  # and the static image GitHub and nbviewer show
    table = _text(neighbors.outputs[-1])
    assert all(w in table for w in ("query", "matrix", "cosine", " king", " Paris")) and "<table" in \
        neighbors.outputs[-1]["data"]["text/html"]
    assert "per-token log-probabilities (nats)" in _text(score.outputs[-1]) and "bits/byte" in _text(score.outputs[-1])
    shown = _text(both.outputs[-1])
    assert "logit lens at position" in shown and "tuned lens at position" in shown
    tuned = shown[shown.index("tuned lens at position"):]
    row25 = next(line for line in tuned.splitlines() if line.startswith("│    25 "))
    assert row25.split("│")[2].strip().startswith("' Paris'")  # the tuned lens reads ' Paris' at layer 25
    added = _text(expand.outputs[-1])
    assert "vocablens" in added and "verif" in added.lower()


def _assert_static_png(output) -> None:
    """A figure's output holds, beside plotly's JSON, a PNG of the figure's own size (issue 48, item 15:
    on GitHub and nbviewer, which do not run plotly.js, the figure was blank)."""
    import base64
    import struct

    data = output["data"]
    png = base64.b64decode(data["image/png"])
    layout = data["application/vnd.plotly.v1+json"]["layout"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (layout.get("width", 700), layout.get("height", 500))


def test_the_stored_quickstart_keeps_a_static_image_beside_each_figure():
    import json

    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    figures = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures
    for o in figures:
        _assert_static_png(o)


def test_the_stored_quickstart_shows_its_outputs_and_no_machine_path():
    """The notebook is stored executed (its outputs shown where it is opened): every code cell has its
    output, none an error, none a path of the machine that ran it, and no cell keeps run timestamps."""
    import json

    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] for c in code)
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not [c for c in code if "execution" in c.get("metadata", {})]
    shown = json.dumps([c["outputs"] for c in code])
    found = re.findall(r"(?:/home/|/Users/|/root/|/tmp/|/work/|/private/|[A-Za-z]:\\\\|\.cache/)[^\"\s]*", shown)
    assert not found, found
