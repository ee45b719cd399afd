"""Rendering of an anomaly run (``vocablens lens anomaly``): the ``--json`` dict and the terminal
tables. Computes nothing: the scores and AUROCs come from :func:`vocablens.lens.anomaly.detect`.

The ``anomaly`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from vocablens.render.renderer import Renderer


def anomaly_to_dict(rep, kinds, detectors, texts: list[str], labels, provenance=None) -> dict[str, Any]:
    """The dict ``lens anomaly --json`` prints: ``{"model", "kinds", "detectors", "n_normal", "n_test",
    "auroc" ({"kind/detector": AUROC} or null without two classes of labels), "inputs": [{"index",
    "label", "text" (first 200 characters), "scores": {"kind/detector": score}}]}``; higher = odder."""
    out: dict[str, Any] = {}
    if provenance is not None:
        out["model"] = provenance.to_dict()
    out.update({"kinds": list(kinds), "detectors": list(detectors),
                "n_normal": rep.n_normal, "n_test": rep.n_test, "auroc": rep.auroc or None,
                "inputs": [{"index": i, "label": None if labels is None else int(labels[i]),
                            "text": texts[i][:200],
                            "scores": {k: round(float(v[i]), 6) for k, v in rep.scores.items()}}
                           for i in range(rep.n_test)]})
    return out


def auroc_table(rep, detectors) -> Table | None:
    """AUROC per trajectory group (rows) and detector (columns), or None without AUROCs."""
    if not rep.auroc:
        return None
    t = Table(title="AUROC (test labels: 1 = odd)")
    t.add_column("trajectories")
    for d in detectors:
        t.add_column(d, justify="right")
    groups = sorted({k.split("/")[0] for k in rep.auroc}, key=lambda g: (len(g), g))
    for g in groups:
        t.add_row(g, *[f"{rep.auroc[f'{g}/{d}']:.3f}" for d in detectors])
    return t


def scores_table(rep, texts: list[str], labels) -> Table:
    """One row per test input: index, label (when given), the input's start, its score per detector."""
    t = Table(title="scores per test input")
    t.add_column("#", justify="right")
    if labels is not None:
        t.add_column("label", justify="right")
    t.add_column("input")
    keys = list(rep.scores)
    for k in keys:
        t.add_column(k, justify="right")
    for i, text in enumerate(texts):
        short = text.replace("\n", "⏎")[:48] + ("…" if len(text) > 48 else "")
        row = [str(i)] + ([str(int(labels[i]))] if labels is not None else []) + [short]
        t.add_row(*row, *[f"{float(rep.scores[k][i]):.3f}" for k in keys])
    return t


def print_anomaly(out, rep, detectors, texts: list[str], labels) -> None:
    """Print the summary line, the AUROC table (when labelled) and the scores table on ``out``."""
    out.print(f"fitted on {rep.n_normal} normal inputs; {rep.n_test} test inputs; higher score = odder")
    t = auroc_table(rep, detectors)
    if t is not None:
        out.print(t)
    out.print(scores_table(rep, texts, labels))


# ---------- the renderers of an anomaly result (vocablens.handle.results.Anomaly)
def _json_of(r) -> dict:
    o = r.options
    return anomaly_to_dict(r.value, o["kinds"], o["detectors"], o["texts"], o["labels"], r.provenance)


def _print_of(r, out) -> None:
    o = r.options
    print_anomaly(out, r.value, o["detectors"], o["texts"], o["labels"])


def _rows_of(r) -> list[dict]:
    """A row per test input: its index, label and text, and a column per ``kind/detector`` score."""
    o, rep = r.options, r.value
    return [{"index": i, "label": None if o["labels"] is None else int(o["labels"][i]), "text": o["texts"][i],
             **{k: float(v[i]) for k, v in rep.scores.items()}} for i in range(rep.n_test)]


#: how an ``anomaly`` result shows itself
RENDERER = Renderer("anomaly", _json_of, _print_of, None, _rows_of)
