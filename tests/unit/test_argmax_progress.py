"""Progress of the argmax scan on a stderr that is not a terminal: one line per stage and a
heartbeat at least every 10 s (here a fast fake clock and a short interval).

The clock runs 20 times faster than real time, so the 0.3 s that the slow stage reports nothing are 6 s
on it and its heartbeats (one every 0.2 s of it) show the elapsed seconds going up: a heartbeat line is
never the previous one again (issue 40 fault 5), so lines within one real second, all "0 s", would be
one line."""

import time

import numpy as np
import torch

from vocablens.argmax import find_unargmaxable
from vocablens.cli.argmax import PlainProgress


def test_plain_progress_one_line_per_stage_and_a_heartbeat():
    # the clock is the test's and the heartbeat is ticked by hand: no line depends on when a thread
    # happens to run (a thread-timed version of this test failed on a loaded machine: 1 beat, not 2)
    lines, now = [], [0.0]
    pp = PlainProgress(lines.append, every=0.2, clock=lambda: now[0], thread=False)
    W = torch.from_numpy(np.random.default_rng(0).standard_normal((600, 16)))
    res = find_unargmaxable(W, progress=pp)
    pp("slowstage", 3, 10)
    for t in (1.0, 2.0, 3.0):                # a stage that reports nothing for a while
        now[0] = t
        pp.tick()
    n = len(lines)
    pp.tick()                                # nothing new to say at the same moment: no line
    pp.close()
    now[0] = 9.0
    pp.tick()                                # closed: silent
    assert len(lines) == n
    assert res.counts()["undecided"] == 0
    starts = [s for s in lines if "started" in s]
    assert any("stage gemm started" in s for s in starts) and "argmax: stage slowstage started (10 rows)" in starts
    beats = [s for s in lines if s.startswith("argmax: slowstage 3/10 rows")]
    assert len(beats) == 3 and all("ETA" in s for s in beats)
    assert all(a != b for a, b in zip(lines, lines[1:]))   # each line once: no line the previous one again


def test_the_heartbeat_thread_writes_while_the_caller_is_silent():
    lines = []
    pp = PlainProgress(lines.append, every=0.05)
    try:
        pp("slowstage", 3, 10)
        deadline = time.perf_counter() + 30  # generous: on a loaded machine the thread runs late
        while sum(s.startswith("argmax: slowstage 3/10 rows") for s in lines) < 2 and time.perf_counter() < deadline:
            time.sleep(0.05)
    finally:
        pp.close()
    beats = [s for s in lines if s.startswith("argmax: slowstage 3/10 rows")]
    assert len(beats) >= 2 and all("ETA" in s for s in beats)
    n = len(lines)
    time.sleep(0.2)
    assert len(lines) == n                   # closed: silent


def test_cli_argmax_on_a_non_terminal_stderr_prints_plain_lines(capfd):
    from vocablens.cli.argmax import _progress_bar

    cb, close = _progress_bar(quiet=True)   # pytest's stderr is not a terminal
    try:
        cb("gemm", 0, 100)
        cb("gemm", 50, 100)
    finally:
        close()
    err = capfd.readouterr().err
    assert "argmax: stage gemm started (100 rows)" in err and "\x1b[" not in err
