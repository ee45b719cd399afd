"""`vocablens report`: the main job — analyses of one model in a self-contained HTML file.

The plan (sections, their time budgets, what to say when one is cut short) is the library's
(:mod:`vocablens.report.runner`); the page is :mod:`vocablens.render.report`. This command parses, shows
progress on stderr and prints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, err, load_model, show
from vocablens.errors import BadInput
from vocablens.report.runner import DEFAULT_BUDGET_S, DEFAULT_PROMPT
from vocablens.models.files.spec import DEFAULT_MODEL


@app.command("report")
def report(
    model: ModelOpt = DEFAULT_MODEL,
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt for the lens sections.")] = DEFAULT_PROMPT,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("vocablens-report.html"),
    lens_path: Annotated[str, typer.Option("--lens", help="Tuned-lens directory (default: the lens shipped for the model, if any).")] = "",
    budget: Annotated[float, typer.Option("--budget", help="Seconds for all analyses (shared out over the sections; "
                                                           "loading and writing come on top).")] = DEFAULT_BUDGET_S,
    progress: Annotated[bool, typer.Option("--progress", help="Show progress on stderr even with --json.")] = False,
    image: Annotated[list[str] | None, typer.Option("--image", help="An image read with --prompt by a vision-language model's own processor (repeat for several): the lens sections read its positions, labelled <image k/n>.")] = None,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Write one self-contained HTML report (plotly inlined) and print its summary: the figures to act
    on, then the page's path.

    Every section runs within its share of --budget; the page lists the ones cut short and the
    command that completes each.
    """
    from vocablens.report.runner import check_prompt, plan_report
    from vocablens.cli.heap import tune_heap

    tune_heap(scan=True)  # the argmax scan runs in this process (cli/heap.py)
    from vocablens.render.report import write_page

    check_prompt(prompt)
    out_path = Path(out_path)
    if out_path.is_dir():
        raise BadInput(f"--out {out_path} is a directory; give a file name")
    if not out_path.parent.exists():
        raise BadInput(f"--out: directory {out_path.parent} does not exist")
    plan_report(model, budget)  # validates --budget before loading
    if image:
        from vocablens.models.vision import read_image

        for x in image:
            read_image(x)  # a file that is no image, or too large: one line before the model loads
    quiet = json_ and not progress
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    timings["load"] = time.perf_counter() - t_all
    with _ProgressBar(disabled=quiet) as bar:
        run = lm.report(prompt=prompt, lens_path=lens_path or None, budget_s=budget, progress=bar.update,
                        images=image or None)
    for s in run.sections:
        timings[s.plan.title] = s.seconds
    if not quiet:
        err.print("writing the page ...", style="dim")
    sections = write_page(run, lm, model, out_path, budget)
    timings["total"] = time.perf_counter() - t_all
    from vocablens.handle.results import Report, ReportPage

    show(Report(ReportPage(run, lm, out_path, sections, timings), lm.tokenizer, lm.provenance), json_)


class _ProgressBar:
    """A rich bar on stderr over the report's estimated seconds, with an ETA that counts down between
    updates; one line per section when stderr is not a terminal, and a heartbeat line between them;
    nothing when disabled.

    The library re-estimates the time left at each section and argmax stage from the rates measured
    so far (:func:`vocablens.report.runner.eta_s`). A new section takes its estimate as it is; within
    a section (its sub-steps ``"title: step"`` included) the time left only counts down: an estimate
    that would push the end later is not taken (an ETA that jumps back up reads as a broken promise), and
    once the estimate is used up the lines say so instead of a number. Every heartbeat line is new
    (the seconds spent in the section change), never the previous line again."""

    def __init__(self, disabled: bool, clock=time.monotonic):
        from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class _Eta(ProgressColumn):
            max_refresh = 0.5

            def render(self, task) -> Text:
                at = task.fields.get("at")
                if at is None or task.total is None:
                    return Text("eta -:--:--", style="progress.remaining")
                left = max(0.0, task.total - task.completed - (time.monotonic() - at))
                m, sec = divmod(int(round(left)), 60)
                return Text(f"eta {m // 60}:{m % 60:02d}:{sec:02d}", style="progress.remaining")

        self.disabled = disabled
        self.live = err.is_terminal and not disabled
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                                 TimeElapsedColumn(), _Eta(), console=err, transient=True, disable=not self.live)
        self.task = None
        self.last = ""
        self.now = ("starting", 0.0, 0.0)   # the latest (description, done, total), for the heartbeat
        self.beat = None
        self.clock = clock
        self.stage, self.stage_t0, self.finish = None, clock(), None   # the section, its start, the estimated end
        self.said = ""

    def left(self) -> float | None:
        """Seconds left by the estimate (None before the first), counting down between updates."""
        return None if self.finish is None else self.finish - self.clock()

    def _beat_line(self) -> str | None:
        what = (self.stage or self.now[0]).split(":")[0]
        spent = self.clock() - self.stage_t0
        left = self.left()
        if left is None:
            line = f"report: {what} ({spent:.0f} s in it)"
        elif left >= 0.5:
            line = f"report: {what} ({spent:.0f} s in it, about {left:.0f} s left)"
        else:
            line = f"report: {what} ({spent:.0f} s in it, taking longer than estimated)"
        if line == self.said:
            return None
        self.said = line
        return line

    def __enter__(self):
        self.progress.__enter__()
        if not self.live and not self.disabled:  # a line at least every 10 s between the stage lines
            from vocablens.cli.progress import plain_status

            self.beat = plain_status("", beat=self._beat_line)
        return self

    def __exit__(self, *exc):
        if self.beat is not None:
            self.beat.close()
        return self.progress.__exit__(*exc)

    def update(self, description: str, done: float, total: float) -> None:
        if self.disabled:
            return
        now = self.clock()
        stage = description.split(":")[0]
        estimate = now + max(total - done, 0.0)
        if stage != self.stage or self.finish is None:  # a new section: the estimate from the rates so far
            self.stage, self.stage_t0, self.finish = stage, now, estimate
        else:  # within a section the time left only counts down
            self.finish = min(self.finish, estimate)
        left = max(self.finish - now, 0.0)
        self.now = (description, done, done + left)
        if self.live:
            if self.task is None:
                self.task = self.progress.add_task(description, total=max(done + left, 1e-9), at=time.monotonic())
            self.progress.update(self.task, description=description, completed=done, total=max(done + left, 1e-9),
                                 at=time.monotonic())
        elif ":" not in description and description not in (self.last, "done"):  # stages, not sub-steps
            self.last = description
            self.said = f"{description} ... (about {left:.0f} s left)"
            err.print(self.said, style="dim")
            if self.beat is not None:
                self.beat.last = self.beat.clock()   # a line was just written: the next beat waits
