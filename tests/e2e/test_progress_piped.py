"""Commands whose stderr is a pipe (a log file, CI: ``2>log``) say what they do before each long
step: the load, then one line per stage, the stage's start before its work (issues 25, 26 §4, 27).
Subprocesses on a tiny model; no wall-clock assertion (the heartbeat's timing is a unit test's, with a
fake clock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_dirs import save_tiny, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("piped") / "tiny", tiny_tokenizer())


def _run(*args, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "vocablens", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)      # stderr: a pipe, not a terminal


def _order(err: str, *needles: str) -> list[int]:
    at = [err.find(n) for n in needles]
    assert all(i >= 0 for i in at), (needles, err[-3000:])
    return at


def test_undertrained_piped_names_each_stage_before_its_work(tiny):
    p = _run("undertrained", "-m", tiny, "-n", "6", "--batch-size", "2")
    assert p.returncode == 0, p.stderr[-2000:]
    e = p.stderr
    at = _order(e, "loading ", "loaded ", "undertrained: stage tokenizer classes started",
                "undertrained: stage indicators started", "undertrained: stage verification started (",
                "undertrained: stage verification done (")
    assert at == sorted(at), e
    assert "\x1b[" not in e and "━" not in e          # plain lines, no bar drawn at the end


def test_argmax_json_piped_shows_the_load_and_the_preparation(tiny, tmp_path):
    p = _run("argmax", "-m", tiny, "--json", env_extra={"VOCABLENS_ARGMAX_CACHE": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    json.loads(p.stdout)                              # stdout: the JSON alone
    e = p.stderr
    at = _order(e, "loading ", "argmax: stage stored verdicts started", "argmax: stage prepare: duplicates started",
                "argmax: stage prepare: whitening started", "argmax: stage gemm started")
    assert at == sorted(at), e
    again = _run("argmax", "-m", tiny, "--json", env_extra={"VOCABLENS_ARGMAX_CACHE": str(tmp_path)})
    assert again.returncode == 0 and json.loads(again.stdout)["counts"] == json.loads(p.stdout)["counts"]
    assert "argmax: stage reusing the stored verdicts" in again.stderr and "stage gemm" not in again.stderr


def test_align_piped_names_its_grams_and_blocks(tiny):
    p = _run("align", str(tiny), str(tiny), "--top", "1")
    assert p.returncode == 0, p.stderr[-2000:]
    at = _order(p.stderr, "loaded ", "align: stage readout Grams started", "align: stage blocks started (")
    assert at == sorted(at), p.stderr


def test_serve_piped_shows_its_background_scan_and_its_end(tiny, tmp_path, monkeypatch):
    """`vocablens serve 2>log`: the background argmax scan's stages on stderr, then one line when it ends."""
    import signal
    import time

    from test_serve import get, start_server

    monkeypatch.setenv("VOCABLENS_ARGMAX_CACHE", str(tmp_path))   # a fresh store: the scan runs
    proc, url = start_server("-m", str(tiny))
    try:
        t0 = time.time()
        while get(url, "/api/health")["argmax"] not in ("done", "failed") and time.time() - t0 < 300:
            time.sleep(0.5)
    finally:                                              # the server joins the scan's thread as it stops

        proc.send_signal(signal.SIGINT)
        _, e = proc.communicate(timeout=120)
    at = _order(e, "loaded ", "argmax scan (background): stage stored verdicts started",
                "argmax scan (background): stage gemm started", "argmax scan done in ")
    assert at == sorted(at), e
