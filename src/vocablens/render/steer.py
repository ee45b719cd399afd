"""Rendering of a steering run (``vocablens steer``): the ``--json`` dict and the terminal tables.
Computes nothing: the vectors, their top tokens and the effect come from :mod:`vocablens.vocab_space.steer`
and :mod:`vocablens.vocab_space.steer_eval`.

The ``steer`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vocablens.models.tokens import quoted, token_str
from vocablens.render.renderer import Renderer

#: the two token sets, always both in ``mass_*`` (null for a set not given): one schema
SETS = ("promote", "suppress")


def vector_rows(vectors, tops: list[list[int]], tokenizer) -> list[dict[str, Any]]:
    """One row per chosen vector: ``{"role", "block", "neuron", "z", "factor", "top_tokens"}``; ``block``
    is the block 0..L-1 the neuron lives in; ``tops[i]`` the ids vector i pushes up (promote, ablate) or
    down (suppress)."""
    return [{"role": v.role, "block": v.block, "neuron": v.neuron, "z": round(v.z, 4), "factor": v.factor,
             "top_tokens": [token_str(tokenizer, i) for i in top]} for v, top in zip(vectors, tops)]


def continuation(eff, tokenizer) -> dict[str, str] | None:
    """``{"before", "after"}``: the greedy continuations as text, or None when none was asked for."""
    if eff.continuation_before is None:
        return None
    return {"before": tokenizer.decode(eff.continuation_before), "after": tokenizer.decode(eff.continuation_after)}


def steer_to_dict(sets: dict[str, list[int]], rows: list[dict], eff, tokenizer, *, top_n: int, scale: float,
                  suppress_mode: str, saved: str | None, provenance=None) -> dict[str, Any]:
    """The dict ``steer --json`` prints. ``mass_before``/``mass_after`` (mean next-token probability of
    each set over the probe positions) and ``mass_per_position`` hold both sets, null for a set not given."""
    def per(d, k):
        return d[k] if k in d else None

    out: dict[str, Any] = {}
    if provenance is not None:
        out["model"] = provenance.to_dict()
    out.update({
        "promote": [token_str(tokenizer, i) for i in sets["promote"]],
        "suppress": [token_str(tokenizer, i) for i in sets["suppress"]],
        "top_n": top_n, "scale": scale, "suppress_mode": suppress_mode, "vectors": rows,
        "mass_before": {k: per(eff.mean_mass_before, k) for k in SETS},
        "mass_after": {k: per(eff.mean_mass_after, k) for k in SETS},
        "mass_per_position": {k: ({"before": eff.mass_before[k].tolist(), "after": eff.mass_after[k].tolist()}
                                  if k in eff.mass_before else None) for k in SETS},
        "perplexity_before": eff.ppl_before, "perplexity_after": eff.ppl_after,
        "continuation": continuation(eff, tokenizer), "saved": saved,
    })
    return out


def vectors_table(rows: list[dict]) -> Table:
    """The chosen vectors: role, block, neuron, z, factor and what each pushes."""
    t = Table(title="value vectors chosen (z: the token set's z-score among the vector's logits; tokens: what "
                    "the vector pushes up, or down for a suppressor)")
    for c in ("role", "block", "neuron", "z", "factor", "tokens"):
        t.add_column(c, justify="right" if c in ("block", "neuron", "z", "factor") else "left")
    for r in rows:
        t.add_row(r["role"], str(r["block"]), str(r["neuron"]), f"{r['z']:+.2f}", f"{r['factor']:g}",
                  " ".join(quoted(s) for s in r["top_tokens"]))
    return t


def effect_table(eff) -> Table:
    """Mass of each token set and held-out perplexity, before and after."""
    m = Table(title="effect (mean next-token probability of each set over the probe positions)")
    for c in ("measure", "before", "after", "ratio"):
        m.add_column(c, justify="left" if c == "measure" else "right")
    for k in eff.mean_mass_before:
        a, z = eff.mean_mass_before[k], eff.mean_mass_after[k]
        m.add_row(f"mass of the {k} set", f"{a:.4g}", f"{z:.4g}", f"{z / a:.3f}x" if a > 0 else "-")
    m.add_row("held-out perplexity", f"{eff.ppl_before:.3f}", f"{eff.ppl_after:.3f}",
              f"{eff.ppl_after / eff.ppl_before:.3f}x")
    return m


def print_steer(out, rows: list[dict], eff, tokenizer, saved_to: str = "") -> None:
    """Print the vectors table, the effect table, the continuations and the saved directory on ``out``."""
    out.print(vectors_table(rows))
    out.print(effect_table(eff))
    cont = continuation(eff, tokenizer)
    if cont:
        out.print(f"before: {cont['before']!r}")
        out.print(f"after:  {cont['after']!r}")
    if saved_to:
        out.print(f"wrote the steered model to {saved_to} (reloads with AutoModelForCausalLM)")


# ---------- the renderers of a steer result (vocablens.handle.results.Steering)
def _json_of(r) -> dict:
    o = r.options
    return steer_to_dict(o["sets"], o["rows"], r.value, r.tokenizer, top_n=o["top_n"], scale=o["scale"],
                         suppress_mode=o["suppress_mode"], saved=o.get("saved"), provenance=r.provenance)


def _print_of(r, out) -> None:
    print_steer(out, r.options["rows"], r.value, r.tokenizer, saved_to=r.options.get("saved_to") or "")


def _rows_of(r) -> list[dict]:
    """A row per chosen vector: its role, block, neuron, z-score, factor and top tokens."""
    return [dict(row) for row in r.options["rows"]]


#: how a ``steer`` result shows itself
RENDERER = Renderer("steer", _json_of, _print_of, None, _rows_of)
