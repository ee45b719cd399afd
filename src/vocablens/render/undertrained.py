"""Rendering of under-trained tokens (``vocablens undertrained``): JSON, rich tables."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from vocablens.models.tokens import token_str
from vocablens.render.tokens import shown
from vocablens.undertrained.analysis import UndertrainedResult
from vocablens.undertrained.beside import NO_SCAN, overlap, verdict_tensor

#: candidate rows shown in the terminal table (JSON has them all)
TABLE_ROWS = 40


def _f(x, nd: int = 6):
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def undertrained_to_dict(res: UndertrainedResult, tokenizer, argmax: list[str] | None = None) -> dict:
    """The one JSON shape of ``vocablens undertrained --json``.

    Fields: ``vocab_size``, ``counts`` (rows per class), ``indicator`` {``name``, ``why``,
    ``reference``: {``kind``, ``ids``}}, ``n_candidates``, ``indicator_threshold``,
    ``verification`` {``threshold``, ``templates``, ``examples``, ``ran``}, ``n_verified``,
    ``verified_ids``, ``argmax_scan`` (bool), ``overlap`` (null without a scan), ``timings_s``, and
    ``tokens``: one entry per candidate, lowest indicator first: ``id``, ``token`` (plain text),
    ``class``, ``indicator``, ``max_prob`` (null when not verified), ``verdict``, ``argmax``.
    """
    v = res.verification
    am = verdict_tensor(argmax, res.candidates)
    tokens = []
    for row, a in zip(res.rows(), am):
        tokens.append({"id": row["id"], "token": token_str(tokenizer, row["id"]), "class": row["class"],
                       "indicator": _f(row["indicator"]),
                       "max_prob": None if row["max_prob"] is None else float(f"{row['max_prob']:.4g}"),
                       "verdict": row["verdict"], "argmax": a})
    ov = None
    if argmax is not None and v is not None:
        o = overlap(res, argmax)
        ov = {"verified": o.verified, "cannot_win": o.cannot_win, "both": o.both,
              "verified_but_argmaxable": o.verified_but_argmaxable,
              "cannot_win_but_trained": o.cannot_win_but_trained,
              "cannot_win_not_tested": o.cannot_win_not_tested, "ids_both": list(o.ids_both)}
    ind = res.indicators
    return {
        "vocab_size": res.vocab_size,
        "counts": res.counts(),
        "indicator": {"name": ind.name, "why": ind.why,
                      "reference": {"kind": ind.reference_kind, "ids": ind.reference.tolist()}},
        "n_candidates": int(res.candidates.numel()),
        "indicator_threshold": _f(res.indicator_threshold),
        "verification": {"ran": v is not None, "threshold": 0.01 if v is None else v.threshold,
                         "templates": [] if v is None else list(v.templates),
                         "examples": [] if v is None else [{"id": e, "token": token_str(tokenizer, e)}
                                                           for e in v.examples]},
        "n_verified": int(res.verified.numel()),
        "verified_ids": res.verified.tolist(),
        "argmax_scan": argmax is not None,
        "overlap": ov,
        "timings_s": {k: round(float(s), 3) for k, s in res.seconds.items()},
        "tokens": tokens,
    }


def undertrained_tables(d: dict, rows: int = TABLE_ROWS) -> list:
    """Rich renderables from :func:`undertrained_to_dict`'s dict: counts per class, the indicator
    line, the candidates (verified first, then the rest; at most ``rows``), the overlap."""
    out: list = []
    t = Table(title=f"tokenizer classes ({d['vocab_size']:,} rows)")
    t.add_column("class")
    t.add_column("rows", justify="right")
    for k, n in d["counts"].items():
        if k != "padding" or n:
            t.add_row(k.replace("_", " "), f"{n:,}")
    out.append(t)
    ind = d["indicator"]
    out.append(f"indicator: {ind['name']} ({ind['why']}); reference: {ind['reference']['kind']}")
    ver = d["verification"]
    if ver["ran"]:
        out.append(f"{d['n_candidates']} lowest-indicator candidates prompted to repeat themselves "
                   f"({', '.join(ver['templates'])}); {d['n_verified']} verified under-trained "
                   f"(max probability < {ver['threshold']:g})")
    else:
        out.append(f"{d['n_candidates']} lowest-indicator candidates (not verified)")
    toks = sorted(d["tokens"], key=lambda r: (r["verdict"] != "under-trained", r["indicator"]))
    t = Table(title="candidates: verified under-trained first, lowest indicator first")
    for c, j in (("id", "right"), ("token", "left"), ("class", "left"), ("indicator", "right"),
                 ("max p", "right"), ("verdict", "left"), ("argmax", "left")):
        t.add_column(c, justify=j)
    for r in toks[:rows]:
        p = "" if r["max_prob"] is None else f"{r['max_prob']:.2e}"
        t.add_row(str(r["id"]), shown(r["token"]), r["class"].replace("_", " "), f"{r['indicator']:.4f}", p,
                  r["verdict"], r["argmax"] if r["argmax"] != NO_SCAN else Text("no scan", style="dim"))
    out.append(t)
    if len(toks) > rows:
        out.append(f"... {len(toks) - rows} more candidates (--json lists them all)")
    o = d["overlap"]
    if o is not None:
        out.append(f"beside the argmax scan: {o['verified']} verified under-trained, {o['cannot_win']} cannot win; "
                   f"{o['both']} in both, {o['verified_but_argmaxable']} under-trained yet argmaxable, "
                   f"{o['cannot_win_but_trained']} cannot win yet repeated (trained), "
                   f"{o['cannot_win_not_tested']} cannot win and not among the candidates")
    elif not d["argmax_scan"]:
        out.append("argmax: no scan given (run `vocablens argmax --json > scan.json`, then --argmax scan.json)")
    return out


__all__ = ["undertrained_to_dict", "undertrained_tables", "TABLE_ROWS"]
