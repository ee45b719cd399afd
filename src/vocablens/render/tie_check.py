"""Tying checked by storage and by value (:meth:`vocablens.Model.tie_check`,
:class:`~vocablens.geometry.tying.TieCheck`): its JSON, its table and its one row, registered as
:data:`RENDERER`."""

from __future__ import annotations

from vocablens.render.json import json_ready
from vocablens.render.renderer import Renderer


# ---------- the renderers of a tie_check result (vocablens.handle.results.TieCheck)
def _json_of(r) -> dict:
    return json_ready(r.value.to_dict())


def _print_of(r, out) -> None:
    from rich.table import Table

    t = Table(title="tying: by storage and by value", title_justify="left")
    t.add_column("")
    t.add_column("", justify="right")
    for k, v in r.value.to_dict().items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    out.print(t)


def _rows_of(r) -> list[dict]:
    """One row of the check's scalar fields."""
    return [{k: v for k, v in r.value.to_dict().items() if not isinstance(v, (dict, list))}]


#: how a ``tie_check`` result shows itself
RENDERER = Renderer("tie_check", _json_of, _print_of, None, _rows_of)

__all__ = ["RENDERER"]
