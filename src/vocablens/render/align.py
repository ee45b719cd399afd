"""Rendering of a parameter alignment between two models: JSON, the per-block table, best matches.
Blocks count 0..L-1 (block i reads stream layer i and writes layer i+1).

The ``align`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table

from vocablens.vocab_space.align import Alignment
from vocablens.models.tokens import quoted, token_str
from vocablens.render.renderer import Renderer


def _unit(what: str) -> str:
    return "neuron" if what == "ffn" else "head"


#: the order of the best pairs, in words (the table's caption and ``--json``'s ``best_matches_order``)
PAIR_ORDER = ("by correlation, highest first, compared at the 3 decimals the table shows (so the float "
              "rounding of another CPU cannot reorder ties); ties by block of A, then unit of A")


def best_pairs(res: Alignment, n: int) -> list[tuple[int, int, int, int, float]]:
    """The ``n`` matched pairs with the highest correlation: (block_a, unit_a, block_b, unit_b, corr).

    Order (:data:`PAIR_ORDER`): sorted by ``(-round(corr, 3), block_a, unit_a)``, stated and
    deterministic: aligning a model with itself gives hundreds of correlation-1.000 ties, whose order
    would otherwise follow the last bits of each machine's float rounding."""
    rows = []
    for m in res.matches:
        ok = ~torch.isnan(m.corr)
        for i in ok.nonzero().flatten().tolist():
            rows.append((m.block_a, i, m.block_b, int(m.partner[i]), float(m.corr[i])))
    return sorted(rows, key=lambda r: (-round(r[4], 3), r[0], r[1]))[:n]


def alignment_to_dict(res: Alignment, top: list[dict[str, Any]]) -> dict[str, Any]:
    """Plain data for ``--json``: the block map, each block's matching summary, the best pairs:
    ``{"what", "unit", "shared_tokens", "identical_vocabularies", "blocks_a", "blocks_b",
    "block_similarity" [A][B], "blocks": [{"block_a", "block_b", "units", "matched_mean_corr",
    "identity_fraction", "partner"}], "best_matches": [{"block_a", "unit_a", "block_b", "unit_b", ...}]}``."""
    return {
        "what": res.what,
        "unit": _unit(res.what),
        "shared_tokens": res.shared.size,
        "identical_vocabularies": res.shared.identical,
        "blocks_a": res.blocks_a,
        "blocks_b": res.blocks_b,
        "block_similarity": [[round(float(x), 6) for x in row] for row in res.block_similarity],
        "blocks": [{"block_a": m.block_a, "block_b": m.block_b, "units": int(m.partner.numel()),
                    "matched_mean_corr": round(m.mean_corr, 6),
                    "identity_fraction": round(float((m.partner == torch.arange(m.partner.numel())).float().mean()), 6),
                    "partner": m.partner.tolist()} for m in res.matches],
        "best_matches": top,
        "best_matches_order": PAIR_ORDER,
    }


def top_matches(res: Alignment, top_tokens, n: int) -> list[dict[str, Any]]:
    """The ``n`` best pairs with the top tokens of both units (``top_tokens(side, block, unit)`` -> names)."""
    return [{"block_a": la, "unit_a": ua, "block_b": lb, "unit_b": ub, "corr": round(c, 6),
             "top_tokens_a": top_tokens("a", la, ua), "top_tokens_b": top_tokens("b", lb, ub)}
            for la, ua, lb, ub, c in best_pairs(res, n)]


def alignment_tables(res: Alignment, top: list[dict[str, Any]], name_a: str, name_b: str) -> list[Table]:
    """Two rich tables: per block of A its best block of B (mean best and matched correlation), and the
    best matched pairs with their top tokens."""
    unit = _unit(res.what)
    t = Table(title=f"{name_a} -> {name_b}: each block's most similar block ({unit}s matched one-to-one)")
    for c in ("block A", "block B", f"{unit}s", "mean best corr", "matched mean corr", "same index"):
        t.add_column(c, justify="right")
    for i, m in enumerate(res.matches):
        j = res.blocks_b.index(m.block_b)
        same = float((m.partner == torch.arange(m.partner.numel())).float().mean())
        t.add_row(str(m.block_a), str(m.block_b), str(m.partner.numel()),
                  f"{float(res.block_similarity[i, j]):.3f}", f"{m.mean_corr:.3f}", f"{same:.1%}")
    b = Table(title=f"best matched {unit}s and what they promote", caption=f"order: {PAIR_ORDER}")
    for c in ("A", "B", "corr", "A's top tokens", "B's top tokens"):
        b.add_column(c, justify="right" if c in ("A", "B", "corr") else "left")
    for r in top:
        b.add_row(f"{r['block_a']}/{r['unit_a']}", f"{r['block_b']}/{r['unit_b']}", f"{r['corr']:.3f}",
                  " ".join(quoted(s) for s in r["top_tokens_a"]), " ".join(quoted(s) for s in r["top_tokens_b"]))
    return [t, b]


def token_names(tokenizer, ids: list[int]) -> list[str]:
    return [token_str(tokenizer, i) for i in ids]


# ---------- the renderers of an align result (vocablens.handle.results.Alignment)
def _json_of(r) -> dict:
    other = r.options.get("other")
    return {**alignment_to_dict(r.value, r.options["best"]),
            "model_a": None if r.provenance is None else r.provenance.to_dict(),
            "model_b": None if other is None else other.to_dict()}


def _print_of(r, out) -> None:
    res = r.value
    vocab = "identical vocabularies" if res.shared.identical else f"{res.shared.size:,} shared tokens (mapped by string)"
    out.print(f"{res.what}: {vocab}; units compared by the correlation of their vocabulary-space projections")
    for t in alignment_tables(res, r.options["best"], *r.options["names"]):
        out.print(t)


def _rows_of(r) -> list[dict]:
    """A row per best-matching pair of units listed (``align --json``'s ``best_matches``)."""
    return [dict(p) for p in r.options["best"]]


#: how an ``align`` result shows itself
RENDERER = Renderer("align", _json_of, _print_of, None, _rows_of)
