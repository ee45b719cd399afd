"""The figures of :meth:`vocablens.handle.Result.figure`: for each kind of result that the report or the
explorer draws, the builder that draws it there, called on the result's own fields (:data:`FIGURES`).

* ``anatomy``: the report's parameter bars (:func:`vocablens.render.anatomy.params_figure`);
* ``pca``: the report's 3-D word map (:func:`vocablens.render.pca.pca_figure`);
* ``lens``: one prompt read through one lens, the report's logit-lens heatmap
  (:func:`vocablens.render.lens.lens_heatmap`); one prompt through the logit lens and a translator (and
  a third, the Jacobian lens), the report's prediction trajectories side by side
  (:func:`vocablens.render.tuned.trajectory_figure`, ``colour=`` one of its colourings); a list of
  prompts, one heatmap per kind with a column per (prompt, position)
  (:func:`vocablens.render.lens_batch.lens_batch_figure`);
* ``explain``: the explorer's attribution bars (:func:`vocablens.render.vocab_space.attribution_figure`);
* ``trajectory``: the explorer's rank-and-probability plot of a token
  (:func:`vocablens.render.trajectory.trajectory_plot`);
* ``bottleneck``: the singular spectra ``bottleneck --plot`` writes
  (:func:`vocablens.render.argmax.bottleneck_figure`);
* ``settle``: the report's settle panels (:func:`vocablens.render.vocab_space.settle_figure`);
* ``undertrained``: the report's indicator-vs-probability scatter
  (:func:`vocablens.render.undertrained_report.undertrained_figure`);
* ``lens_eval``: KL, cross-entropy and top-1 agreement per layer, logit vs tuned lens, the figure
  ``lens eval --plot`` writes and the report draws (:func:`vocablens.render.tuned.eval_figure`;
  ``unit="bpb"``: the cross-entropy in bits per byte).

The other kinds (score, neighbours, projections, argmax, generation, steering, surgery, alignment,
anomaly scores, a lens's training) are drawn nowhere; their tables are their display.
"""

from __future__ import annotations

import inspect
from typing import Callable

from vocablens.errors import BadInput


def _anatomy(r):
    from vocablens.render.anatomy import params_figure

    return params_figure([r.value])


def _pca(r):
    from vocablens.render.pca import pca_figure

    return pca_figure(r.value)


def _lens(r, colour: str | None = None):
    """A string read: what the report draws for it (one kind: its heatmap; the logit lens beside one or
    two translators: the trajectories, coloured by ``colour``, default ``entropy``). A list: the batch's
    heatmaps."""
    per_kind = r.value[0]
    trajectories = not r.options.get("batch") and len(per_kind) in (2, 3)
    if colour is not None and not trajectories:
        raise BadInput("colour= applies to the trajectories of one prompt through several lenses; this "
                       "figure is coloured by the top-1 probability")
    if not r.options.get("batch") and len(per_kind) == 1:
        from vocablens.render.lens import lens_heatmap

        return lens_heatmap(per_kind[0], r.tokenizer)
    if trajectories:
        from vocablens.render.tuned import trajectory_figure

        return trajectory_figure(per_kind[0], per_kind[1], r.tokenizer, colour or "entropy",
                                 per_kind[2] if len(per_kind) == 3 else None)
    from vocablens.render.lens_batch import lens_batch_figure

    return lens_batch_figure(r.value, r.tokenizer, r.options["prompts"])


def _explain(r):
    from vocablens.render.vocab_space import attribution_figure

    return attribution_figure(r.value, r.tokenizer)


def _settle(r):
    from vocablens.render.vocab_space import settle_figure

    return settle_figure(r.value)


def _undertrained(r):
    from vocablens.render.undertrained_report import undertrained_figure

    return undertrained_figure(r.value, r.tokenizer)


def _trajectory(r):
    from vocablens.render.trajectory import trajectory_plot

    return trajectory_plot(r.value, r.tokenizer)


def _bottleneck(r):
    from vocablens.render.argmax import bottleneck_figure

    return bottleneck_figure(r.value)


def _lens_eval(r, unit: str = "nats"):
    from vocablens.render.tuned import eval_figure

    return eval_figure(r.value, r.options.get("title", ""), unit)


#: kind -> the builder of its figure (``builder(result, **options)``)
FIGURES: dict[str, Callable] = {"anatomy": _anatomy, "pca": _pca, "lens": _lens, "explain": _explain,
                                "settle": _settle, "undertrained": _undertrained, "trajectory": _trajectory,
                                "bottleneck": _bottleneck, "lens_eval": _lens_eval}


def draw(builder: Callable, r, **options):
    """``builder(r, **options)``, an option the builder does not take refused first.

    Raises:
        BadInput: an option the figure does not take (the lens trajectories' ``colour`` and the lens
            evaluation's ``unit`` are the only ones of the figures here).
    """
    takes = set(inspect.signature(builder).parameters) - {"r"}
    if set(options) - takes:
        raise BadInput(f"a {r.kind} figure takes no option {', '.join(sorted(set(options) - takes))}"
                       + (f"; it takes {', '.join(sorted(takes))}" if takes else ""))
    return builder(r, **options)


__all__ = ["FIGURES", "draw"]
