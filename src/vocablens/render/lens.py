"""Rendering of a lens result: the ``--json`` dict, rich tables, the heatmap and the report section.

The ``lens`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from rich.table import Table

from vocablens.lens.logit import LensResult
from vocablens.models.tokens import token_str
from vocablens.errors import BadInput
from vocablens.render.renderer import Renderer


def input_token(result: LensResult, tokenizer, i: int) -> str:
    """The string shown for input position ``i``: its label (an image position: ``<image 3/256>``)
    when the result has one there, else the token's string."""
    labels = getattr(result, "input_labels", None)
    if labels is not None and labels[i] is not None:
        return labels[i]
    return token_str(tokenizer, int(result.input_ids[i])) if tokenizer is not None else str(int(result.input_ids[i]))


def lens_to_dict(result: LensResult, tokenizer=None) -> dict:
    """Plain JSON-ready data, one schema whatever the number of positions read:
    ``{"kind", "tokens", "positions", "final_top1", "model_max_abs_diff", "n_layers", "layers":
    [{"layer", "positions": [{"position", "top_tokens", "top_ids", "top_probs", "entropy",
    "kl_to_final", "final_top1_rank", "final_top1_prob"}]}]}``: ``layers[i]["positions"][j]`` is stream
    layer ``layers[i]["layer"]`` (0..L) at position ``positions[j]``, also when one position is read.
    Probabilities are plain, entropy and KL in nats."""
    def tok(i):
        return token_str(tokenizer, i) if tokenizer is not None else str(int(i))

    P = len(result.positions)
    layers = []
    for ly in result.layers:
        rows = []
        for j in range(P):
            rows.append({
                "position": int(result.positions[j]),
                "top_tokens": [tok(i) for i in ly.top_ids[j].tolist()],
                "top_ids": ly.top_ids[j].tolist(),
                "top_probs": [round(float(x), 6) for x in ly.top_probs[j]],
                "entropy": float(ly.entropy[j]),
                "kl_to_final": float(ly.kl_to_final[j]),
                "final_top1_rank": int(ly.final_top1_rank[j]),
                "final_top1_prob": float(ly.final_top1_prob[j]),
            })
        layers.append({"layer": ly.layer, "positions": rows})
    return {
        "kind": result.kind,
        "tokens": [input_token(result, tokenizer, i) for i in range(len(result.input_ids))],
        "positions": result.positions.tolist(),
        "final_top1": [tok(i) for i in result.final_top1.tolist()],
        "model_max_abs_diff": result.model_max_abs_diff,
        "n_layers": result.n_layers,
        "layers": layers,
    }


def lens_record(kind: str, lens) -> dict:
    """The JSON record of a translator a lens result was read through (``"lenses"`` in ``lens --json``):
    ``{"kind", "name", "tokens", ...}`` from the lens's ``info()``, and a Jacobian lens's fitted layers."""
    d = dict(lens.info()) if hasattr(lens, "info") else {}
    if kind == "jacobian":
        d["layers"] = list(lens.layers)
    return {"kind": kind, **d}


def lens_caption(kind: str, lens) -> str:
    """One line of provenance: model, corpus, prompts or tokens, stored dtype, source, revision, file
    format and whether the file's model identity was verified (:func:`vocablens.lens.identity.verify_identity`)."""
    from vocablens.lens.identity import shown_name
    from vocablens.lens.jacobian import layer_span

    info = lens.info() if hasattr(lens, "info") else {}
    s = getattr(lens, "settings", {}) or {}
    data = s.get("data") or {}
    bits = [f"{kind} lens for {shown_name(str(info['name'])) if info.get('name') else '?'}"]
    corpus = info.get("corpus") or data.get("corpus")
    if corpus:
        bits.append(f"fitted on {corpus}" if kind == "jacobian" else f"trained on {corpus}")
    if kind == "jacobian":
        bits.append(f"{info.get('n_prompts') or '?'} prompts")
    if info.get("tokens") not in (None, "?"):
        bits.append(f"{info['tokens']} tokens")
    if info.get("dtype") or s.get("stored_dtype"):
        bits.append(f"stored {info.get('dtype') or s.get('stored_dtype')}")
    if kind == "jacobian":
        bits.append(f"layers {layer_span(list(lens.layers))}")
        bits.append(f"source {info.get('source')}")
    if info.get("revision"):
        bits.append(f"revision {str(info['revision'])[:12]}")
    if info.get("format"):
        bits.append(f"format {info['format']}")
    if info.get("hub"):
        hub = info["hub"]
        bits.append(f"from the hub {hub['repo']}@{str(hub['revision'])[:12]}")
    if info.get("verified"):
        bits.append(str(info["verified"]))
    q = quality_text(info.get("quality"))
    return ", ".join(bits) + (f"; {q}" if q else "; quality not measured")


def quality_text(q: dict | None) -> str | None:
    """One line of a lens's stored quality (:mod:`vocablens.lens.quality`): ``on held-out fortunes
    (validation, 2,048 tokens): mean KL 2.10 nats (logit lens 4.30), top-1 agreement 41% (logit lens 22%)``;
    None when not measured."""
    if not q or q.get("mean_kl") is None:
        return None

    def pct(x):
        return "?" if x is None else f"{100 * x:.0f}%"

    where = f"held-out {q.get('corpus') or 'text'} ({q.get('split') or 'all'}, {int(q.get('tokens') or 0):,} tokens)"
    lk = q.get("logit_mean_kl")
    return (f"on {where}: mean KL {q['mean_kl']:.2f} nats (logit lens {'?' if lk is None else f'{lk:.2f}'}), "
            f"top-1 agreement {pct(q.get('mean_top1'))} (logit lens {pct(q.get('logit_mean_top1'))})")


def _quality_cell(q: dict, layer: int) -> str:
    """``KL / top-1`` of the lens at ``layer`` on held-out text (``-`` where not measured)."""
    kl, top = (q.get("kl") or [None] * (layer + 1)), (q.get("top1") or [None] * (layer + 1))
    if layer >= len(kl) or kl[layer] is None:
        return "-"
    return f"{kl[layer]:.2f} / {100 * top[layer]:.0f}%"


def lens_json(results: list[LensResult], tokenizer, provenance=None, lenses: list[dict] | None = None) -> dict:
    """The dict ``lens --json`` prints (and the explorer's ``/api/lens`` answers): one lens's
    :func:`lens_to_dict`, or for two (logit, tuned) ``{"kind": "both", "logit": ..., "tuned": ...}``, for
    another list of kinds ``{"kind": "logit,jacobian", "logit": ..., "jacobian": ...}``;
    plus ``"model"`` (the provenance) when given, and ``"lenses"`` (:func:`lens_record` of each
    translator read) when any."""
    ds = [lens_to_dict(r, tokenizer) for r in results]
    kinds = [r.kind for r in results]
    if len(ds) == 1:
        d = ds[0]
    elif kinds == ["logit", "tuned"]:
        d = {"kind": "both", "logit": ds[0], "tuned": ds[1]}
    else:  # several lenses (--kind logit,tuned,jacobian): one entry per kind, named by it
        d = {"kind": ",".join(kinds), **dict(zip(kinds, ds))}
    if provenance is not None:
        d["model"] = provenance.to_dict()
    if lenses:
        d["lenses"] = list(lenses)
    return d


def lens_batch_json(results: list[list[LensResult]], tokenizer, provenance=None,
                    lenses: list[dict] | None = None) -> dict:
    """The dict ``lens --file F --json`` prints, one schema whatever the number of prompts:
    ``{"prompts": [one object per prompt, as ``lens PROMPT --json`` prints it without "model"],
    "model": provenance}`` (``results[i]`` = the lenses of prompt i: one kind, or logit and tuned)."""
    d = {"prompts": [lens_json(r, tokenizer) for r in results]}
    if provenance is not None:
        d["model"] = provenance.to_dict()
    if lenses:
        d["lenses"] = list(lenses)
    return d


def lens_table(res: LensResult, tokenizer, j: int = 0, k: int | None = None,
               every: int = 1, quality: dict | None = None) -> Table:
    """A table: one row per layer at the j-th position read (top ``k`` tokens; every ``every``-th
    layer plus the last three when ``every`` > 1); with the lens's stored ``quality``
    (:mod:`vocablens.lens.quality`) a column of its held-out KL (nats) and top-1 agreement at each layer."""
    pos = int(res.positions[j])
    title = (f"{res.kind} lens at position {pos} (after '{input_token(res, tokenizer, pos)}'); "
             f"final top-1 '{token_str(tokenizer, int(res.final_top1[j]))}'")
    t = Table(title=title, title_justify="left")
    t.add_column("layer", justify="right")
    t.add_column("top tokens (prob)")
    t.add_column("entropy", justify="right")
    t.add_column("KL(final‖layer)", justify="right")
    t.add_column("rank of final", justify="right")
    if quality:
        t.add_column("held-out KL / top-1", justify="right")
    L = res.layers[-1].layer
    for ly in res.layers:
        if every > 1 and ly.layer % every and ly.layer < L - 2:
            continue
        toks = ", ".join(f"'{token_str(tokenizer, i)}' {p:.3f}" for i, p in
                         zip(ly.top_ids[j].tolist()[:k], ly.top_probs[j].tolist()[:k]))
        t.add_row(str(ly.layer), toks, f"{float(ly.entropy[j]):.3f}", f"{float(ly.kl_to_final[j]):.3f}",
                  str(int(ly.final_top1_rank[j])), *([_quality_cell(quality, ly.layer)] if quality else []))
    return t


def print_lens(res: LensResult, tokenizer, out, provenance=None, quality: dict | None = None) -> None:
    """Print the lens tables to a rich console ``out``; ``quality``: the lens's stored quality, shown per
    layer and in the footer."""
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim", soft_wrap=True)
    for j in range(len(res.positions)):
        out.print(lens_table(res, tokenizer, j, quality=quality))
    out.print(f"layer {res.n_layers} vs the model's own output: max |Δp| = {res.model_max_abs_diff:.2e}", style="dim")
    q = quality_text(quality)
    if q:
        out.print(f"{res.kind} lens quality {q}", style="dim", soft_wrap=True)


def lens_heatmap(res: LensResult, tokenizer, title: str | None = None):
    """Plotly heatmap of a lens over layers x positions: cell text = top-1 token at that layer and
    position, colour = its probability; hover shows the top-k with probabilities."""
    import plotly.graph_objects as go

    from vocablens.render.tokens import display_token

    P = len(res.positions)
    labels = getattr(res, "input_labels", None) or [None] * len(res.input_ids)
    in_toks = [labels[int(p)] or display_token(tokenizer, res.input_ids[int(p)]) for p in res.positions]
    xlabels = [f"{j}: {t}" for j, t in zip(res.positions.tolist(), in_toks)]
    z, text, hover = [], [], []
    ylabels = []
    for ly in res.layers:
        ylabels.append(str(ly.layer))
        z.append([float(ly.top_probs[j, 0]) for j in range(P)])
        text.append([display_token(tokenizer, int(ly.top_ids[j, 0])) for j in range(P)])
        hover.append([
            "<br>".join(f"{display_token(tokenizer, int(i))}: {float(p):.3f}"
                        for i, p in zip(ly.top_ids[j], ly.top_probs[j]))
            + f"<br>entropy {float(ly.entropy[j]):.2f} nats, KL to final {float(ly.kl_to_final[j]):.2f}"
            for j in range(P)
        ])
    fig = go.Figure(go.Heatmap(
        z=z, x=xlabels, y=ylabels, text=text, texttemplate="%{text}", textfont={"size": 10},
        customdata=hover, hovertemplate="layer %{y}, position %{x}<br>%{customdata}<extra></extra>",
        colorscale="Viridis", zmin=0.0, zmax=1.0, colorbar={"title": "p(top-1)"},
    ))
    fig.update_layout(
        title=title or f"{res.kind} lens: top-1 token per layer and position",
        xaxis_title="input position (token read)", yaxis_title="layer (0 = embedding output)",
        height=max(420, 22 * len(res.layers) + 140), margin={"l": 60, "r": 20, "t": 50, "b": 80},
    )
    return fig


#: said wherever a lens map is shown, for a tokenizer that puts no BOS in front of a text
BOS_NOTE = ("This model's tokenizer adds no BOS token, so position 0 (the prompt's first token) has nothing "
            "before it, and the model uses that first position as an attention sink: its column is an "
            "attention-sink artefact, not a reading of the text.")


def bos_note(tokenizer) -> str:
    """:data:`BOS_NOTE` when the tokenizer adds no BOS (encoding "a" does not start with
    ``bos_token_id``, :func:`vocablens.models.tokens.adds_bos`), else ``""``."""
    from vocablens.models.tokens import adds_bos

    return "" if adds_bos(tokenizer) else BOS_NOTE


def lens_section(res: LensResult, tokenizer, prompt: str):
    """Report section: the logit-lens heatmap of the report's prompt and the last position's table."""
    from vocablens.render.html import Section, esc, figure_html, table_html
    from vocablens.render.tokens import LEGEND, shown, special_note

    last = len(res.positions) - 1
    rows = []
    for ly in res.layers:
        rows.append([ly.layer,
                     ", ".join(f"{shown(token_str(tokenizer, int(i)))} {float(p):.3f}"
                               for i, p in zip(ly.top_ids[last][:5], ly.top_probs[last][:5])),
                     f"{float(ly.entropy[last]):.3f}", f"{float(ly.kl_to_final[last]):.3f}",
                     int(ly.final_top1_rank[last])])
    html = (
        f'<p>Prompt: <span class="tok">{esc(prompt)}</span>. Each layer\'s residual stream is decoded through '
        f"the final norm and the LM head (nostalgebraist 2020). Layer 0 is the embedding output, layer "
        f"{res.n_layers} the last block's output; its row equals the model's own distribution "
        f"(max |&Delta;p| = {res.model_max_abs_diff:.1e}). {esc(LEGEND)}</p>"
        + "".join(f"<p class='note'>{esc(n)}</p>" for n in [special_note(
            tokenizer, [int(i) for ly in res.layers for i in ly.top_ids[:, 0].tolist()]), bos_note(tokenizer)] if n)
        + figure_html(lens_heatmap(res, tokenizer), "logit-lens-heatmap")
        + "<p class=\"note\">Last position, every layer:</p>"
        + table_html(["layer", "top tokens", "entropy (nats)", "KL(final‖layer) (nats)", "rank of final top-1"], rows)
    )
    return Section("logit-lens", "Logit lens", html)


# ---------- the renderers of a lens result (vocablens.handle.results.Lens)
def _json_of(r) -> dict:
    if r.options.get("batch"):
        return lens_batch_json(r.value, r.tokenizer, r.provenance, r.options.get("lenses"))
    return lens_json(r.value[0], r.tokenizer, r.provenance, r.options.get("lenses"))


def _print_of(r, out) -> None:
    from rich.text import Text

    batch = r.options.get("batch")
    if batch:
        out.print(f"model: {r.provenance.describe()}", style="dim", soft_wrap=True)
    quality = {rec.get("kind"): rec.get("quality") for rec in r.options.get("lenses") or []}
    for i, (text, per_kind) in enumerate(zip(r.options["prompts"], r.value)):
        if batch:
            out.print(Text.assemble((f"prompt {i + 1}:", "bold"), f" {text}"), soft_wrap=True)
        for res in per_kind:
            print_lens(res, r.tokenizer, out, None if batch else r.provenance, quality.get(res.kind))


def _figure_of(r, colour: str | None = None):
    """A string read: what the report draws for it (one kind: its heatmap; the logit lens beside one or
    two translators: the prediction trajectories, coloured by ``colour``, default ``entropy``). A list:
    the batch's heatmaps, one per kind with a column per (prompt, position)."""
    per_kind = r.value[0]
    trajectories = not r.options.get("batch") and len(per_kind) in (2, 3)
    if colour is not None and not trajectories:
        raise BadInput("colour= applies to the trajectories of one prompt through several lenses; this "
                       "figure is coloured by the top-1 probability")
    if not r.options.get("batch") and len(per_kind) == 1:
        return lens_heatmap(per_kind[0], r.tokenizer)
    if trajectories:
        from vocablens.render.prediction_trajectories import trajectory_figure

        return trajectory_figure(per_kind[0], per_kind[1], r.tokenizer, colour or "entropy",
                                 per_kind[2] if len(per_kind) == 3 else None)
    from vocablens.render.lens_batch import lens_batch_figure

    return lens_batch_figure(r.value, r.tokenizer, r.options["prompts"])


def _rows_of(r) -> list[dict]:
    """A row per (prompt, kind, layer, position read): the top-1 token, its probability, entropy and
    KL to the final distribution (nats), the rank of the final top-1."""
    rows = []
    for p, per_kind in enumerate(r.value):
        for res in per_kind:
            for ly in res.layers:
                for j, pos in enumerate(res.positions.tolist()):
                    top = int(ly.top_ids[j, 0])
                    rows.append({"prompt": p, "kind": res.kind, "layer": ly.layer, "position": int(pos),
                                 "token_read": token_str(r.tokenizer, int(res.input_ids[int(pos)])),
                                 "top1_id": top, "top1": token_str(r.tokenizer, top),
                                 "top1_prob": float(ly.top_probs[j, 0]), "entropy": float(ly.entropy[j]),
                                 "kl_to_final": float(ly.kl_to_final[j]),
                                 "final_top1_rank": int(ly.final_top1_rank[j])})
    return rows


#: how a ``lens`` result shows itself
RENDERER = Renderer("lens", _json_of, _print_of, _figure_of, _rows_of)
