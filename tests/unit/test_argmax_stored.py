"""Stored verdicts (vocablens.argmax.stored): equal to the computed scan, never stale, never partial."""

import pytest
import numpy as np
import torch

from vocablens.argmax import find_unargmaxable
from vocablens.argmax.stored import load_verdicts, store_verdicts, verdict_key



@pytest.fixture(autouse=True)
def _store_under_vocablens_cache(monkeypatch):
    """These tests set VOCABLENS_CACHE themselves: the suite's own argmax directory must not win."""
    monkeypatch.delenv("VOCABLENS_ARGMAX_CACHE", raising=False)

def _W(seed=0, V=400, d=12):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d))
    W[5] = 0.5 * (W[1] + W[2]) * 0.5       # an interior row (a combination certificate)
    W[7] = W[6]                            # a duplicate pair
    return torch.from_numpy(W.astype(np.float32))


def _key(W, b=None, **settings):
    return verdict_key(W, b, {}, {"padding": None}, settings)


def _same(a, b):
    for n in ("verdict", "stage", "margin", "residual", "group", "in_play", "quant", "row"):
        assert torch.equal(torch.nan_to_num(getattr(a, n)), torch.nan_to_num(getattr(b, n))), n
    assert a.counts() == b.counts() and a.group_can_tie == b.group_can_tie
    assert set(a.x_extra) == set(b.x_extra) and set(a.combos) == set(b.combos)
    for t in a.combos:
        assert torch.equal(a.combos[t][1], b.combos[t][1])
    assert a.timings == b.timings and a.cut_short == b.cut_short


def test_stored_equals_computed_and_changed_head_misses(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path))
    W = _W()
    res = find_unargmaxable(W)
    assert res.counts()["unargmaxable"] >= 1
    k = _key(W, tol=1e-9)
    assert load_verdicts(k) is None
    assert store_verdicts(res, k) is not None
    _same(load_verdicts(k), res)
    # one bit of one weight changed, or another setting: another key, nothing served
    W2 = W.clone()
    W2[3, 4] = torch.nextafter(W2[3, 4], torch.tensor(10.0))
    assert _key(W2, tol=1e-9) != k and load_verdicts(_key(W2, tol=1e-9)) is None
    assert _key(W, tol=1e-8) != k
    assert _key(W, torch.zeros(400)) != _key(W)
    # a corrupt or mismatched JSON is never a result
    (tmp_path / "argmax" / f"{k}.json").write_text("{")
    assert load_verdicts(k) is None


def test_interrupted_or_budget_cut_scan_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path))
    W = _W(1)
    cut = find_unargmaxable(W, time_budget_s=0.0)
    assert cut.cut_short
    assert store_verdicts(cut, _key(W)) is None

    import vocablens.argmax.exact as ex

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(ex, "stage_reflect", boom)
    intr = find_unargmaxable(W, reflect_iters=5)
    assert intr.interrupted
    assert store_verdicts(intr, _key(W)) is None
    assert not (tmp_path / "argmax").exists() or not list((tmp_path / "argmax").iterdir())


def test_caching_off_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", "off")
    W = _W(2)
    assert store_verdicts(find_unargmaxable(W), _key(W)) is None and load_verdicts(_key(W)) is None


def test_argmax_for_borders_reuses_the_stored_scan_and_never_a_stale_one(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from vocablens.argmax.model import argmax_for_borders

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path))
    W = _W(4)
    norm = torch.nn.LayerNorm(12)

    def borders(W):
        return SimpleNamespace(unembedding=SimpleNamespace(weight=W, bias=None, real_mask=None, final_norm=norm,
                                                           project_out=None, logit_scale=1.0))
    first = argmax_for_borders(borders(W), norm=False, stored="readwrite").result
    assert len(list((tmp_path / "argmax").glob("*.json"))) == 1
    again = argmax_for_borders(borders(W), norm=False, stored="read").result
    _same(again, first)                          # the stored one: even its timings are the first run's
    W2 = W.clone()
    W2[0, 0] += 1e-6
    fresh = argmax_for_borders(borders(W2), norm=False, stored="read").result
    assert fresh.timings != first.timings        # computed afresh, not served stale
    with torch.no_grad():
        norm.weight[0] = 2.0                     # a changed final norm is another key too
    assert argmax_for_borders(borders(W), norm=False, stored="read").result.timings != first.timings


def test_expected_scan_seconds_is_zero_only_for_a_stored_scan_of_this_head(tmp_path, monkeypatch):
    """The report's ETA for the scan: 0 when stored verdicts answer it, the measured estimate when
    not, and a changed head (one bit) is not answered by the old head's verdicts."""
    from types import SimpleNamespace

    from vocablens.argmax.model import argmax_for_borders, expected_scan_seconds

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path))
    norm = torch.nn.LayerNorm(12)

    def borders(W):
        return SimpleNamespace(unembedding=SimpleNamespace(weight=W, bias=None, real_mask=None, final_norm=norm,
                                                           project_out=None, logit_scale=1.0))
    W = _W(5)
    assert expected_scan_seconds(borders(W)) > 0
    argmax_for_borders(borders(W), norm=False, stored="readwrite")
    assert expected_scan_seconds(borders(W)) == 0.0
    W2 = W.clone()
    W2[3, 1] = torch.nextafter(W2[3, 1], torch.tensor(9.0))
    assert expected_scan_seconds(borders(W2)) > 0


def test_report_argmax_section_is_complete_after_one_argmax_run(tmp_path, monkeypatch, capsys):
    """Issue 26 §3: once `vocablens argmax` has run, the report's argmax section reads its stored
    verdicts: complete (nothing undecided, nothing cut short) even with no time left to scan, and no
    scan runs; another head (nothing stored for it) is scanned afresh."""
    import vocablens.argmax.model as M
    from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
    from vocablens.argmax import UNDECIDED
    from vocablens.handle import Model
    from vocablens.models.files.loader import load
    from vocablens.report.runner import run_report

    monkeypatch.setenv("VOCABLENS_ARGMAX_CACHE", str(tmp_path / "verdicts"))
    tok = tiny_tokenizer()
    d = save_tiny(tmp_path / "m", tok)
    code, _, err = run_cli(capsys, "argmax", "-m", str(d))
    assert code == 0, err
    assert len(list((tmp_path / "verdicts").rglob("*.json"))) == 1
    lm = Model.of(load(str(d)))  # the report's sections call the handle's workflows

    def no_scan(*a, **k):
        raise AssertionError("the report scanned although a stored scan exists")

    real = M.find_unargmaxable
    monkeypatch.setattr(M, "find_unargmaxable", no_scan)
    t = iter(range(0, 10_000, 50))            # every clock reading 50 s later: no time left for a scan
    run = run_report(lm, model=str(d), budget_s=60, only=("argmax",), clock=lambda: float(next(t)))
    assert "argmax" not in run.cut_short, run.cut_short
    res = run.result("argmax")
    assert res is not None and int((res.result.verdict == UNDECIDED).sum()) == 0
    # another head: the stored verdicts are not its own, so the report scans it
    calls = []
    monkeypatch.setattr(M, "find_unargmaxable", lambda *a, **k: calls.append(1) or real(*a, **k))
    lm2 = Model.of(load(str(save_tiny(tmp_path / "m2", tok, seed=1))))
    run2 = run_report(lm2, model=str(d), budget_s=60, only=("argmax",))
    assert calls == [1] and run2.result("argmax") is not None


def test_scan_estimate_is_timed_here_and_scales_with_v_squared(monkeypatch):
    """The time the report quotes for `vocablens argmax` comes from a GEMM slice timed on this
    machine, scaled to all V² pairs, times the benchmark's ratio (a fake clock: 1 s per slice)."""
    import itertools

    import vocablens.argmax.estimate as E

    assert E.all_pairs_seconds(torch.randn(300, 8)) > 0          # the real clock: a positive time
    ticks = itertools.count()
    monkeypatch.setattr(E.time, "perf_counter", lambda: float(next(ticks)))
    W = torch.randn(4096, 16)
    assert E.all_pairs_seconds(W, rows=512, cols=1024) == (4096 / 512) * (4096 / 1024)
    assert E.all_pairs_seconds(torch.randn(8192, 16), rows=512, cols=1024) == 4 * 32.0   # V²
    assert E.all_pairs_seconds(torch.randn(100, 16)) == 1.0      # the slice is the whole matrix
    assert E.scan_seconds(W) == E.SCAN_TO_ALL_PAIRS * E.all_pairs_seconds(W)
    with pytest.raises(ValueError, match="non-empty"):
        E.all_pairs_seconds(torch.zeros(0, 3))
