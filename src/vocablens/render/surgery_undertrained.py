"""Rendering of the surgery commands' under-training figures: ``trim --drop-undertrained``'s drop and
``expand``'s indicator of each new row (terminal and the ``--json`` parts)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from vocablens.render.tokens import shown
from vocablens.units import plural


def print_drop(drop, console) -> None:
    """What ``--drop-undertrained`` removed (a :class:`~vocablens.surgery.trim_undertrained.UndertrainedDrop`)."""
    console.print(f"under-trained: {plural(len(drop.verified), 'token')} verified of the {drop.candidates} "
                  f"lowest-indicator candidates ({drop.indicator.replace('_', ' ')}); "
                  f"{plural(drop.rows_dropped, 'row')} dropped for that reason "
                  f"({len(drop.seeds_dropped)} of them used by the corpus or the token list); "
                  f"{len(drop.kept_anyway)} kept anyway (bytes, merge parts, specials); "
                  f"{plural(drop.documents_respelled, 'corpus document')} held a dropped token (spelled with "
                  "other tokens now, left out of the check)")


def new_rows_to_dict(res, ind, tokenizer=None) -> dict:
    """``expand --json``'s ``indicator``: the indicator's ``name``, ``why``, the old vocabulary's
    candidate ``threshold`` and ``old_median``, and per new token ``id``, ``token``, ``value``,
    ``percentile`` (share of the old testable tokens below it) and ``looks_undertrained``."""
    return {**ind.to_dict(), "new_tokens": [{"id": t.id, "token": t.token, **r}
                                            for t, r in zip(res.new_tokens, ind.rows())]}


def new_rows_table(d: dict) -> Table:
    """The new rows on the model's under-training scale, from :func:`new_rows_to_dict`."""
    t = Table(title=f"new rows on the under-training indicator ({d['name'].replace('_', ' ')}; the old vocabulary's "
                    f"lowest 2% end at {d['threshold']:.4f}, its median is {d['old_median']:.4f})", title_justify="left")
    for c, j in (("token", "left"), ("id", "right"), ("indicator", "right"), ("old tokens below", "right"),
                 ("reads as", "left")):
        t.add_column(c, justify=j)
    for r in d["new_tokens"]:
        t.add_row(shown(r["token"]), str(r["id"]), f"{r['value']:.4f}", f"{r['percentile']:.1%}",
                  Text("under-trained", style="red") if r["looks_undertrained"] else "trained")
    return t


__all__ = ["print_drop", "new_rows_to_dict", "new_rows_table"]
