"""Rendering of :class:`vocablens.accounting.anatomy.Anatomy`: a side-by-side rich table and a report section.

Several models are shown in columns, one quantity per row; the seeds' advice is to compare models
by their non-embedding parameters, so that row is highlighted and a ratio to the first model given.

The ``anatomy`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from typing import Sequence

from rich.table import Table

from vocablens.accounting.anatomy import WEIGHT_FORMATS, Anatomy
from vocablens.render.html import Section, esc, figure_html, table_html
from vocablens.units import fmt_bytes  # noqa: F401  (re-exported: the one byte renderer)
from vocablens.render.renderer import Renderer


# ---------------------------------------------------------------------------------------- formatting
def fmt_count(n: int) -> str:
    """An exact integer with a short form: ``596,049,920 (596.0 M)``."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n:,} ({n / div:.1f} {unit})"
    return f"{n:,}"


def fmt_flops(n: float) -> str:
    """FLOPs with an SI prefix: ``311.2 MFLOP``."""
    for unit, div in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{int(n):,} FLOP"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def anatomy_json(results: Sequence[Anatomy]) -> dict:
    """The dict ``anatomy --json`` prints: ``{"models": [Anatomy.to_dict(), ...]}``, one entry per model
    (also for one model: one schema whatever the number of models)."""
    return {"models": [a.to_dict() for a in results]}


def anatomy_rows(results: Sequence[Anatomy]) -> list[tuple[str, list[str]]]:
    """The table's rows: ``(label, [cell per model])`` — shared by the terminal and the HTML report."""
    first = results[0]
    lg = first.logits
    rows: list[tuple[str, list[str]]] = [
        ("family", [a.family for a in results]),
        ("vocabulary V (matrix rows)", [f"{a.vocab_size:,}" for a in results]),
        ("tokenizer tokens", [f"{a.tokenizer_vocab_size:,}" if a.tokenizer_vocab_size is not None else "unknown"
                              for a in results]),
        ("d_model", [f"{a.d_model:,}" + (f" (rows {a.d_emb:,})" if a.d_emb != a.d_model else "") for a in results]),
        ("layers", [str(a.n_layers) for a in results]),
        ("tied head", ["yes" if a.tied else "no" for a in results]),
        ("parameters, total", [fmt_count(a.params_total) for a in results]),
        ("embedding V·d", [f"{fmt_count(a.params_embedding)}, {_pct(a.embedding_share)}" for a in results]),
        ("LM head, extra", [("0 (tied)" if a.params_unembedding == 0 else fmt_count(a.params_unembedding))
                            for a in results]),
        ("learned positions", [f"{a.params_position:,}" for a in results]),
    ]
    if any(a.params_vision or a.params_projector for a in results):  # a vision-language model's other side
        rows += [("vision tower", [fmt_count(a.params_vision) for a in results]),
                 ("vision projector", [fmt_count(a.params_projector) for a in results])]
    rows += [
        ("NON-EMBEDDING (compare by this)", [fmt_count(a.params_non_embedding) for a in results]),
    ]
    if len(results) > 1:
        rows.append(("non-embedding vs first", [f"{a.params_non_embedding / first.params_non_embedding:.2f}x"
                                                for a in results]))
    rows.append(("embedding + head share", [_pct(a.vocab_share) for a in results]))
    for k in WEIGHT_FORMATS:
        rows.append((f"one matrix, {k}", [fmt_bytes(a.matrix_bytes[k]) for a in results]))
    for k in WEIGHT_FORMATS:
        rows.append((f"whole model, {k}", [fmt_bytes(a.model_bytes[k]) for a in results]))
    if any(a.stored_bytes is not None for a in results):
        rows.append(("whole model, as stored", [f"{fmt_bytes(a.stored_bytes)} ({a.stored_as})" if a.stored_bytes
                                                is not None else "(not loaded)" for a in results]))
    rows += [
        ("LM head FLOPs/token 2·V·d", [fmt_flops(a.flops_head) for a in results]),
        ("non-embedding FLOPs/token 2·N", [fmt_flops(a.flops_non_embedding) for a in results]),
        (f"attention FLOPs/token @ {lg.context:,} ctx", [fmt_flops(a.flops_attention) for a in results]),
        ("forward FLOPs/token", [fmt_flops(a.flops_forward) for a in results]),
        ("LM head share of forward", [f"{_pct(a.head_share)} ({_pct(a.head_share_no_attention)} w/o attention)"
                                      for a in results]),
        (f"logits [{lg.batch}, {lg.context:,}, V] {lg.dtype}", [fmt_bytes(a.logits.bytes_all_positions)
                                                               for a in results]),
        (f"logits, last position only [{lg.batch}, V]", [fmt_bytes(a.logits.bytes_last_position) for a in results]),
        ("saved by last-position head", [f"{fmt_bytes(a.logits.bytes_saved)}, {100 * a.logits.saving:.2f}%"
                                         for a in results]),
        ("counted from", [a.source for a in results]),
    ]
    return rows


FORMULAS = (
    "non-embedding N = total - embedding - untied head - learned positions; forward FLOPs/token = 2N + 2·V·d "
    "+ 2·n_layer·n_ctx·d_attn (Kaplan et al. 2020, Table 1; d_attn = heads x head_dim; the head's 2·V·d counts "
    "even when tied). Bytes: fp32 4, bf16 2, fp8 1, int4 0.5 per parameter, weights only."
)


def anatomy_table(results: Sequence[Anatomy]) -> Table:
    """A rich table, one column per model."""
    t = Table(title="anatomy of the vocabulary borders", title_justify="left", caption=FORMULAS,
              caption_justify="left")
    t.add_column("", style="bold")
    for a in results:
        t.add_column(a.name, justify="right")
    for label, cells in anatomy_rows(results):
        style = "bold green" if label.startswith("NON-EMBEDDING") else None
        t.add_row(label, *cells, style=style)
    return t


def print_anatomy(results: Sequence[Anatomy], console) -> None:
    """Print the table and each model's notes on a rich ``console`` (the CLI's stdout console)."""
    out = console
    out.print(anatomy_table(results))
    for a in results:
        for n in a.notes:
            out.print(f"{a.name}: {n}", style="dim")


def params_figure(results: Sequence[Anatomy]):
    """Plotly stacked bar: non-embedding / embedding / extra head / positions, per model."""
    import plotly.graph_objects as go

    names = [a.name for a in results]
    fig = go.Figure()
    for label, vals, color in (
        ("non-embedding", [a.params_non_embedding for a in results], "#4c78a8"),
        ("embedding", [a.params_embedding for a in results], "#f58518"),
        ("untied LM head", [a.params_unembedding for a in results], "#e45756"),
        ("learned positions", [a.params_position for a in results], "#72b7b2"),
    ):
        if any(vals):
            fig.add_bar(y=names, x=vals, name=label, orientation="h", marker_color=color,
                        hovertemplate="%{y}: %{x:,} " + label + "<extra></extra>")
    # legend above the plot area (never over the bars), in the bars' own left-to-right order
    fig.update_layout(barmode="stack", height=190 + 40 * len(results), margin=dict(l=10, r=10, t=50, b=40),
                      xaxis_title="parameters",
                      legend=dict(orientation="h", traceorder="normal", x=0, xanchor="left", y=1.02,
                                  yanchor="bottom"))
    fig.update_yaxes(ticksuffix="  ")  # a gap between the model's name and its bar
    return fig


def anatomy_section(results: Sequence[Anatomy], div_id: str = "anatomy-params") -> Section:
    """The report's anatomy section: the side-by-side table and a stacked bar of the parameters."""
    results = list(results)
    rows = anatomy_rows(results)
    table = table_html(["", *[a.name for a in results]], [[label, *cells] for label, cells in rows])
    notes = "".join(f"<li>{esc(a.name)}: {esc(n)}</li>" for a in results for n in a.notes)
    body = (f"<p>{esc(FORMULAS)}</p>{table}"
            + (f"<ul class='notes'>{notes}</ul>" if notes else "")
            + figure_html(params_figure(results), div_id))
    return Section(id="anatomy", title="Anatomy: parameters, bytes and FLOPs of the two borders", html=body)


# ---------- the renderers of an anatomy result (vocablens.handle.results.Anatomy)
def _models(r) -> list[Anatomy]:
    """The anatomies ``r`` holds: one model's (``m.anatomy()``) or several side by side (the ``anatomy``
    command given several models: a tuple)."""
    return list(r.value) if isinstance(r.value, (list, tuple)) else [r.value]


def _json_of(r) -> dict:
    return anatomy_json(_models(r))


def _print_of(r, out) -> None:
    print_anatomy(_models(r), out)


def _figure_of(r):
    """The report's parameter bars."""
    return params_figure(_models(r))


def _rows_of(r) -> list[dict]:
    """One row of the anatomy's scalar fields per model."""
    return [{k: v for k, v in a.to_dict().items() if not isinstance(v, (dict, list))} for a in _models(r)]


#: how an ``anatomy`` result shows itself
RENDERER = Renderer("anatomy", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "anatomy_rows", "anatomy_table", "print_anatomy", "anatomy_section", "params_figure",
           "fmt_bytes", "fmt_count", "fmt_flops"]
