"""docs/tour.ipynb, executed with nbclient on a fresh kernel: every cell runs, and each result displays
itself as HTML holding its key figures (vocablens.render.notebook). It loads the real default model, so
it is marked slow."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "tour.ipynb"


def _text(output) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", output.get("data", {}).get("text/html", "")))


@pytest.mark.slow
def test_tour_notebook_runs_and_every_result_displays_itself(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))  # the kernel imports this checkout's vocablens
    monkeypatch.setenv("TQDM_DISABLE", "1")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    cells = {c.source.splitlines()[-1]: c for c in nb.cells if c.cell_type == "code"}
    errors = [o for c in cells.values() for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    first = cells["borders.vocab_size, borders.d_emb, borders.n_layers, borders.tied"]
    assert first.outputs[-1]["data"]["text/plain"] == "(49152, 576, 30, True)"
    shown = {k: _text(c.outputs[-1]) for k, c in cells.items() if c.outputs and "text/html" in c.outputs[-1].get("data", {})}
    assert set(shown) == {"a", "lens", "vocablens.nearest_neighbors(borders, tok, [\" king\", \" Paris\"], k=5)", "s",
                          "vocablens.explain(borders, ids, k=3, n_sub=3)", "res"}
    assert "anatomy of the vocabulary borders" in shown["a"] and "28,311,552" in shown["a"]  # 49,152 x 576
    assert "final top-1 ' Paris'" in shown["lens"] and "max |Δp| = " in shown["lens"]
    assert "per-token log-probabilities (nats)" in shown["s"] and "perplexity" in shown["s"]
    assert "top-1 ' Paris'" in shown["vocablens.explain(borders, ids, k=3, n_sub=3)"]
    assert "argmax verdicts over 2,048 rows" in shown["res"]
    counts = eval(cells["res.counts()"].outputs[-1]["data"]["text/plain"])  # a dict literal of ints
    assert sum(counts.values()) == 2048 and counts["undecided"] == 0
    assert all(f"│ {k:<12} │ {n:>5,} │" in shown["res"] for k, n in counts.items())
