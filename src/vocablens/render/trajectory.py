"""A token's trajectory through the layers (``m.trajectory(...)``; the explorer's ``/api/trajectory``):
the explorer's rank-and-probability plot, drawn in Python for ``.figure()``.

The ``trajectory`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from vocablens.models.tokens import token_str
from vocablens.render.renderer import Renderer, model_of

#: the explorer's colour of each lens kind (``serve/static/app.js``); other kinds take the next of
#: plotly's default colours
COLOURS = {"logit": "#0b5cad", "tuned": "#e4572e"}


def trajectory_plot(per_kind: dict, tokenizer):
    """The explorer's trajectory plot (a cell's "trajectory" panel): for each lens kind, the rank of
    the token followed (1 = top; log axis, top up) and its probability (right axis, 0..1) at every
    stream layer 0..L, as ``serve/static/app.js`` draws them.

    Args:
        per_kind: kind -> :class:`~vocablens.ops.TokenLogprobs` over the layers (``logprob`` [L+1] nats,
            ``target_rank`` [L+1], 0 = on top; ``topk_ids`` [L+1, k], the top-1 at each layer).
        tokenizer: decodes the top-1 tokens of the hover.
    """
    import plotly.graph_objects as go

    from vocablens.render.tokens import display_token

    fig = go.Figure()
    for name, t in per_kind.items():
        if t is None:
            continue
        layers = list(range(int(t.target_rank.numel())))
        colour = COLOURS.get(name)
        fig.add_trace(go.Scatter(x=layers, y=[int(r) + 1 for r in t.target_rank.tolist()], name=f"{name}: rank",
                                 mode="lines+markers", line={"color": colour},
                                 customdata=[display_token(tokenizer, int(i)) for i in t.topk_ids[:, 0].tolist()],
                                 hovertemplate="layer %{x}: rank %{y} (top-1 there: %{customdata})<extra></extra>"))
        fig.add_trace(go.Scatter(x=layers, y=t.logprob.exp().tolist(), name=f"{name}: p", yaxis="y2", mode="lines",
                                 line={"color": colour, "dash": "dot"},
                                 hovertemplate="layer %{x}: p=%{y:.4f}<extra></extra>"))
    fig.update_layout(margin={"l": 50, "r": 50, "t": 10, "b": 40}, height=300, legend={"orientation": "h", "y": 1.12},
                      xaxis={"title": {"text": "layer"}},
                      yaxis={"title": {"text": "rank (1 = top)"}, "type": "log", "autorange": "reversed"},
                      yaxis2={"title": {"text": "probability"}, "overlaying": "y", "side": "right", "range": [0, 1],
                              "tickmode": "linear", "tick0": 0, "dtick": 0.2, "showgrid": False})
    return fig


# ---------- the renderers of a trajectory result (vocablens.handle.results.Trajectory)
def _json_of(r) -> dict:
    """``{"tokens", "position", "token", "token_id", "n_layers", "logit": {"rank" [L+1], "prob" [L+1],
    "top1" [L+1]}, "tuned": ... or null (no tuned lens read), ..., "model"}``."""
    o, tok = r.options, r.tokenizer
    labels = o.get("input_labels") or [None] * len(o["input_ids"])  # image positions: <image k/n>
    out = {"tokens": [lb or token_str(tok, i) for i, lb in zip(o["input_ids"].tolist(), labels)],
           "position": o["position"],
           "token": token_str(tok, o["token_id"]), "token_id": o["token_id"], "n_layers": o["n_layers"]}
    for name in dict.fromkeys(["logit", "tuned", *r.value]):
        t = r.value.get(name)
        out[name] = None if t is None else {"rank": t.target_rank.tolist(), "prob": t.logprob.exp().tolist(),
                                            "top1": [token_str(tok, i) for i in t.topk_ids[:, 0].tolist()]}
    return {**out, **model_of(r)}


def _print_of(r, out) -> None:
    from rich.table import Table

    d = _json_of(r)
    kinds = [k for k in r.value]
    t = Table(title=f"{d['token']!r} at position {d['position']} ({d['tokens'][d['position']]!r}), every layer",
              title_justify="left")
    t.add_column("layer", justify="right")
    for k in kinds:
        t.add_column(f"{k} rank", justify="right")
        t.add_column(f"{k} prob", justify="right")
        t.add_column(f"{k} top-1")
    for layer in range(d["n_layers"] + 1):
        t.add_row(str(layer), *[x for k in kinds for x in (str(d[k]["rank"][layer]), f"{d[k]['prob'][layer]:.4f}",
                                                          repr(d[k]["top1"][layer]))])
    out.print(t)


def _figure_of(r):
    """The explorer's rank-and-probability plot."""
    return trajectory_plot(r.value, r.tokenizer)


def _rows_of(r) -> list[dict]:
    """A row per (lens kind, stream layer): the followed token's rank there (0 = on top), its
    probability, and the lens's top-1 token."""
    rows = []
    for kind, t in r.value.items():
        if t is None:
            continue
        for layer, (rank, lp, top) in enumerate(zip(t.target_rank.tolist(), t.logprob.exp().tolist(),
                                                    t.topk_ids[:, 0].tolist())):
            rows.append({"kind": kind, "layer": layer, "rank": int(rank), "prob": float(lp), "top1_id": int(top),
                         "top1": token_str(r.tokenizer, int(top))})
    return rows


#: how a ``trajectory`` result shows itself
RENDERER = Renderer("trajectory", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "COLOURS", "trajectory_plot"]
