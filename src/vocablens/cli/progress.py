"""Progress of long steps on stderr: rich bars on a terminal, plain lines anywhere else.

Analyses report progress through a callback ``progress(stage, done, total)`` (they never print);
:func:`stage_progress` turns it into one rich bar per stage on a terminal's stderr, and into plain
lines (:class:`PlainProgress`) on a stderr that is a file, a pipe or CI's log: a line when a stage
starts, one when it ends, and a heartbeat whenever ``every`` seconds passed without a line (also
between stages), so that a long step never goes silent. A step with no count (loading a model,
reading a config) is :class:`PlainStatus` there: its message, then a line every ``every`` seconds
with the time it has taken so far.
"""

from __future__ import annotations

import abc
import sys

from vocablens.cli.console import err

#: seconds without a line after which a heartbeat line is written (the promise: a line at least every
#: 10 s). The thread wakes every half second, so a line follows the last within EVERY plus half a
#: second, unless the main thread holds the GIL in one long C call (a model's load can, for seconds)
EVERY = 8.0


class _Heartbeat(abc.ABC):
    """A line whenever ``every`` seconds passed without one: a daemon thread calls :meth:`tick`
    (tests with a fake clock pass ``thread=False`` and call it themselves). Subclasses say what the
    line is (:meth:`beat_line`)."""

    def __init__(self, write, every: float, clock, thread: bool) -> None:
        import threading
        import time

        self._write, self.every, self.clock = write, every, clock or time.perf_counter
        self.t0 = self.last = self.clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def write(self, line: str) -> None:
        self.last = self.clock()
        self._write(line)

    @abc.abstractmethod
    def beat_line(self) -> str | None:
        """The heartbeat line (None: nothing to say now)."""

    def tick(self) -> None:
        """Write the heartbeat line when ``every`` seconds passed since the last line."""
        with self._lock:
            if not self._stop.is_set() and self.clock() - self.last >= self.every:
                line = self.beat_line()
                if line:
                    self.write(line)

    def _run(self) -> None:
        while not self._stop.wait(min(self.every / 4, 0.5)):
            self.tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class PlainProgress(_Heartbeat):
    """Progress for a stderr that is not a terminal (a log file, CI): one plain line when a stage
    starts and when it ends, and, from a heartbeat thread, a line whenever ``every`` seconds passed
    without one (stage, units done of the total, elapsed, ETA; between stages, the time since the
    last one ended), so a long step never goes silent. ``close()`` stops it.

    Args:
        write: takes one line (no newline).
        every: seconds without a line before a heartbeat line.
        clock: seconds, monotonic (tests pass a fake one).
        name: the line's prefix (the command: ``argmax``, ``steer`` ...).
        unit: what ``done`` and ``total`` count (``rows``, ``vectors``, ``documents`` ...).
        units: stage -> its unit, for stages that count something else than ``unit``.
        thread: run the heartbeat thread (False: the caller calls :meth:`tick`).
    """

    def __init__(self, write, every: float = EVERY, clock=None, name: str = "argmax", unit: str = "rows",
                 thread: bool = True, units: dict[str, str] | None = None):
        self.name, self.unit, self.default_unit, self.units = name, unit, unit, dict(units or {})
        self.stage, self.done, self.total, self.ended = None, 0, 0, False
        self.ended_at = 0.0
        self.finish = None   # the stage's estimated end (clock seconds): it only moves earlier within the stage
        self.said = ""
        super().__init__(write, every, clock, thread)

    def line(self) -> str:
        """``name: stage done/total unit, N s, ETA M s``: the ETA from the stage's measured rate (elapsed
        / fraction done), counting down; within a stage it never grows (a later, slower rate does not
        push the end back: the lines say "longer than estimated" once it is used up)."""
        now = self.clock()
        el = now - self.t0
        frac = self.done / self.total if self.total else 0.0
        if frac > 0:
            estimate = now + el / frac * (1 - frac)
            self.finish = estimate if self.finish is None else min(self.finish, estimate)
        if self.finish is None:
            eta = "unknown (nothing done yet)"
        elif self.finish - now >= 0.5:
            eta = f"{self.finish - now:.0f} s"
        else:
            eta = "taking longer than estimated"
        return f"{self.name}: {self.stage} {self.done:,}/{self.total:,} {self.unit}, {el:.0f} s, ETA {eta}"

    def beat_line(self) -> str | None:
        if self.stage is None:
            line = f"{self.name}: starting, {self.clock() - self.t0:.0f} s"
        elif self.ended:
            line = f"{self.name}: working after stage {self.stage}, {self.clock() - self.ended_at:.0f} s since it ended"
        else:
            line = self.line()
        if line == self.said:  # each line once
            return None
        self.said = line
        return line

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if stage != self.stage:
                # a stage that follows another one began when that one ended (its first report can
                # come later, after work of its own): so the line's time is the stage's whole time
                start = self.ended_at if self.stage is not None and self.ended else self.clock()
                self.stage, self.t0, self.ended, self.finish = stage, start, False, None
                self.unit = self.units.get(stage, self.default_unit)
                self.done, self.total = done, total
                self.write(f"{self.name}: stage {stage} started ({total:,} {self.unit})")
            self.done, self.total = done, total
            if total and done >= total and not self.ended:
                self.ended, self.ended_at = True, self.clock()
                self.write(f"{self.name}: stage {stage} done ({total:,} {self.unit} in {self.clock() - self.t0:.1f} s)")


class PlainStatus(_Heartbeat):
    """A step with no count on a stderr that is not a terminal: ``message`` when it starts, then
    ``HEAD: N s so far`` whenever ``every`` seconds passed without a line, and, when it took that
    long, ``HEAD: done in N s`` at :meth:`close` (HEAD: the message before any parenthesis). ``beat``: a function giving the heartbeat line
    instead (e.g. the step it is in and an ETA). Other arguments as :class:`PlainProgress`."""

    def __init__(self, message: str, write, every: float = EVERY, clock=None, thread: bool = True, beat=None):
        self.message = message
        self.head = message.split(" (")[0].rstrip(" .…")   # "loading m (a long note) ..." -> "loading m"
        self.beats = 0
        self.beat = beat
        super().__init__(write, every, clock, thread)
        if message:
            self.write(message)

    def beat_line(self) -> str:
        self.beats += 1
        if self.beat is not None:
            return self.beat()
        return f"{self.head}: {self.clock() - self.t0:.0f} s so far"

    def close(self) -> None:
        super().close()
        if self.beats and self.head:
            self.write(f"{self.head}: done in {self.clock() - self.t0:.1f} s")


def _write_line(line: str) -> None:
    """One plain line on stderr (nothing under torchrun's quiet ranks: ``err.quiet``)."""
    if not err.quiet:
        print(line, file=sys.stderr, flush=True)


def plain_status(message: str, beat=None):
    """A :class:`PlainStatus` writing to stderr (see :func:`vocablens.cli.common.status`)."""
    return PlainStatus(message, _write_line, beat=beat)


def stage_progress(name: str, unit: str = "rows", quiet: bool = False, units: dict[str, str] | None = None):
    """A ``(callback, close)`` pair for ``callback(stage, done, total)``: one rich progress bar per stage
    on a terminal's stderr; plain lines (:class:`PlainProgress`) on any other stderr. ``quiet``: both
    do nothing. ``units``: stage -> its unit where it is not ``unit``. Call ``close()`` when the work
    ends (also on an exception)."""
    if quiet:
        return (lambda *_: None), (lambda: None)
    if not err.is_terminal:
        pp = PlainProgress(_write_line, name=name, unit=unit, units=units)
        return pp, pp.close
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    prog = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                    TextColumn("{task.completed}/{task.total} {task.fields[unit]}", markup=False),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=False)
    tasks: dict[str, int] = {}
    prog.start()

    def cb(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = prog.add_task(f"{name}: {stage}", total=total, unit=(units or {}).get(stage, unit))
        prog.update(tasks[stage], completed=done, total=total)

    return cb, prog.stop


class count_bar:
    """Progress over ``total`` units of one stage (nothing when quiet): a rich bar with ETA on a
    terminal, plain lines with a heartbeat elsewhere (:func:`stage_progress`,
    name ``label``; ``stage``: the stage's name, default ``label``). Entering gives ``tick(done)``,
    which sets how many units are done."""

    def __init__(self, quiet: bool, total: int, label: str, unit: str = "rows", stage: str = "") -> None:
        self.quiet, self.total, self.label, self.unit, self.stage = quiet, total, label, unit, stage or label
        self.cb, self.close = (lambda *_: None), (lambda: None)

    def __enter__(self):
        if self.quiet:
            return lambda done: None
        self.cb, self.close = stage_progress(self.label, self.unit)
        self.cb(self.stage, 0, self.total)
        return lambda done: self.cb(self.stage, done, self.total)

    def __exit__(self, *exc):
        self.close()
        return False
