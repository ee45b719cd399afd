"""Progress of long steps on stderr: rich bars on a terminal, plain lines anywhere else.

Analyses report progress through a callback ``progress(stage, done, total)`` (they never print);
:func:`stage_progress` turns it into one rich bar per stage on a terminal's stderr, and into plain
lines (:class:`PlainProgress`) on a stderr that is a file, a pipe or CI's log: a line when a stage
starts, one when it ends, and a heartbeat at least every ``every`` seconds in between, so that a long
step never goes silent.
"""

from __future__ import annotations

import sys

from vocablens.cli.console import err


class PlainProgress:
    """Progress for a stderr that is not a terminal (a log file, CI): one plain line when a stage
    starts and when it ends, and, from a heartbeat thread, at least one line every ``every`` seconds
    (stage, units done of the total, elapsed, ETA), so a long step never goes silent. ``close()``
    stops it.

    Args:
        write: takes one line (no newline).
        every: seconds between heartbeat lines.
        clock: seconds, monotonic (tests pass a fake one).
        name: the line's prefix (the command: ``argmax``, ``steer`` ...).
        unit: what ``done`` and ``total`` count (``rows``, ``vectors``, ``documents`` ...).
    """

    def __init__(self, write, every: float = 10.0, clock=None, name: str = "argmax", unit: str = "rows"):
        import threading
        import time

        self.write, self.every, self.clock = write, every, clock or time.perf_counter
        self.name, self.unit = name, unit
        self.stage, self.done, self.total, self.t0, self.ended = None, 0, 0, self.clock(), False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def line(self) -> str:
        el = self.clock() - self.t0
        frac = self.done / self.total if self.total else 0.0
        eta = f"{el / frac * (1 - frac):.0f} s" if frac > 0 else "unknown"
        return f"{self.name}: {self.stage} {self.done:,}/{self.total:,} {self.unit}, {el:.0f} s, ETA {eta}"

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if stage != self.stage:
                self.stage, self.t0, self.ended = stage, self.clock(), False
                self.done, self.total = done, total
                self.write(f"{self.name}: stage {stage} started ({total:,} {self.unit})")
            self.done, self.total = done, total
            if total and done >= total and not self.ended:
                self.ended = True
                self.write(f"{self.name}: stage {stage} done ({total:,} {self.unit} in {self.clock() - self.t0:.1f} s)")

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                if self.stage is not None and not self.ended:
                    self.write(self.line())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def stage_progress(name: str, unit: str = "rows", quiet: bool = False):
    """A ``(callback, close)`` pair for ``callback(stage, done, total)``: one rich progress bar per stage
    on a terminal's stderr; plain lines (:class:`PlainProgress`) on any other stderr. ``quiet``: both
    do nothing. Call ``close()`` when the work ends (also on an exception)."""
    if quiet:
        return (lambda *_: None), (lambda: None)
    if not err.is_terminal:
        pp = PlainProgress(lambda s: print(s, file=sys.stderr, flush=True), name=name, unit=unit)
        return pp, pp.close
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    prog = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                    TextColumn("{task.completed}/{task.total} " + unit.replace("{", "{{").replace("}", "}}"), markup=False),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=False)
    tasks: dict[str, int] = {}
    prog.start()

    def cb(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = prog.add_task(f"{name}: {stage}", total=total)
        prog.update(tasks[stage], completed=done, total=total)

    return cb, prog.stop
