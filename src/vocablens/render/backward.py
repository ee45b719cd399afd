"""The backward lens (``lens backward``, :mod:`vocablens.lens.backward`): its ``--json`` dict, a rich table,
a heatmap and rows, registered as :data:`RENDERER`."""

from __future__ import annotations

from rich.table import Table

from vocablens.lens.backward import BackwardLens
from vocablens.models.tokens import token_str
from vocablens.render.renderer import Renderer


def backward_json(res: BackwardLens, tokenizer, provenance=None) -> dict:
    """``{"kind": "backward", "tokens", "position", "target", "target_id", "loss", "layers": [{"layer",
    "grad_norm", "target_score", "top_tokens", "top_ids", "top_scores"}], "model"}``: one entry per
    stream layer 0..L; the loss in nats, scores are ``W_U · (-∂loss/∂h_l)`` (logit units per unit step)."""
    d = {"kind": "backward", "tokens": [token_str(tokenizer, i) for i in res.input_ids.tolist()],
         "position": res.position, "target": token_str(tokenizer, res.target), "target_id": res.target,
         "loss": res.loss,
         "layers": [{"layer": ly, "grad_norm": float(res.grad_norm[ly]), "target_score": float(res.target_score[ly]),
                     "top_tokens": [token_str(tokenizer, i) for i in res.top_ids[ly].tolist()],
                     "top_ids": res.top_ids[ly].tolist(),
                     "top_scores": [round(float(x), 6) for x in res.top_scores[ly]]}
                    for ly in range(res.grads.shape[0])]}
    if provenance is not None:
        d["model"] = provenance.to_dict()
    return d


def backward_table(res: BackwardLens, tokenizer) -> Table:
    """One row per stream layer: |g|, the target's score and the top tokens of ``W_U (-g)``."""
    t = Table(title=f"backward lens: -log p({token_str(tokenizer, res.target)!r}, id {res.target}) = {res.loss:.3f} nats "
                    f"at position {res.position}", title_justify="left")
    t.add_column("layer", justify="right")
    t.add_column("|∂loss/∂h|", justify="right")
    t.add_column("target score", justify="right")
    t.add_column("tokens a descent step promotes")
    for ly in range(res.grads.shape[0]):
        toks = ", ".join(f"{token_str(tokenizer, i)!r}" for i in res.top_ids[ly].tolist())
        t.add_row(str(ly), f"{float(res.grad_norm[ly]):.3g}", f"{float(res.target_score[ly]):.3g}", toks)
    return t


def print_backward(res: BackwardLens, tokenizer, out, provenance=None) -> None:
    """Print :func:`backward_table` (and the model's provenance) to a rich console."""
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim", soft_wrap=True)
    out.print(backward_table(res, tokenizer))


def backward_figure(res: BackwardLens, tokenizer):
    """A plotly heatmap: one row per stream layer 0..L, one column per rank 1..k of ``W_U (-g_l)``, the
    cell's colour its score (logit units per unit step) and its text the token a descent step on that
    layer's stream promotes (Katz et al. 2024, §3: the gradient read in vocabulary space)."""
    import plotly.graph_objects as go

    n, k = int(res.top_ids.shape[0]), int(res.top_ids.shape[1])
    text = [[token_str(tokenizer, i) for i in row] for row in res.top_ids.tolist()]
    fig = go.Figure(go.Heatmap(z=res.top_scores.tolist(), x=[f"#{j + 1}" for j in range(k)], y=list(range(n)),
                               text=text, texttemplate="%{text}", colorscale="Viridis",
                               colorbar=dict(title="score"),
                               hovertemplate="layer %{y}, rank %{x}: %{text}<br>score %{z:.3g}<extra></extra>"))
    fig.update_layout(title=f"backward lens: -log p({token_str(tokenizer, res.target)!r}) = {res.loss:.3f} nats "
                            f"at position {res.position}", xaxis_title="rank", yaxis_title="layer",
                      height=max(300, 40 + 28 * n), margin=dict(l=40, r=20, t=60, b=40))
    return fig


# ---------- the renderers of a backward result (vocablens.handle.results.BackwardLens)
def _json_of(r) -> dict:
    return backward_json(r.value, r.tokenizer, r.provenance)


def _print_of(r, out) -> None:
    print_backward(r.value, r.tokenizer, out, r.provenance)


def _figure_of(r):
    """The tokens a descent step promotes at each layer."""
    return backward_figure(r.value, r.tokenizer)


def _rows_of(r) -> list[dict]:
    """A row per (layer, rank): the gradient's norm and the target's score at the layer, the token
    promoted at that rank and its score."""
    res = r.value
    return [{"layer": ly, "rank": j + 1, "grad_norm": float(res.grad_norm[ly]),
             "target_score": float(res.target_score[ly]), "id": int(i), "token": token_str(r.tokenizer, int(i)),
             "score": float(res.top_scores[ly, j])}
            for ly in range(int(res.top_ids.shape[0])) for j, i in enumerate(res.top_ids[ly].tolist())]


#: how a ``backward`` result shows itself
RENDERER = Renderer("backward", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "backward_figure", "backward_json", "backward_table", "print_backward"]
