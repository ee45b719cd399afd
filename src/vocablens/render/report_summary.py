"""What ``vocablens report`` prints on stdout: a summary, not the report again.

One line per figure a reader acts on (how much of the model the two matrices are, where the lens's
prediction settles, how many tokens can never win, how many are under-trained, what was cut short and
the command that completes it), then the path of the page that holds the rest. Every figure is read off
the dict ``report --json`` prints (:func:`vocablens.render.report.report_to_dict`), so the summary and the
JSON never disagree.
"""

from __future__ import annotations


def _count(n: int) -> str:
    """``134.5M``, ``28.3K``, ``812``: a parameter count in a few characters."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _leads_from(lens: dict) -> int | None:
    """The first stream layer from which the final top-1 is the lens's top-1 at every later layer, at the
    last position read (None when it never is)."""
    ranks = [layer["positions"][-1]["final_top1_rank"] for layer in lens["layers"]]
    first = None
    for layer, rank in zip((ly["layer"] for ly in lens["layers"]), ranks):
        first = (first if first is not None else layer) if rank == 0 else None
    return first


def _lens_line(d: dict) -> str | None:
    lens = d.get("lens")
    if not lens or not lens.get("layers"):
        return None
    final = lens["final_top1"][-1]
    L = lens["n_layers"]
    line = f"prediction {final!r}: the logit lens reads it first from layer {_leads_from(lens)} of {L}"
    tuned = d.get("tuned_lens")
    if tuned and tuned.get("layers"):
        line += f", the tuned lens from layer {_leads_from(tuned)}"
    return line


def _anatomy_line(d: dict) -> str | None:
    a = d.get("anatomy")
    if not a:
        return None
    tied = "tied: one matrix" if a["tied"] else "untied"
    both = a["params_embedding"] + (0 if a["tied"] else a["params_unembedding"])
    return (f"parameters {_count(a['params_total'])}; the embedding and the LM head {_count(both)} "
            f"({a['vocab_share']:.0%}; {tied}); the head {a['head_share']:.0%} of a forward's FLOPs")


def _argmax_line(d: dict) -> str | None:
    am = d.get("argmax")
    if not am:
        return None
    c = am["counts"]
    line = f"argmax: {c['unargmaxable']} of {am['vocab_size']} tokens can never be the top prediction"
    if c.get("duplicate"):
        line += f", {c['duplicate']} duplicate rows"
    if c.get("undecided"):  # a count proved so far, not a finding about the rest
        line += f" (proved within the budget; {c['undecided']} undecided, not counted)"
    return line


def _undertrained_line(d: dict) -> str | None:
    u = d.get("undertrained")
    if not u:
        return None
    ver = u.get("verification") or {}
    if not ver.get("ran"):
        return f"under-trained: {u['n_candidates']} candidates by the indicator (not verified)"
    shown = [repr(x["token"]) for x in u.get("tokens") or [] if x.get("verdict") == "under-trained"][:4]
    return (f"under-trained: {u['n_verified']} of {u['n_candidates']} candidates verified under-trained"
            + (f" (e.g. {', '.join(shown)})" if shown else ""))


def _settle_line(d: dict) -> str | None:
    s = d.get("settle")
    if not s or s.get("mean_settle_layer") is None:
        return None
    return (f"predictions settle at layer {s['mean_settle_layer']:.1f} of {s['n_layers']} on average "
            f"({s['n_positions']} corpus positions)")


def summary_lines(d: dict) -> list[str]:
    """The summary of a report, from the dict ``report --json`` prints: one line per figure a reader acts
    on, one per section cut short (its reason names the command that completes it), and last the page's
    path, size and the time taken.

    Args:
        d: :func:`vocablens.render.report.report_to_dict` of the run (``out``, ``model``, the sections'
            dicts, ``cut_short``, ``timings_s``).
    """
    from pathlib import Path

    lines = [f"vocablens report: {d['model'].get('name') or 'model'}"]
    for build in (_anatomy_line, _lens_line, _settle_line, _argmax_line, _undertrained_line):
        line = build(d)
        if line:
            lines.append("  " + line)
    for key, why in (d.get("cut_short") or {}).items():
        lines.append(f"  cut short: {key}: {why}")
    out, t = Path(d["out"]), d.get("timings_s") or {}
    size = out.stat().st_size / 2**20 if out.exists() else 0.0
    lines.append(f"wrote {out} ({size:.1f} MiB) in {t.get('total', 0.0):.1f} s (load {t.get('load', 0.0):.1f} s): "
                 "every section, its figures and notes")
    return lines


__all__ = ["summary_lines"]
