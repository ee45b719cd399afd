"""The HTML report, on :class:`vocablens.Model`: ``report`` runs its sections within a time budget
(:func:`vocablens.report.runner.run_report`) and writes the page."""

from __future__ import annotations

from pathlib import Path

from vocablens.handle.protocols import NeedsLoaded
from vocablens.models.files.spec import DEFAULT_MODEL


class ReportWorkflow:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLoaded`;
    the report's sections call the model's other workflows)."""

    def report(self: NeedsLoaded, out: str | Path | None = None, prompt: str | None = None,
               lens_path: str | None = None,
               budget_s: float | None = None, progress=None, only: tuple[str, ...] | None = None, images=None):
        """Run the HTML report's sections on this model within ``budget_s`` seconds
        (:func:`vocablens.report.runner.run_report`) and write the page to ``out`` when given.
        Returns the :class:`~vocablens.report.plan.ReportRun`.

        ``images``: for a vision-language model, images read with ``prompt`` by its own processor (the
        lens sections read the image positions, labelled; the explanation is skipped).

        Raises:
            BadInput: an empty prompt, a bad budget, ``out`` a directory; images as :meth:`image_prompt`.
        """
        from vocablens.report.runner import DEFAULT_BUDGET_S, DEFAULT_PROMPT, run_report

        run = run_report(self, model=self.spec or DEFAULT_MODEL, prompt=prompt or DEFAULT_PROMPT, lens_path=lens_path,
                         budget_s=DEFAULT_BUDGET_S if budget_s is None else budget_s, progress=progress, only=only,
                         images=images)
        if out is not None:
            from vocablens.render.report import write_page

            write_page(run, self, self.spec or DEFAULT_MODEL, out, run.budget_s)
        return run


__all__ = ["ReportWorkflow"]
