"""A residual-stream vector decomposed into Jacobian-lens token directions (``lens decompose``,
:meth:`vocablens.Model.decompose`, :class:`~vocablens.lens.decompose.Decomposition`): its JSON and its
table, registered as :data:`RENDERER`."""

from __future__ import annotations

from vocablens.models.tokens import token_str
from vocablens.render.renderer import Renderer


# ---------- the renderers of a decompose result (vocablens.handle.results.Decomposition)
def _json_of(r) -> dict:
    """``{"layer", "position", "token", "terms": [{"id", "token", "coef", "unit_coef"}], "norm", "residual_norm",
    "fve", "fve_path", "lens", "model"}``."""
    v, o = r.value, r.options
    terms = [{"id": int(i), "token": token_str(r.tokenizer, int(i)), "coef": float(c), "unit_coef": float(u)}
             for i, c, u in zip(v.ids.tolist(), v.coef.tolist(), v.unit_coef.tolist())]
    return {"layer": v.layer, "position": o["position"], "token": token_str(r.tokenizer, o["ids"][o["position"]]),
            "terms": terms, "norm": v.norm_h, "residual_norm": v.residual_norm, "fve": v.fve,
            "fve_path": list(v.fve_path), "lens": o["lens"], "model": r.provenance.to_dict()}


def _print_of(r, out) -> None:
    from rich.table import Table

    d = _json_of(r)
    t = Table(title=f"layer {d['layer']}, position {d['position']} ('{d['token']}') as Jacobian-lens token "
                    f"directions (nonnegative OMP)", title_justify="left")
    for col in ("token", "coefficient", "on the unit direction"):
        t.add_column(col, justify="left" if col == "token" else "right")
    for term in d["terms"]:
        t.add_row(f"'{term['token']}'", f"{term['coef']:.4f}", f"{term['unit_coef']:.3f}")
    out.print(t)
    out.print(f"||h|| = {d['norm']:.3f}, residual {d['residual_norm']:.3f}, fraction of ||h||² explained "
              f"{d['fve']:.3f}", style="dim")


#: how a ``decompose`` result shows itself
RENDERER = Renderer("decompose", _json_of, _print_of)

__all__ = ["RENDERER"]
