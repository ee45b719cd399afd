"""Progress of the steps that were silent on a stderr that is not a terminal (issues 25, 26 §4, 27):
the plain lines themselves (a fake clock: no timed assertions), and the stages each analysis now
reports through its ``progress(stage, done, total)`` callback, on tiny inputs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vocablens.cli.progress import PlainProgress, PlainStatus


class Clock:
    """A fake monotonic clock: ``clock.t += 12`` moves time on."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _recorder():
    calls: list[tuple[str, int, int]] = []
    return calls, lambda stage, done, total: calls.append((stage, int(done), int(total)))


# ------------------------------------------------------------------------------ the plain lines
def test_plain_progress_beats_in_a_stage_between_stages_and_before_the_first():
    lines, clock = [], Clock()
    pp = PlainProgress(lines.append, every=10.0, clock=clock, name="cmd", unit="rows", thread=False,
                       units={"grid": "cells"})
    clock.t += 11
    pp.tick()
    assert lines == ["cmd: starting, 11 s"]          # nothing reported yet: still a line
    pp("scan", 0, 100)
    pp("scan", 25, 100)
    pp.tick()                                          # a line was just written: no beat yet
    assert lines[-1] == "cmd: stage scan started (100 rows)"
    clock.t += 10
    pp.tick()
    assert lines[-1] == "cmd: scan 25/100 rows, 10 s, ETA 30 s"   # 10 s for a quarter: 30 s left
    pp("scan", 100, 100)
    assert lines[-1] == "cmd: stage scan done (100 rows in 10.0 s)"
    clock.t += 15
    pp.tick()
    assert lines[-1] == "cmd: working after stage scan, 15 s since it ended"
    pp("grid", 0, 7)
    assert lines[-1] == "cmd: stage grid started (7 cells)"   # a stage with a unit of its own
    clock.t += 5
    pp("grid", 7, 7)
    # the stage began when the one before it ended (15 s of its own work before its first report)
    assert lines[-1] == "cmd: stage grid done (7 cells in 20.0 s)"
    n = len(lines)
    pp.close()
    clock.t += 60
    pp.tick()
    assert len(lines) == n                             # closed: silent


def test_plain_status_says_what_it_does_then_beats_then_ends():
    lines, clock = [], Clock()
    st = PlainStatus("loading m (m.gguf, from its float32 cache) ...", lines.append, every=10.0, clock=clock,
                     thread=False)
    assert lines == ["loading m (m.gguf, from its float32 cache) ..."]
    clock.t += 9
    st.tick()
    assert len(lines) == 1
    clock.t += 3
    st.tick()
    assert lines[-1] == "loading m: 12 s so far"
    clock.t += 1
    st.close()
    assert lines[-1] == "loading m: done in 13.0 s"


def test_a_short_status_prints_its_message_only():
    lines, clock = [], Clock()
    st = PlainStatus("reading the config ...", lines.append, every=10.0, clock=clock, thread=False)
    clock.t += 2
    st.tick()
    st.close()
    assert lines == ["reading the config ..."]


def test_plain_status_with_a_beat_of_its_own():
    lines, clock = [], Clock()
    st = PlainStatus("", lines.append, every=10.0, clock=clock, thread=False, beat=lambda: "report: lens (3 of 9 s)")
    assert lines == []
    clock.t += 10
    st.tick()
    st.close()
    assert lines == ["report: lens (3 of 9 s)"]


def test_status_on_a_non_terminal_stderr_prints_the_message(capsys):
    from vocablens.cli.common import status

    with status("doing a thing ..."):
        pass
    with status("quiet thing ...", quiet=True):
        pass
    err = capsys.readouterr().err
    assert err == "doing a thing ...\n"


def test_count_bar_on_a_non_terminal_stderr_prints_its_stage(capsys):
    from vocablens.cli.progress import count_bar

    with count_bar(False, 40, "lens eval", "tokens", stage="scoring") as tick:
        tick(20)
        tick(40)
    err = capsys.readouterr().err
    assert "lens eval: stage scoring started (40 tokens)" in err
    assert "lens eval: stage scoring done (40 tokens in" in err and "\x1b[" not in err


# ------------------------------------------------------------------------ stages of the analyses
def test_undertrained_reports_classes_indicators_and_verification_from_zero():
    from tiny_dirs import tiny_tokenizer
    from tiny_models import make_tiny
    from vocablens.models import Borders
    from vocablens.undertrained import undertrained

    tok = tiny_tokenizer()
    m = make_tiny("llama")
    m.resize_token_embeddings(len(tok))
    b = Borders.from_model(m)
    calls, cb = _recorder()
    undertrained(b, tok, candidates=5, batch_size=2, progress=cb)
    stages = [s for s, _, _ in calls]
    first = {s: stages.index(s) for s in dict.fromkeys(stages)}
    assert list(first) == ["tokenizer classes", "indicators", "verification"]
    V = b.vocab_size
    assert calls[first["tokenizer classes"]] == ("tokenizer classes", 0, V)
    assert calls[first["indicators"]] == ("indicators", 0, V)
    ver = [c for c in calls if c[0] == "verification"]
    total = ver[0][2]
    assert ver[0] == ("verification", 0, total) and ver[-1] == ("verification", total, total)
    assert len(ver) > 2                               # 0 before the first batch, then one per batch


def test_argmax_scan_reports_its_preparation():
    from vocablens.argmax import find_unargmaxable

    W = torch.from_numpy(np.random.default_rng(0).standard_normal((500, 12)).astype(np.float32))
    calls, cb = _recorder()
    find_unargmaxable(W, progress=cb)
    stages = list(dict.fromkeys(s for s, _, _ in calls))
    prep = [s for s in stages if s.startswith("prepare")]
    assert prep == ["prepare: duplicates", "prepare: covariance", "prepare: whitening", "prepare: int8 grid"]
    assert stages.index("prepare: int8 grid") < stages.index("gemm")
    for s in prep:
        mine = [c for c in calls if c[0] == s]
        assert mine[0][1] == 0 and mine[-1][1] == mine[-1][2] == 500, (s, mine)


def test_argmax_for_borders_reports_the_store_and_the_norm_reach(tmp_path, monkeypatch):
    from vocablens.argmax.model import argmax_for_borders

    monkeypatch.delenv("VOCABLENS_ARGMAX_CACHE", raising=False)
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path))
    W = torch.from_numpy(np.random.default_rng(1).standard_normal((300, 10)).astype(np.float32))
    b = SimpleNamespace(unembedding=SimpleNamespace(weight=W, bias=None, real_mask=None,
                                                    final_norm=torch.nn.LayerNorm(10), project_out=None,
                                                    logit_scale=1.0))
    calls, cb = _recorder()
    argmax_for_borders(b, norm=True, norm_tokens=4, stored="readwrite", progress=cb)
    stages = list(dict.fromkeys(s for s, _, _ in calls))
    assert stages[0] == "stored verdicts" and "reusing the stored verdicts" not in stages
    assert "gemm" in stages and stages[-1] == "final-norm reach"
    reach = [c for c in calls if c[0] == "final-norm reach"]
    assert reach[0][1] == 0 and reach[-1][1] == reach[-1][2] > 0
    calls.clear()
    argmax_for_borders(b, norm=False, stored="read", progress=cb)      # the same head: read back
    assert list(dict.fromkeys(s for s, _, _ in calls)) == ["stored verdicts", "reusing the stored verdicts"]


def test_align_reports_the_grams_then_each_block():
    from test_align import _tok
    from tiny_models import make_tiny
    from vocablens.models import Borders
    from vocablens.vocab_space.align import align_models

    A = Borders.from_model(make_tiny("llama"))
    calls, cb = _recorder()
    align_models(A, _tok(A.vocab_size), A, _tok(A.vocab_size), what="heads", progress=cb)
    stages = list(dict.fromkeys(s for s, _, _ in calls))
    assert stages == ["readout Grams", "embedding Grams", "blocks"]
    S = 2 * A.vocab_size                               # two passes over the shared tokens
    for s in ("readout Grams", "embedding Grams"):
        mine = [c for c in calls if c[0] == s]
        assert mine[0] == (s, 0, S) and mine[-1] == (s, S, S)
    assert [c for c in calls if c[0] == "blocks"][-1] == ("blocks", A.n_layers, A.n_layers)


def test_serve_background_scan_reports_and_ends():
    from vocablens.serve.state import ArgmaxJob

    class Result:
        def counts(self):
            return {"argmaxable": 7, "unargmaxable": 2, "undecided": 0}

    calls, cb = _recorder()
    ended = []
    job = ArgmaxJob(lm=None, report=cb, on_end=ended.append)
    job._cb("gemm", 3, 9)
    assert calls == [("gemm", 3, 9)] and job.progress == {"stage": "gemm", "done": 3, "total": 9}
    job.ma, job.seconds = SimpleNamespace(result=Result()), 1.25
    assert job.summary() == "argmax scan done in 1.2 s: 7 argmaxable, 2 unargmaxable"


@pytest.mark.parametrize("cached", [True, False])
def test_the_loading_line_names_the_gguf_and_its_cache(tmp_path, monkeypatch, cached):
    from tiny_dirs import save_tiny_gguf, tiny_tokenizer
    from vocablens.cli.common import _load_source
    from vocablens.models.files.gguf_cache import CACHE_MARK, FIRST_LOAD_S_PER_MIB, cache_dir

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    g = save_tiny_gguf(tmp_path / "t.gguf", tiny_tokenizer())
    if cached:
        cdir = cache_dir(g)
        cdir.mkdir(parents=True)
        (cdir / CACHE_MARK).write_text("{}")
        assert _load_source(str(g)) == " (t.gguf, from its float32 cache)"
    else:
        line = _load_source(str(g))
        assert line.startswith(" (first load of t.gguf: dequantizing it to a float32 cache")
        # the estimate follows the file's size at the measured rate (it was "a minute per 100M parameters")
        size = g.stat().st_size / 2**20
        assert f"about {max(1, round(size * FIRST_LOAD_S_PER_MIB))} s for its {size:.0f} MiB" in line
        assert "per 100M parameters" not in line
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    assert _load_source(str(hf)) == ""                 # a model directory: its name says it
    assert _load_source(str(tmp_path / "missing")) == ""   # the load itself says what is wrong


def test_lens_train_lines_on_a_non_terminal_stderr(capsys):
    """Step 1, every 10th, the last, and any step after 10 s without a line; the heartbeat names the step."""
    from vocablens.cli.tuned import _progress

    def info(step):
        return SimpleNamespace(step=step, steps=25, loss=1.0, layer_loss=[2.0, 0.5], lr=0.1, grad_norm=0.3,
                               tokens_per_s=100.0)

    p = _progress(False, 25)
    with p as on_step:
        for s in range(1, 26):
            if s == 13:
                p.beat.last -= 60                      # as if a minute had passed since the last line
            on_step(info(s))
        assert p._beat_line().startswith("training: 25 steps done, ")
        p.step = 12
        assert p._beat_line().startswith("training: step 13/25 running, ") and "ETA" in p._beat_line()
    err = capsys.readouterr().err
    steps = [int(line.split()[1].split("/")[0]) for line in err.splitlines() if line.startswith("step ")]
    assert err.splitlines()[0] == "training: 25 steps ..."
    assert steps == [1, 10, 13, 20, 25], err


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_dirs import save_tiny, tiny_tokenizer

    return save_tiny(tmp_path_factory.mktemp("stages") / "tiny", tiny_tokenizer())


def test_lens_anomaly_and_lens_file_count_their_inputs(tiny_dir, tmp_path, capsys):
    """Their rich bars drew nothing on a non-terminal stderr: now stage lines."""
    from tiny_dirs import run_cli

    normal = tmp_path / "normal.txt"
    normal.write_text("\n".join(f"The class statement number {i}" for i in range(6)))
    test = tmp_path / "test.txt"
    test.write_text("An odd input\nThe class statement")
    code, out, err = run_cli(capsys, "lens", "anomaly", "-m", tiny_dir, "--kind", "logit", "--normal", normal,
                             "--test", test)
    assert code == 0, err
    assert "lens anomaly: stage trajectories of normal inputs started (6 inputs)" in err
    assert "lens anomaly: stage trajectories of test inputs done (2 inputs in" in err
    code, out, err = run_cli(capsys, "lens", "--file", test, "-m", tiny_dir, "--kind", "logit")
    assert code == 0, err
    assert "lens: stage forward passes started (2 prompts)" in err and "lens: stage forward passes done (2 prompts" in err


def test_trim_drop_undertrained_shows_the_verification_stages(tiny_dir, tmp_path, capsys):
    from tiny_dirs import _corpus, run_cli

    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i, t in enumerate(_corpus()[:8]):
        (corpus / f"{i}.txt").write_text(t[:300])
    code, out, err = run_cli(capsys, "trim", "-m", tiny_dir, "--corpus", corpus, "--out", tmp_path / "t",
                             "--drop-undertrained", "--undertrained-candidates", "4")
    assert code == 0, err
    for stage in ("tokenizer classes", "indicators", "verification"):
        assert f"trim: under-trained tokens: stage {stage} started" in err, err
    assert "trim: under-trained tokens: stage verification done (" in err


# ------------------------------------------------------------------ issue 40, fault 5: estimates that jump
def test_an_eta_within_a_stage_only_counts_down_and_each_line_is_new():
    """The report's ETA went 149 -> 16 -> 15 -> 43 -> 33 -> 40 -> 76 -> 105 -> 93 -> 99 s in one run, and
    the same heartbeat line printed 3 times. Within a section the time left only counts down (an
    estimate that would end later is not taken); a new section takes its fresh estimate; no heartbeat
    line is the previous one again."""
    from vocablens.cli.report import _ProgressBar

    clock = Clock()
    bar = _ProgressBar(disabled=False, clock=clock)
    bar.live = False  # the plain lines (stderr is not a terminal here anyway)
    left, done = [], 0.0
    for description, eta in (("anatomy", 149), ("borders", 16), ("argmax", 15), ("argmax: gemm", 43),
                             ("argmax: gemm", 33), ("argmax: certificates", 40), ("argmax: certificates", 76),
                             ("argmax: certificates", 105), ("undertrained", 93), ("undertrained: verify", 99)):
        bar.update(description, done, done + eta)
        left.append((description.split(":")[0], round(bar.left())))
        clock.t += 2.0
        done += 2.0
    assert left == [("anatomy", 149), ("borders", 16), ("argmax", 15), ("argmax", 13), ("argmax", 11),
                    ("argmax", 9), ("argmax", 7), ("argmax", 5), ("undertrained", 93), ("undertrained", 91)]
    # heartbeats: the seconds in the section and the time left counting down, never the same line twice
    beats = []
    for _ in range(3):
        beats.append(bar._beat_line())
        clock.t += 8.0
    assert beats[0] == "report: undertrained (4 s in it, about 89 s left)"
    assert beats[1] == "report: undertrained (12 s in it, about 81 s left)"
    assert len(set(beats)) == 3 and bar._beat_line() != beats[-1]
    clock.t += 200.0
    assert bar._beat_line() == "report: undertrained (228 s in it, taking longer than estimated)"
    assert bar._beat_line() is None   # nothing new to say: no line


def test_plain_progress_eta_never_grows_within_a_stage():
    """argmax / lens eval / settle lines: the ETA from the measured rate, not pushed back by a slower
    stretch within the stage; once used up the line says so; a new stage starts afresh."""
    lines, clock = [], Clock()
    pp = PlainProgress(lines.append, every=10.0, clock=clock, name="cmd", unit="rows", thread=False)
    pp("scan", 0, 100)
    clock.t += 10
    pp.tick()
    assert lines[-1] == "cmd: scan 0/100 rows, 10 s, ETA unknown (nothing done yet)"
    pp("scan", 50, 100)          # 10 s for half: 10 s left
    clock.t += 10
    pp.tick()
    assert lines[-1] == "cmd: scan 50/100 rows, 20 s, ETA 20 s"
    etas = []
    for done in (55, 60, 62, 64):   # slower and slower: the rate says later, the ETA does not grow
        pp("scan", done, 100)
        clock.t += 10
        pp.tick()
        etas.append(lines[-1].rsplit("ETA ", 1)[1])
    # the rate would say 25, 27, 38, 53 s left; the ETA keeps the end it gave (20 s from then)
    assert etas == ["10 s"] + ["taking longer than estimated"] * 3 and len(set(lines)) == len(lines)
    pp("next", 0, 10)
    pp("next", 5, 10)
    clock.t += 10
    pp.tick()
    assert lines[-1].endswith("ETA 10 s")


def test_lens_eval_and_settle_report_within_their_first_row():
    """`lens eval` and `settle` printed "0/512 tokens, ETA unknown" until their first (only) row was read:
    they report after each group of layers, so a rate is measured early; the results do not change."""
    from tiny_models import ids, make_tiny
    from vocablens.lens.evaluate import READ_GROUPS, evaluate
    from vocablens.lens.tuned import TunedLens
    from vocablens.models import Borders
    from vocablens.vocab_space import settle

    b = Borders.from_model(make_tiny("llama"))
    rows = ids(batch=1, T=12)
    lens = TunedLens(b.d_model, b.n_layers)
    calls = []
    res = evaluate(b, lens, rows, on_row=lambda done, total: calls.append((done, total)))
    assert len(calls) == READ_GROUPS and calls[-1] == (1, 1) and all(t == 1 for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and 0 < calls[0][0] < 1
    ref = evaluate(b, lens, rows, chunk_rows=7)
    assert res.logit_kl == pytest.approx(ref.logit_kl, rel=1e-5, abs=1e-6)
    assert res.tuned_ce == pytest.approx(ref.tuned_ce, rel=1e-5, abs=1e-6)
    seen = []
    out = settle(b, [rows, rows[:, :6]], on_tokens=seen.append)
    L = b.n_layers
    assert len(seen) == 2 * (L + 1) and seen[-1] == 18 and seen[L] == 12
    assert seen == sorted(seen) and 0 < seen[0] < 12
    assert out.n_positions == 18


def test_a_stage_that_reports_nothing_keeps_beating_with_new_lines():
    """"Each line once" (issue 40 fault 5) means no line the previous one again, not no heartbeat: a
    long silent stage still prints a line every ``every`` s (the elapsed seconds move on), and the ETA
    in them only counts down."""
    lines, clock = [], Clock()
    pp = PlainProgress(lines.append, every=8.0, clock=clock, name="cmd", unit="rows", thread=False)
    pp("scan", 0, 10)
    clock.t += 4
    pp("scan", 2, 10)                 # 4 s for 2 of 10: 16 s left
    for _ in range(5):
        clock.t += 8
        pp.tick()
    beats = lines[1:]
    assert len(beats) == 5 and len(set(beats)) == 5
    assert [b.split(", ")[1] for b in beats] == ["12 s", "20 s", "28 s", "36 s", "44 s"]
    # the rate at the first beat (12 s for 2 of 10) says 48 s; later, slower rates do not push it back
    assert [b.rsplit("ETA ", 1)[1] for b in beats] == ["48 s", "40 s", "32 s", "24 s", "16 s"]
