"""The record every kind of result registers its renderers in (:data:`vocablens.render.shown.RENDERERS`
gathers one per kind), and the helpers those renderers share.

A result (duck-typed: ``kind``, ``value``, ``tokenizer``, ``provenance``, ``options``) is shown four
ways, each by one function of the module named for its kind (``vocablens.render.argmax`` for
``argmax``): its ``--json`` dict, the table its command prints, the figure the report or the explorer
draws, and the rows of its ``to_pandas()`` frame.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from vocablens.errors import BadInput


@dataclass(frozen=True)
class Renderer:
    """The renderers of one kind of result.

    Attributes:
        kind: the result's ``kind`` (:mod:`vocablens.handle.results`: ``"argmax"``, ``"lens"`` ...).
        to_json: ``to_json(r) -> dict``: what ``vocablens COMMAND --json`` prints for the same call
            (tensors and NaN made JSON-ready by :func:`vocablens.render.shown.to_json`).
        table: ``table(r, out)``: prints what the command prints on the rich console ``out``.
        figure: ``figure(r, **options)``: the plotly figure the report or explorer draws; None: drawn nowhere.
        frame: ``frame(r) -> list[dict]``: a row per item of the result; None: not tabular.
    """

    kind: str
    to_json: Callable[..., dict]
    table: Callable[..., None]
    figure: Callable | None = None
    frame: Callable[..., list[dict]] | None = None


def model_of(r) -> dict:
    """``{"model": provenance}`` for a result with a provenance, else ``{}``: what most JSONs end with."""
    return {"model": r.provenance.to_dict()} if r.provenance is not None else {}


def draw(builder: Callable, r, **options):
    """``builder(r, **options)``, an option the builder does not take refused first.

    Raises:
        BadInput: an option the figure does not take (the lens trajectories' ``colour`` and the lens
            evaluation's ``unit`` are the only ones of the figures here).
    """
    takes = set(inspect.signature(builder).parameters) - {"r"}
    if set(options) - takes:
        raise BadInput(f"a {r.kind} figure takes no option {', '.join(sorted(set(options) - takes))}"
                       + (f"; it takes {', '.join(sorted(takes))}" if takes else ""))
    return builder(r, **options)


__all__ = ["Renderer", "draw", "model_of"]
