"""The self-contained HTML report: sections in, one HTML file out (plotly.js inlined once).

The page needs no network to open: plotly.js is embedded, there are no external fonts, images or
scripts. It is written to a temporary file beside the target and renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path

from vocablens.files import atomic_write, publish_mode  # noqa: F401  (publish_mode: old import path)
from vocablens.render.html import Section, esc
from vocablens.render.renderer import Renderer

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2433;background:#fafbfc}
header{background:#1d2433;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px 0;font-size:22px}
header p{margin:2px 0;font-size:13px;color:#c9d1e0}
nav{padding:10px 32px;background:#eef1f6;font-size:13px}
nav a{margin-right:14px;color:#2457c5;text-decoration:none}
main{padding:8px 32px 40px 32px;max-width:1280px}
section{background:#fff;border:1px solid #e3e7ee;border-radius:8px;padding:16px 20px;margin:18px 0}
section h2{margin-top:0;font-size:18px}
table.data{border-collapse:collapse;font-size:13px;margin:8px 0}
table.data th,table.data td{border:1px solid #dde2ea;padding:4px 8px;text-align:right}
table.data th{background:#f3f5f9}
table.data td:first-child,table.data th:first-child{text-align:left}
table.data td.txt,table.data th.txt{text-align:left}
.note{color:#5b6478;font-size:13px}
code,.tok{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;background:#f3f5f9;padding:0 3px;border-radius:3px}
.figure{margin:8px 0}
.scroll{overflow-x:auto}
.cards{display:flex;flex-wrap:wrap;gap:6px 22px;align-items:flex-start}
.card h3{margin:8px 0 2px 0;font-size:15px}
.budget{background:#fff8e6;border:1px solid #f0d48a;border-radius:8px;padding:8px 16px;margin:18px 0;font-size:13px}
.budget.ok{background:#eef6ee;border-color:#b7d7b7}
.cut{color:#8a5a00}
"""


def render_report(title: str, subtitle_lines: list[str], sections: list[Section], banner: str = "") -> str:
    """The whole report as one HTML string: header, navigation, ``banner`` (trusted HTML, e.g.
    :func:`cut_short_html`), sections, inlined plotly.js."""
    from plotly.offline import get_plotlyjs

    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{s.html}</section>' for s in sections
    )
    sub = "".join(f"<p>{esc(x)}</p>" for x in subtitle_lines)
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
        f"<header><h1>{esc(title)}</h1>{sub}</header><nav>{nav}</nav><main>{banner}{body}</main></body></html>"
    )


def report_sections(run, lm, model: str) -> list[Section]:
    """The page's sections from a :class:`vocablens.report.runner.ReportRun`, in its order.

    A section that was skipped becomes a short note saying how to get it; one that was cut short
    shows its result followed by what was left and the command that completes it.
    """
    from vocablens.render import vocab_space as rv
    from vocablens.render.anatomy import anatomy_section
    from vocablens.render.argmax import argmax_section
    from vocablens.render.borders import borders_section
    from vocablens.render.neighbors import neighbors_section
    from vocablens.render.pca import pca_section
    from vocablens.render.lens import lens_section
    from vocablens.render.tuned import tuned_lens_section

    tok, borders = lm.tokenizer, lm.borders
    out: list[Section] = []
    for sr in run.sections:
        key, res = sr.plan.key, sr.result
        if res is None and (key != "tuned" or sr.cut_short):
            out.append(Section(key.replace("_", "-"), sr.plan.title[:1].upper() + sr.plan.title[1:],
                               f"<p class='note cut'>{_prose(sr.cut_short or sr.note or 'not available')}</p>"))
            continue
        if key == "anatomy":
            sec = anatomy_section([res])
        elif key == "borders":
            sec = borders_section(borders, res, lm.provenance)
        elif key == "neighbors":
            sec = neighbors_section(res, tok)
        elif key == "pca":
            sec = pca_section(res)
        elif key == "lens":
            sec = lens_section(res, tok, run.prompt)
        elif key == "tuned":
            sec = (tuned_lens_section(*sr.extra["pair"], tok, sr.extra["lens"].info(),
                                      jacobian=sr.extra.get("jacobian"),
                                      jacobian_info=getattr(sr.extra.get("jacobian_lens"), "info", dict)())
                   if res is not None
                   else Section("tuned-lens", "Tuned lens", (
                       f"<p class='note'>No tuned lens for this model ({esc(sr.note)}). Train one with "
                       f"<code>vocablens lens train --model {esc(model)} --out DIR</code> and pass "
                       f"<code>--lens DIR</code>.</p>")))
        elif key == "argmax":
            sec = argmax_section(res, tok)
            sec = Section(sec.id, sec.title, sec.html + argmax_notes(res))
        elif key == "undertrained":
            from vocablens.render.undertrained import undertrained_section, verdicts_of

            sec = undertrained_section(res, tok, verdicts_of(run.result("argmax"), borders.vocab_size))
            if sr.extra.get("up_front"):  # said before the section ran: it cannot finish in its share
                sec = Section(sec.id, sec.title, f"<p class='note cut'>{_prose(sr.extra['up_front'])}.</p>" + sec.html)
        elif key == "value_vectors":
            sec = rv.value_vectors_report_section(sr.extra["searches"], res, sr.extra["interp"], tok)
        elif key == "explain":
            sec = rv.explanation_section(res, tok, run.prompt)
        else:
            sec = rv.settle_section(res)
        if sr.cut_short:
            sec = Section(sec.id, sec.title, sec.html + f"<p class='note cut'>Cut short: {_prose(sr.cut_short)}.</p>")
        out.append(sec)
    return out


def write_page(run, lm, model: str, out_path, budget_s: float) -> list[Section]:
    """Build the report's page for ``run`` on ``lm`` (loaded from ``model``) and write it to
    ``out_path`` atomically; returns its sections (:func:`report_sections`)."""
    sections = report_sections(run, lm, model)
    prov = lm.provenance
    html = render_report(
        f"vocablens report — {prov.name}",
        [f"Weights: {prov.describe()}", f"Prompt: {run.prompt!r}",
         f"Made {stamp()} by vocablens; analyses within a {budget_s:.0f} s budget"],
        sections, banner=cut_short_html(run),
    )
    write_atomic(out_path, html)
    return sections


def report_to_dict(run, lm, out_path, sections: list[Section], timings: dict[str, float]) -> dict:
    """The dict ``report --json`` prints: the output path, the model's provenance and borders, each
    section's result as its own command's ``--json`` builds it (null when the section did not run),
    ``lenses`` (the provenance of the tuned and Jacobian lenses the lens section read), the sections written, what was cut short, and the timings (seconds)."""
    from vocablens.render import vocab_space as rv
    from vocablens.render.argmax import argmax_to_dict
    from vocablens.render.neighbors import neighbors_to_dict
    from vocablens.render.lens import lens_to_dict
    from vocablens.render.undertrained import undertrained_to_dict

    tok, r = lm.tokenizer, run.result

    def part(key, build):
        return build(r(key)) if r(key) is not None else None

    return {
        "out": str(out_path),
        "model": lm.provenance.to_dict(),
        "borders": lm.borders.describe(),
        "anatomy": part("anatomy", lambda a: a.to_dict()),
        "tie_check": part("borders", lambda b: b.to_dict()),
        "neighbors": part("neighbors", lambda x: neighbors_to_dict(x, tok)),
        "lens": part("lens", lambda x: lens_to_dict(x, tok)),
        "tuned_lens": part("tuned", lambda x: lens_to_dict(x, tok)),
        "lenses": _lens_records(run.get("tuned")),
        "argmax": part("argmax", lambda x: argmax_to_dict(x, tok, per_token=False)),
        "explain": part("explain", lambda x: rv.explanation_to_dict(x, tok)),
        "settle": part("settle", rv.settle_to_dict),
        "undertrained": part("undertrained", lambda x: undertrained_to_dict(x, tok)),
        "sections": [s.id for s in sections],
        "cut_short": run.cut_short,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }


def _lens_records(sr) -> list[dict]:
    """``report --json``'s ``lenses``: the provenance record (:func:`vocablens.render.lens.lens_record`)
    of each translator the lens section read through (none when it did not run)."""
    from vocablens.render.lens import lens_record

    extra = getattr(sr, "extra", None) or {}
    return [lens_record(kd, extra[key]) for kd, key in (("tuned", "lens"), ("jacobian", "jacobian_lens"))
            if extra.get(key) is not None and getattr(sr, "result", None) is not None]


def argmax_notes(ma) -> str:
    """What the argmax section's final-norm table means: its "no" rows that are exact duplicates,
    and the two probability columns."""
    from vocablens.argmax import DUPLICATE

    parts = []
    reach = ma.reach
    if reach is not None and len(reach.tokens):
        no = [int(t) for q, t in enumerate(reach.tokens.tolist()) if int(reach.argmaxable[q]) == 0]
        dups = [t for t in no if int(ma.result.verdict[t]) == DUPLICATE]
        if dups:
            parts.append(
                f"{len(dups)} of the {len(no)} tokens marked \"no\" under the final norm are the exact "
                "duplicates listed above: bit-identical rows always tie, so none of them can be a strict "
                "argmax. They count as \"duplicate\", not as \"unargmaxable\", in the verdict table.")
        parts.append(
            f"Under the final norm: the {len(reach.tokens)} tokens of this table are the flagged ones first "
            "(not argmaxable, undecided, and one of each duplicate group; at most half of the rows), then the "
            "argmaxable tokens with the smallest margins, the closest to never winning. \"Max prob >=\" is a "
            "probability the token certainly reaches at some hidden state the norm can produce (found by "
            "search, so a lower bound on its best case), and \"max prob <=\" a proven upper bound on the "
            "highest probability it can ever get.")
        if " probe error " in getattr(ma, "norm_note", ""):
            parts.append(
                "The probe error is the largest difference seen between the model's own final norm and the "
                "gain·x/rms(x) model of it that the bounds use, on random inputs: a check that the model "
                "describes the norm, in the hidden state's units.")
    return "".join(f"<p class='note'>{esc(p)}</p>" for p in parts)


def _prose(text: str) -> str:
    """Escaped text with `backquoted` commands as ``<code>``."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text))


def cut_short_html(run) -> str:
    """The banner at the top of the page: what the budget did, true in every case: every section ran
    to completion (within the budget or, when the sections that always run took longer, over it),
    or which sections were cut short by their own cost and how to complete each."""
    items = "".join(f"<li><b>{esc(s.plan.title)}</b>: {_prose(s.cut_short)}</li>" for s in run.sections if s.cut_short)
    b, t = run.budget_s, run.seconds
    if not items:
        head = (f"All sections ran to completion in {t:.0f} s, within the report's {b:.0f} s budget." if t <= b else
                f"All sections ran to completion in {t:.0f} s, {t - b:.0f} s over the report's {b:.0f} s budget: "
                "the cheap sections always run, whatever they cost on this machine.")
        return f"<div class='budget ok'><p>{esc(head)}</p></div>"
    n = sum(1 for s in run.sections if s.cut_short)
    head = (f"{n} section{'' if n == 1 else 's'} did not run to completion ({t:.0f} s in all, budget {b:.0f} s); "
            "each says what was left and the command that completes it:")
    return f"<div class='budget'><p>{esc(head)}</p><ul>{items}</ul></div>"


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write the report's HTML to ``path`` through :func:`vocablens.files.atomic_write`.

    Raises:
        WriteFailed: the directory is missing, read-only or full (the target is untouched).
    """
    return atomic_write(path, text)


def stamp() -> str:
    """UTC time for the report header."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# ---------- the renderers of a report result (vocablens.handle.results.Report)
def _json_of(r) -> dict:
    p = r.value
    return report_to_dict(p.run, p.lm, p.out_path, p.sections, p.timings)


def _print_of(r, out) -> None:
    """The summary (:func:`vocablens.render.report_summary.summary_lines`): the figures a reader acts on,
    what was cut short, then the page's path; the page holds the rest."""
    from vocablens.render.report_summary import summary_lines

    for line in summary_lines(_json_of(r)):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


#: how a ``report`` result shows itself
RENDERER = Renderer("report", _json_of, _print_of)
