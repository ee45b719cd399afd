"""A token's trajectory through the layers (``m.trajectory(...)``; the explorer's ``/api/trajectory``):
the explorer's rank-and-probability plot, drawn in Python for ``.figure()``."""

from __future__ import annotations

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


__all__ = ["COLOURS", "trajectory_plot"]
