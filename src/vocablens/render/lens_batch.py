"""The figure of a batch of lenses (``m.lens([...]).figure()``): one heatmap per lens kind, layers x
(prompt, position) columns, cell text = the top-1 token, colour = its probability."""

from __future__ import annotations


def lens_batch_figure(per_prompt, tokenizer, prompts):
    """Plotly heatmaps of a batch: ``per_prompt[i][j]`` is lens j on prompt i
    (:class:`~vocablens.lens.logit.LensResult`); one panel per lens kind, side by side, each column a
    (prompt, position read) pair labelled ``"P{i}·{position}: {token read}"``, each row a stream layer
    0..L. Hover: the prompt, the top-k tokens with probabilities, entropy and KL to the final (nats)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from vocablens.render.tokens import display_token

    kinds = [r.kind for r in per_prompt[0]]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[f"{k} lens" for k in kinds],
                        horizontal_spacing=0.06, shared_yaxes=True)
    layers = [ly.layer for ly in per_prompt[0][0].layers]
    for col, _ in enumerate(kinds, start=1):
        xs, z, text, hover = [], [[] for _ in layers], [[] for _ in layers], [[] for _ in layers]
        for i, per_kind in enumerate(per_prompt):
            res = per_kind[col - 1]
            for j, pos in enumerate(res.positions.tolist()):
                xs.append(f"P{i + 1}·{pos}: {display_token(tokenizer, int(res.input_ids[pos]))}")
                for r, ly in enumerate(res.layers):
                    z[r].append(float(ly.top_probs[j, 0]))
                    text[r].append(display_token(tokenizer, int(ly.top_ids[j, 0])))
                    hover[r].append(
                        f"prompt {i + 1}: {str(prompts[i])[:60]}<br>"
                        + "<br>".join(f"{display_token(tokenizer, int(t))}: {float(p):.3f}"
                                      for t, p in zip(ly.top_ids[j], ly.top_probs[j]))
                        + f"<br>entropy {float(ly.entropy[j]):.2f} nats, KL to final {float(ly.kl_to_final[j]):.2f}")
        fig.add_trace(go.Heatmap(z=z, x=xs, y=layers, text=text, texttemplate="%{text}", textfont={"size": 10},
                                 customdata=hover, zmin=0.0, zmax=1.0, colorscale="Viridis", showscale=col == len(kinds),
                                 colorbar={"title": "p(top-1)"} if col == len(kinds) else None,
                                 hovertemplate="layer %{y}, %{x}<br>%{customdata}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(tickangle=-45, row=1, col=col)
    fig.update_yaxes(title_text="layer (0 = embedding output)", row=1, col=1)
    fig.update_layout(title="top-1 token per layer (colour: its probability)",
                      height=max(420, 22 * len(layers) + 160), margin={"l": 60, "r": 20, "t": 70, "b": 100})
    return fig


__all__ = ["lens_batch_figure"]
