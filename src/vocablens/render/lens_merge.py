"""How a merged Jacobian lens (``vocablens lens merge``: :class:`vocablens.handle.results.LensMerge`)
shows itself: its record as ``lens merge --json`` prints it, and the one line the command says."""

from __future__ import annotations

from vocablens.render.renderer import Renderer


def merged_line(rec: dict) -> str:
    """``merged 2 shards (64 prompts) into DIR``: the command's line for the record ``rec`` of
    :func:`vocablens.lens.jacobian_merge.merge_lens_files` (its ``out`` as the user gave it)."""
    return f"merged {len(rec['shards'])} shards ({rec['n_prompts']} prompts) into {rec['out']}"


def _json_of(r) -> dict:
    return dict(r.value)


def _print_of(r, out) -> None:
    out.print(merged_line(r.value), soft_wrap=True)


#: how a ``lens_merge`` result shows itself
RENDERER = Renderer("lens_merge", _json_of, _print_of)


__all__ = ["RENDERER", "merged_line"]
