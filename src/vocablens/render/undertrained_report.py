"""The report's section on under-trained tokens: counts per class, the verified list, and the
indicator against the verification probability (plotly, as the report's other figures)."""

from __future__ import annotations

from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.render.tokens import display_token
from vocablens.undertrained.analysis import UndertrainedResult

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


__all__ = ["undertrained_figure", "undertrained_section", "verdicts_of"]
