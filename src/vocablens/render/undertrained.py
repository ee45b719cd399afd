"""Under-trained tokens (``vocablens undertrained``, :meth:`vocablens.Model.undertrained`): JSON, rich
tables, the report's section and its indicator-vs-probability figure, and rows, registered as
:data:`RENDERER`."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from vocablens.models.tokens import token_str
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.renderer import Renderer, model_of
from vocablens.render.tokens import display_token, shown
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


#: colour per verdict in the figure
_COLOURS = {"under-trained": "#e4572e", "trained": "#2e86ab"}


def undertrained_figure(res: UndertrainedResult, tokenizer):
    """Scatter of the verified candidates: indicator (x) against the highest repeat probability (y,
    log scale), one trace per verdict, the 0.01 threshold as a dotted line; legend below the x axis."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = [r for r in res.rows() if r["max_prob"] is not None]
    for verdict, colour in _COLOURS.items():
        sel = [r for r in rows if r["verdict"] == verdict]
        fig.add_trace(go.Scatter(
            x=[r["indicator"] for r in sel], y=[max(r["max_prob"], 1e-12) for r in sel], mode="markers",
            name=f"{verdict} ({len(sel)})", marker=dict(color=colour, size=7, opacity=0.8),
            text=[f"{display_token(tokenizer, r['id'])} (id {r['id']})" for r in sel],
            hovertemplate="%{text}<br>indicator %{x:.4f}<br>max p %{y:.2e}<extra></extra>"))
    thr = res.verification.threshold if res.verification is not None else 0.01
    fig.add_hline(y=thr, line_dash="dot", line_color="#888")
    fig.update_xaxes(title_text=f"indicator ({res.indicators.name.replace('_', ' ')}; low = candidate)",
                     title_standoff=4)
    fig.update_yaxes(title_text="highest repeat probability", type="log", title_standoff=4)
    fig.update_layout(height=420, margin=dict(l=70, r=20, t=20, b=110),
                      legend=dict(orientation="h", x=0, xanchor="left", y=-0.22, yanchor="top",
                                  bgcolor="rgba(0,0,0,0)"))
    return fig


def undertrained_section(res: UndertrainedResult, tokenizer, argmax_verdicts: list[str] | None = None,
                         div_id: str = "undertrained-scatter") -> Section:
    """Report section: counts per class, the indicator and its reference, the verified list, the
    figure, and (with the argmax scan's verdicts) how many verified tokens also cannot win."""
    c = res.counts()
    count_rows = [[k.replace("_", " "), f"{n:,}"] for k, n in c.items() if k != "padding" or n]
    ind = res.indicators
    v = res.verification
    n_c, n_v = int(res.candidates.numel()), int(res.verified.numel())
    parts = [
        "<p>Tokens training never reached keep rows near their initialisation; prompted with one, a model "
        "misbehaves (Land &amp; Bartolo 2024, “Fishing for Magikarp”). Every token is classed by the "
        "tokenizer; an indicator read off the matrices ranks the rest; the lowest-indicator candidates are "
        "prompted to repeat themselves, and a token whose highest probability stays below "
        f"{(v.threshold if v else 0.01):g} is verified under-trained.</p>",
        table_html(["class", "rows"], count_rows),
        f"<p class='note'>Indicator: <b>{esc(ind.name.replace('_', ' '))}</b> ({esc(ind.why)}); reference: "
        f"{esc(ind.reference_kind)}.</p>",
    ]
    if v is None:
        parts.append(f"<p class='note'>{n_c:,} lowest-indicator candidates, not verified.</p>")
    else:
        parts.append(f"<p>{n_c:,} lowest-indicator candidates prompted ({esc(', '.join(v.templates))}): "
                     f"<b>{n_v:,} verified under-trained</b>; prompting them took {v.seconds:.1f} s.</p>")
        parts.append(figure_html(undertrained_figure(res, tokenizer), div_id))
        rows = []
        for r in res.rows():
            if r["verdict"] == "under-trained":
                rows.append([r["id"], display_token(tokenizer, r["id"]), r["class"].replace("_", " "),
                             f"{r['indicator']:.4f}", f"{r['max_prob']:.2e}"])
        if rows:
            parts.append(table_html(["id", "token", "class", "indicator", "max p"], rows))
    if argmax_verdicts is not None and v is not None:
        from vocablens.undertrained.beside import overlap

        o = overlap(res, argmax_verdicts)
        parts.append(f"<p class='note'>Beside the argmax scan above: of the {o.verified} verified under-trained "
                     f"tokens, {o.both} also cannot win and {o.verified_but_argmaxable} can win; "
                     f"{o.cannot_win} tokens cannot win at all. “Never trained” and “cannot win” are "
                     "different sets.</p>")
    return Section(id="undertrained", title="Under-trained tokens", html="".join(parts))


def verdicts_of(scan, vocab_size: int) -> list[str] | None:
    """The argmax verdict per row of the report's argmax section (None when it did not run)."""
    if scan is None:
        return None
    from vocablens.undertrained.beside import argmax_verdicts

    return argmax_verdicts(scan, vocab_size)


# ---------- the renderers of an undertrained result (vocablens.handle.results.Undertrained)
def _json_of(r) -> dict:
    return {**undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts")), **model_of(r)}


def _print_of(r, out) -> None:
    for t in undertrained_tables(undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts"))):
        out.print(t)


def _figure_of(r):
    """The report's indicator-vs-probability scatter."""
    return undertrained_figure(r.value, r.tokenizer)


def _rows_of(r) -> list[dict]:
    """A row per token listed by ``undertrained --json`` (the verified candidates, lowest indicator
    first): its class, indicator, highest probability when prompted, verdict."""
    return undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts"))["tokens"]


#: how an ``undertrained`` result shows itself
RENDERER = Renderer("undertrained", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "undertrained_to_dict", "undertrained_tables", "TABLE_ROWS", "undertrained_figure", "undertrained_section", "verdicts_of"]
