"""Exact int8 products against Q packed for oneDNN (vocablens.argmax.kernels): equal to int64
products on every range shape, refused where float32 could not hold them, and a scan that uses
them gives the same verdicts, stages and margins as one that does not."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import vocablens.argmax.certificates as certificates
import vocablens.argmax.kernels as kernels
import vocablens.argmax.scoring as scoring
from vocablens.argmax import find_unargmaxable

needs_onednn = pytest.mark.skipif(kernels._op() is None, reason="this PyTorch build has no oneDNN int8 matmul")


@needs_onednn
@pytest.mark.parametrize("r", [8, 100, 576, kernels.MAX_WIDTH])
def test_products_equal_int64_on_aligned_unaligned_and_partial_ranges(r):
    g = torch.Generator().manual_seed(r)
    n = 1300                                            # chunks of 128: the last one partial (20 rows)
    Q = torch.randint(-127, 128, (n, r), generator=g, dtype=torch.int8)
    Q[0] = 127                                          # the grid's extremes: |sum| = 127^2 r < 2^24
    Q[1] = -127
    pk = kernels.PackedRows(Q, rows=128, workers=2)
    A = torch.cat([Q[:30], torch.randint(-127, 128, (5, r), generator=g, dtype=torch.int8)])
    for a, b in [(0, 128), (128, 256), (0, n), (5, 6), (100, 300), (1280, n), (1299, n), (127, 129)]:
        got = pk.mm(A, a, b)
        assert got.dtype == torch.float32 and got.shape == (len(A), b - a)
        assert torch.equal(got.long(), A.long() @ Q[a:b].long().T), (a, b)


def test_rows_wider_than_float32_exact_integers_are_refused():
    Q = torch.zeros(4, kernels.MAX_WIDTH + 1, dtype=torch.int8)
    with pytest.raises(ValueError, match="exact"):
        kernels.PackedRows(Q)
    st = types.SimpleNamespace(Qt=Q, n=4, device="cpu")
    assert kernels.packed_rows(st) is None


@needs_onednn
def test_packed_rows_serves_only_resident_cpu_int8_q_and_is_made_once():
    Q = torch.randint(-127, 128, (600, 64), dtype=torch.int8)
    assert kernels.packed_rows(types.SimpleNamespace(Qt=None, n=600, device="cpu")) is None
    assert kernels.packed_rows(types.SimpleNamespace(Qt=Q, n=600, device="cuda")) is None
    assert kernels.packed_rows(types.SimpleNamespace(Qt=Q.float(), n=600, device="cpu")) is None
    st = types.SimpleNamespace(Qt=Q, n=600, device="cpu")
    first = kernels.packed_rows(st)
    assert kernels.packed_rows(st) is first              # kept on the scan state (None or the packed Q)
    if first is not None:
        assert torch.equal(first.mm(Q[:7], 0, 600).long(), Q[:7].long() @ Q.long().T)


def _head(V=3000, d=96, seed=0):
    """Gaussian rows with heavy-tailed norms, 40 rows at the mean (the tilt), 30 near-duplicate
    pairs (the reflect stage's int8 scores) and 10 midpoints of two rows (interior proofs)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d)) * np.exp(0.5 * rng.standard_normal((V, 1)))
    W[:40] = W[40:].mean(0) + 0.03 * rng.standard_normal((40, d))
    W[40:70] = W[100:130] + 1e-3 * rng.standard_normal((30, d))
    W = np.round(W * 1024) / 1024                       # multiples of 2^-10: the midpoints below
    W[70:80] = 0.5 * (W[200:210] + W[300:310])          # are exact in float32
    return torch.from_numpy(W.astype(np.float32))


@needs_onednn
def test_scan_with_packed_q_equals_the_scan_without(monkeypatch):
    W = _head()
    used = []

    def always(st):                                     # packed whenever it can serve, no timing
        if getattr(st, "_packed", False) is False:
            st._packed = kernels.PackedRows(st.Qt) if st.Qt is not None else None
        used.append(st._packed is not None)
        return st._packed

    for mod in (kernels, certificates, scoring):
        monkeypatch.setattr(mod, "packed_rows", always)
    on = find_unargmaxable(W)
    assert used and all(used) and len(used) >= 3        # the all-pairs stage, the reflect scores, the tilt
    for mod in (kernels, certificates, scoring):
        monkeypatch.setattr(mod, "packed_rows", lambda st: None)
    off = find_unargmaxable(W)
    assert torch.equal(on.verdict, off.verdict)
    assert torch.equal(on.stage, off.stage)
    assert torch.equal(torch.nan_to_num(on.margin, nan=-7.0), torch.nan_to_num(off.margin, nan=-7.0))
    assert set(on.ids("unargmaxable").tolist()) >= set(range(40)) | set(range(70, 80))
    assert on.counts()["undecided"] == 0
