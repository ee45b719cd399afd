"""Renderers (:mod:`vocablens.render.shown`) of the lens results whose workflows moved from the CLI into
:class:`vocablens.Model`: lenses compared on the same held-out tokens (``lens eval --kind K1,K2,...``),
the backward lens (``lens backward``) and a Jacobian lens fitted (``lens fit-jacobian``). Each JSON
and each printed table is what that command printed before; each entry here is
``(to_json, print, figure or None, rows or None)``."""

from __future__ import annotations

from typing import Callable

from vocablens.models.tokens import token_str


# ------------------------------------------------------------------------------------ lens compare
def _json_compare(r) -> dict:
    from vocablens.render.compare import comparison_to_dict

    o = r.options
    return comparison_to_dict(r.value, r.provenance, o["lenses"], o["data"], o.get("plot"))


def _print_compare(r, out) -> None:
    from vocablens.render.compare import print_comparison

    print_comparison(r.value, out, title=r.options["table_title"])


def _figure_compare(r):
    """The three panels ``lens eval --plot`` writes, with its title."""
    from vocablens.render.compare import comparison_figure

    return comparison_figure(r.value, r.options["title"])


def _rows_compare(r) -> list[dict]:
    """A row per (layer, lens): KL, CE (nats), bits per byte, entropy (nats), top-1 agreement."""
    from vocablens.lens.compare import METRICS

    res = r.value
    return [{"layer": i, "kind": k, **{m: res.metrics[k][m][i] for m in METRICS}}
            for i in range(res.n_layers + 1) for k in res.kinds]


# ---------------------------------------------------------------------------------------- backward
def _json_backward(r) -> dict:
    from vocablens.render.backward import backward_json

    return backward_json(r.value, r.tokenizer, r.provenance)


def _print_backward(r, out) -> None:
    from vocablens.render.backward import print_backward

    print_backward(r.value, r.tokenizer, out, r.provenance)


def _figure_backward(r):
    from vocablens.render.backward import backward_figure

    return backward_figure(r.value, r.tokenizer)


def _rows_backward(r) -> list[dict]:
    """A row per (layer, rank): the gradient's norm and the target's score at the layer, the token
    promoted at that rank and its score."""
    res = r.value
    return [{"layer": ly, "rank": j + 1, "grad_norm": float(res.grad_norm[ly]),
             "target_score": float(res.target_score[ly]), "id": int(i), "token": token_str(r.tokenizer, int(i)),
             "score": float(res.top_scores[ly, j])}
            for ly in range(int(res.top_ids.shape[0])) for j, i in enumerate(res.top_ids[ly].tolist())]


# ---------------------------------------------------------------------------------- jacobian fit
def _json_fit(r) -> dict:
    from vocablens.render.backward import fit_summary_to_dict

    o = r.options
    return fit_summary_to_dict(r.value, o.get("out"), o["seconds"], o["stored_dtype"], r.provenance)


def _print_fit(r, out) -> None:
    from vocablens.render.backward import print_fit_summary

    print_fit_summary(r.value, r.options.get("out"), r.options["seconds"], out)


# ------------------------------------------------------------------------------------ decompose
def _json_decompose(r) -> dict:
    """``{"layer", "position", "token", "terms": [{"id", "token", "coef", "unit_coef"}], "norm", "residual_norm",
    "fve", "fve_path", "lens", "model"}``."""
    v, o = r.value, r.options
    terms = [{"id": int(i), "token": token_str(r.tokenizer, int(i)), "coef": float(c), "unit_coef": float(u)}
             for i, c, u in zip(v.ids.tolist(), v.coef.tolist(), v.unit_coef.tolist())]
    return {"layer": v.layer, "position": o["position"], "token": token_str(r.tokenizer, o["ids"][o["position"]]),
            "terms": terms, "norm": v.norm_h, "residual_norm": v.residual_norm, "fve": v.fve,
            "fve_path": list(v.fve_path), "lens": o["lens"], "model": r.provenance.to_dict()}


def _print_decompose(r, out) -> None:
    from rich.table import Table

    d = _json_decompose(r)
    t = Table(title=f"layer {d['layer']}, position {d['position']} ('{d['token']}') as Jacobian-lens token "
                    f"directions (nonnegative OMP)", title_justify="left")
    for col in ("token", "coefficient", "on the unit direction"):
        t.add_column(col, justify="left" if col == "token" else "right")
    for term in d["terms"]:
        t.add_row(f"'{term['token']}'", f"{term['coef']:.4f}", f"{term['unit_coef']:.3f}")
    out.print(t)
    out.print(f"||h|| = {d['norm']:.3f}, residual {d['residual_norm']:.3f}, fraction of ||h||² explained "
              f"{d['fve']:.3f}", style="dim")


#: kind -> (to_json, print, figure or None, rows or None)
RENDERERS: dict[str, tuple[Callable, Callable, Callable | None, Callable | None]] = {
    "lens_compare": (_json_compare, _print_compare, _figure_compare, _rows_compare),
    "backward": (_json_backward, _print_backward, _figure_backward, _rows_backward),
    "jacobian_fit": (_json_fit, _print_fit, None, None),
    "decompose": (_json_decompose, _print_decompose, None, None),
}

__all__ = ["RENDERERS"]
