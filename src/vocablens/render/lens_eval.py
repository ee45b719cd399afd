"""A tuned lens evaluated against the logit lens (``lens eval``, :meth:`vocablens.Model.eval_lens`): its
JSON, table, figure (KL, cross-entropy and top-1 agreement per layer; Belrose et al. 2023, Fig. 3) and
rows, registered as :data:`RENDERER`."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from vocablens.lens.evaluate import LensEval
from vocablens.render.renderer import Renderer


def _f(x: float) -> str:
    """At most 5 characters: 114, 13.2, 1.31, nan."""
    if x != x:
        return "nan"
    a = abs(x)
    return f"{x:.0f}" if a >= 99.95 else f"{x:.1f}" if a >= 9.995 else f"{x:.2f}"


def eval_table(res: LensEval, title: str = "") -> Table:
    """One row per layer: KL, CE (nats and bits/byte), entropy, top-1 agreement, logit | tuned."""
    from rich import box

    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False,
              show_edge=False)
    t.add_column("layer", justify="right", min_width=2, no_wrap=True)
    for name in ("KL\nlogit", "KL\ntuned", "CE\nlogit", "CE\ntuned", "bpb\nlogit", "bpb\ntuned",
                 "H\nlogit", "H\ntuned", "top1\nlogit", "top1\ntuned"):
        t.add_column(name, justify="right", no_wrap=True)
    for i in range(res.n_layers + 1):
        better = res.tuned_kl[i] < res.logit_kl[i]
        t.add_row(str(i), _f(res.logit_kl[i]),
                  (Text(_f(res.tuned_kl[i]), style="green") if better else _f(res.tuned_kl[i])),
                  _f(res.logit_ce[i]), _f(res.tuned_ce[i]),
                  _f(res.logit_bpb[i]), _f(res.tuned_bpb[i]),
                  _f(res.logit_entropy[i]), _f(res.tuned_entropy[i]),
                  _f(res.logit_top1[i]), _f(res.tuned_top1[i]))
    return t


def print_eval(res: LensEval, out, title: str = "") -> None:
    """Print :func:`eval_table` and a one-line verdict to the rich console ``out`` (stdout)."""
    out.print(eval_table(res, title))
    n_better = sum(res.tuned_kl[i] < res.logit_kl[i] for i in range(res.n_layers))
    out.print(f"tuned KL below logit KL at {n_better} of {res.n_layers} layers 0..{res.n_layers - 1} "
              f"({res.tokens} tokens; KL, CE, entropy in nats; bpb = bits per byte)")


def _series(res: LensEval, unit: str = "nats") -> dict[str, dict[str, list[float]]]:
    ce = (res.logit_ce, res.tuned_ce) if unit == "nats" else (res.logit_bpb, res.tuned_bpb)
    return {"logit": {"kl": res.logit_kl, "ce": ce[0], "top1_agreement": res.logit_top1},
            "tuned": {"kl": res.tuned_kl, "ce": ce[1], "top1_agreement": res.tuned_top1}}


def eval_figure(res: LensEval, title: str = "", unit: str = "nats"):
    """A plotly figure: KL, cross-entropy and top-1 agreement per layer, logit vs tuned (layers on x;
    :func:`vocablens.render.lens_compare.panels_figure`).

    Args:
        unit: the cross-entropy's unit, ``nats`` or ``bpb`` (bits per byte, Belrose et al. 2023, Fig. 3).

    Raises:
        BadInput: another unit, or ``bpb`` of an evaluation that did not count the text's bytes.
    """
    from vocablens.errors import BadInput
    from vocablens.render.lens_compare import PANELS, panels_figure

    if unit not in ("nats", "bpb"):
        raise BadInput(f"unit must be nats or bpb; got {unit!r}")
    if unit == "bpb" and not res.n_bytes:
        raise BadInput("bits per byte need the bytes of the text scored; this evaluation has none")
    titles = [p[1] for p in PANELS]
    if unit == "bpb":
        titles[1] = "CE vs next token (bits per byte)"
    return panels_figure(res.n_layers, _series(res, unit), title, titles)


def save_eval_plot(res: LensEval, path: str | Path, title: str = "") -> Path:
    """Write the evaluation plot: ``.html`` (plotly, self-contained) or ``.png`` (matplotlib), atomically."""
    from vocablens.render.lens_compare import save_panels

    return save_panels(path, res.n_layers, _series(res), title,
                       png_titles=("KL to final (nats)", "CE vs next token (nats)", "top-1 agreement"))


def eval_to_dict(res: LensEval, provenance, lens_label: str, data: dict, plot: str | Path | None = None,
                 lenses: list[dict] | None = None) -> dict:
    """The dict ``lens eval --json`` prints: :meth:`LensEval.to_dict` plus ``model`` (provenance),
    ``lens`` (which lens), ``lenses`` (the tuned lens's provenance record,
    :func:`vocablens.render.lens.lens_record`), ``data`` (the evaluation corpus record) and ``plot``
    (the plot's path, null without ``--plot``: one schema either way, as ``settle --json``)."""
    d = res.to_dict()
    d.update({"model": provenance.to_dict(), "lens": lens_label, "lenses": list(lenses or []), "data": data,
              "plot": str(plot) if plot is not None else None})
    return d


# ---------- the renderers of a lens_eval result (vocablens.handle.results.LensEval)
def _json_of(r) -> dict:
    o = r.options
    return eval_to_dict(r.value, r.provenance, o["label"], o["data"], o.get("plot"), o["lenses"])


def _print_of(r, out) -> None:
    o = r.options
    print_eval(r.value, out, title=f"{r.provenance.name}, {o['tokens']} tokens of {o['data']['corpus']} "
                                   f"({o['split']}), lens {o['label']}")


def _figure_of(r, unit: str = "nats"):
    """KL, cross-entropy (``unit``: nats or bpb) and top-1 agreement per layer, logit vs tuned."""
    return eval_figure(r.value, r.options.get("title", ""), unit)


def _rows_of(r) -> list[dict]:
    """A row per (lens, stream layer): KL to the final distribution, cross-entropy (nats), bits per
    byte, entropy (nats) and top-1 agreement, as ``lens eval --json`` names them."""
    return [{"kind": kind, "layer": ly["layer"], **ly[kind]} for kind in ("logit", "tuned")
            for ly in r.value.to_dict()["layers"]]


#: how a ``lens_eval`` result shows itself
RENDERER = Renderer("lens_eval", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "eval_figure", "eval_table", "eval_to_dict", "print_eval", "save_eval_plot"]
