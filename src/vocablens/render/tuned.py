"""The report's section on the tuned lens: prediction trajectories through the lenses side by side
(:mod:`vocablens.render.prediction_trajectories`) and its per-layer quality (its evaluation:
:mod:`vocablens.render.lens_eval`; its training: :mod:`vocablens.render.lens_train`)."""

from __future__ import annotations

from vocablens.lens.logit import LensResult
from vocablens.lens.evaluate import LensEval
from vocablens.render.html import Section, esc, figure_html
from vocablens.render.lens_eval import eval_figure
from vocablens.render.prediction_trajectories import COLOURS, trajectory_figure


def tuned_lens_section(logit: LensResult, tuned: LensResult, tokenizer, lens_info: dict | None = None,
                       colours=("entropy", "kl", "final_prob"), eval_result: LensEval | None = None,
                       jacobian: LensResult | None = None, jacobian_info: dict | None = None) -> Section:
    """The report section: prediction trajectories of one prompt through the lenses side by side
    (logit, tuned, and the Jacobian lens when ``jacobian`` is given).

    Args:
        logit, tuned: the two lenses over the same positions of one prompt
            (:func:`vocablens.lens.logit.lens_pair`).
        tokenizer: the model's tokenizer.
        lens_info: ``{"name", "tokens"}`` of the tuned lens (its model name, training tokens).
        colours: one heatmap pair per colour (``entropy``, ``kl``, ``final_prob``).
        eval_result: an optional :class:`LensEval` to plot per-layer KL/CE/agreement too.
        jacobian, jacobian_info: the Jacobian lens over the same positions, and its provenance
            (:meth:`vocablens.lens.jacobian.JacobianLens.info`).

    Returns:
        :class:`Section` with id ``tuned-lens``.

    Raises:
        BadInput: an unknown colour.
    """
    from vocablens.render.tokens import LEGEND, special_note

    info = lens_info or {}
    positions = logit.positions.tolist()
    T = int(logit.input_ids.numel())
    parts = [f"<p>Prediction trajectories (Belrose et al. 2023, Fig. 1) of {T} tokens, positions "
             f"{positions[0]}..{positions[-1]}: each cell is one layer (rows, 0 = embedding output, "
             f"{logit.n_layers} = model output) at one position; the text is the lens's top token. "
             f"Left: logit lens; right: tuned lens ({esc(info.get('name') or 'trained')}, "
             f"{esc(info.get('tokens', '?'))} training tokens{esc(_origin(info))})"
             + (f"; third: Jacobian lens (Gurnee et al. 2026; {esc(_jinfo(jacobian_info))})" if jacobian is not None else "")
             + f". {esc(LEGEND)}</p>"]
    note = special_note(tokenizer, [int(ly.top_ids[p, 0]) for res in (logit, tuned, jacobian) if res is not None
                                    for ly in res.layers
                                    for p in range(len(positions))])
    if note:
        parts.append(f"<p class='note'>{esc(note)}</p>")
    for c in colours:
        if c not in COLOURS:
            trajectory_figure(logit, tuned, tokenizer, c)  # raises BadInput naming the colours
        parts.append(f"<h3>{esc(COLOURS[c][0])}</h3>")
        # the panels keep their width (the page scrolls sideways when they are wider than it)
        parts.append(f"<div class='scroll'>{figure_html(trajectory_figure(logit, tuned, tokenizer, c, jacobian), f'tuned-lens-{c}')}</div>")
    if eval_result is not None:
        parts.append("<h3>Per-layer quality on held-out text</h3>")
        parts.append(figure_html(eval_figure(eval_result), "tuned-lens-eval"))
    title = "Tuned lens vs logit lens" if jacobian is None else "Logit, tuned and Jacobian lens"
    return Section(id="tuned-lens", title=title, html="\n".join(parts))


def _jinfo(info: dict | None) -> str:
    """``model, corpus, N prompts, dtype, source`` of a Jacobian lens (for the caption)."""
    i = info or {}
    return ", ".join(str(x) for x in (i.get("name") or "fitted", i.get("corpus") and f"fitted on {i['corpus']}",
                                      i.get("n_prompts") and f"{i['n_prompts']} prompts",
                                      i.get("dtype") and f"stored {i['dtype']}", i.get("source")) if x) + _origin(i)


def _origin(i: dict) -> str:
    """``, format F, verified: ...`` of a lens's provenance (what its file says it was fitted for, and
    whether that was checked against the model: :func:`vocablens.lens.identity.verify_identity`)."""
    from vocablens.render.lens import quality_text

    hub = i.get("hub") or {}
    return "".join(f", {x}" for x in (i.get("revision") and f"revision {str(i['revision'])[:12]}",
                                       i.get("format") and f"format {i['format']}", i.get("verified"),
                                       hub and f"from the hub {hub.get('repo')}@{str(hub.get('revision'))[:12]}",
                                       quality_text(i.get("quality"))) if x)
