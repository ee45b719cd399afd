"""Library calls leave the process as they found it (issue 38 §1): no allocator setting, no thread
count, no BLAS limit, no RNG state changed behind the caller's back. The allocator knobs are set in
one place, the CLI's :func:`vocablens.cli.heap.tune_heap`.

Oracle: glibc's settings cannot be read back, so every lookup of ``mallopt`` / ``malloc_trim`` on a
C library loaded through ctypes is recorded (a lookup is needed to call either); the positive control
shows the hook sees :func:`tune_heap`'s calls. Threads, BLAS limits and RNG states are read back."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from vocablens.argmax import argmax_for_borders, find_unargmaxable


@pytest.fixture
def libc_lookups(monkeypatch):
    """Names looked up on any ctypes library from now on (``libc.mallopt`` goes through ``__getitem__``)."""
    seen: list[str] = []
    real = ctypes.CDLL.__getitem__

    def getitem(self, name):
        seen.append(name if isinstance(name, str) else str(name))
        return real(self, name)

    monkeypatch.setattr(ctypes.CDLL, "__getitem__", getitem)
    return seen


def _settings() -> dict:
    from threadpoolctl import threadpool_info

    return {"torch_threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "blas": {i["filepath"]: i["num_threads"] for i in threadpool_info()},
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state()[1].copy(),
            "grad": torch.is_grad_enabled()}


def _same(a: dict, b: dict) -> None:
    assert a["torch_threads"] == b["torch_threads"] and a["interop"] == b["interop"]
    assert a["grad"] == b["grad"]
    # the thread pools loaded before the call keep their sizes (a call may load new ones, e.g. scipy's)
    assert {k: b["blas"].get(k) for k in a["blas"]} == a["blas"]
    assert torch.equal(a["torch_rng"], b["torch_rng"]) and np.array_equal(a["numpy_rng"], b["numpy_rng"])


def _head(V=2500, d=24, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, d, generator=g, dtype=torch.float64)
    W[:40] = 0.25 * (W[100:140] + W[200:240]) + 0.5 * W.mean(0)      # interior rows: the proof stages run
    return W.float()


def test_tune_heap_is_seen_by_the_hook(libc_lookups):
    """Positive control: the one setter looks ``mallopt`` up (on glibc), and the hook records it."""
    import sys

    from vocablens.cli.heap import tune_heap

    took = tune_heap()
    if sys.platform.startswith("linux") and took:
        assert "mallopt" in libc_lookups


def test_tune_heap_sets_the_thresholds(monkeypatch):
    """The CLI's settings: block-wise commands fix the mmap threshold at 1 MiB (glibc's
    M_MMAP_THRESHOLD = -3); an argmax scan at 4 MiB with the trim threshold (M_TRIM_THRESHOLD = -1)
    at 16 MiB, set only when the scan reports its first stage (stored verdicts: no scan, no change)."""
    from vocablens.cli import heap

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

        def malloc_trim(self, pad):
            return 1

    monkeypatch.setattr(heap, "_glibc", lambda: FakeLibc())
    assert heap.tune_heap()
    assert calls == [(-3, 2 ** 20)]
    seen = []
    cb = heap.tuned_for_the_scan(lambda *a: seen.append(a))
    cb("stored verdicts", 0, 10)
    assert calls == [(-3, 2 ** 20)] and seen == [("stored verdicts", 0, 10)]
    cb("prepare: duplicates", 0, 10)
    cb("gemm", 5, 10)
    assert calls == [(-3, 2 ** 20), (-3, 4 * 2 ** 20), (-1, 16 * 2 ** 20)]      # once
    assert seen[-1] == ("gemm", 5, 10)


@pytest.mark.parametrize("bias", [False, True])
def test_find_unargmaxable_leaves_the_process_settings_as_it_found_them(libc_lookups, bias):
    torch.set_num_threads(2)                        # the workers' path (they set one thread each, then restore)
    try:
        before = _settings()
        W = _head()
        b = torch.linspace(-0.1, 0.1, W.shape[0]) if bias else None
        res = find_unargmaxable(W, b)
        assert int((res.verdict == 1).sum()) >= 40 - 1        # the planted interior rows are found
        _same(before, _settings())
        assert not {"mallopt", "malloc_trim"} & set(libc_lookups), libc_lookups
    finally:
        torch.set_num_threads(before["torch_threads"])


def test_the_model_level_scan_leaves_the_process_settings_as_it_found_them(libc_lookups):
    from tiny_models import make_tiny

    from vocablens.models import Borders

    model = make_tiny("llama")
    before = _settings()
    ma = argmax_for_borders(Borders.from_model(model), norm=True)
    assert ma.result.verdict.numel() == model.config.vocab_size
    _same(before, _settings())
    assert not {"mallopt", "malloc_trim"} & set(libc_lookups), libc_lookups
