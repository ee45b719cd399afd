"""Exact int8 products against Q (vocablens.argmax.kernels): the kernel picked for a scan equals
int64 products on every range shape, a kernel that is wrong on this CPU is never picked, wide rows
are refused by the packed kernel, and a scan gives the same verdicts, stages and margins whichever
kernel it runs on."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import vocablens.argmax.certificates as certificates
import vocablens.argmax.kernels as kernels
from vocablens.argmax import find_unargmaxable

needs_onednn = pytest.mark.skipif(kernels._op() is None, reason="this PyTorch build has no oneDNN int8 matmul")

RANGES = [(0, 128), (128, 256), (5, 6), (100, 300), (127, 129)]


def _grid(n, r, seed, lim=127):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randint(-lim, lim + 1, (n, r), generator=g, dtype=torch.int8)
    Q[0] = lim                                          # the grid's extremes
    Q[1] = -lim
    Q[2, ::2] = -lim
    return Q


@needs_onednn
@pytest.mark.parametrize("r", [8, 100, 576, kernels.MAX_WIDTH])
def test_packed_products_equal_int64_on_aligned_unaligned_and_partial_ranges(r):
    # values within +-64: no pair of products can reach 2^15 even where oneDNN's AVX2 path shifts one
    # operand to unsigned (<= 2 x 192 x 64), so the packed kernel is exact on every x86 CPU here; at
    # +-127 it is not on AVX2-only CPUs, which test_a_wrong_kernel_is_never_picked covers
    n = 1300                                            # chunks of 128: the last one partial (20 rows)
    Q = _grid(n, r, r, lim=64)
    pk = kernels.PackedRows(Q, rows=128, workers=2)
    A = Q[:35]
    for a, b in RANGES + [(0, n), (1280, n), (1299, n)]:
        got = pk.mm(A, a, b)
        assert got.dtype == torch.float32 and got.shape == (len(A), b - a)
        assert torch.equal(got.long(), A.long() @ Q[a:b].long().T), (a, b)


@pytest.mark.parametrize("r", [8, 100, 576, kernels.MAX_WIDTH, 2100])
def test_the_picked_kernel_and_the_float32_kernel_equal_int64(r):
    n = 1100
    Q = _grid(n, r, r)
    px = kernels.exact_products(Q)
    assert px.kind in px.timing and px.kind in ("onednn", "int_mm", "float32")
    fp = kernels.Products(Q, "float32")
    A = torch.cat([Q[:30], _grid(5, r, r + 1)])
    for a, b in RANGES + [(0, n), (1099, n)]:
        want = A.long() @ Q[a:b].long().T
        assert torch.equal(px.mm(A, a, b).long(), want), (px.kind, a, b)
        assert torch.equal(fp.mm(A, a, b).long(), want), ("float32", a, b)
    if r > kernels.MAX_WIDTH:
        assert px.kind != "onednn"


def test_a_wrong_kernel_is_never_picked(monkeypatch):
    """Every int8 kernel made wrong by one unit on one product: the picker falls back to float32."""
    Q = _grid(700, 64, 3)
    true_pack, true_int = kernels.PackedRows.mm, getattr(torch, "_int_mm", None)

    def off_by_one(f):
        def g(*a):
            out = f(*a).clone()
            out[-1, -1] += 1
            return out
        return g

    monkeypatch.setattr(kernels.PackedRows, "mm", off_by_one(true_pack))
    if true_int is not None:
        monkeypatch.setattr(torch, "_int_mm", off_by_one(true_int))
    px = kernels.exact_products(Q)
    assert px.kind == "float32" and set(px.timing) == {"float32"}
    assert torch.equal(px.mm(Q[:9], 0, 700).long(), Q[:9].long() @ Q.long().T)


def test_rows_wider_than_float32_exact_integers_are_refused_by_the_packed_kernel():
    Q = torch.zeros(4, kernels.MAX_WIDTH + 1, dtype=torch.int8)
    with pytest.raises(ValueError, match="exact"):
        kernels.PackedRows(Q)


def test_products_serve_only_resident_cpu_int8_q():
    Q = torch.randint(-127, 128, (600, 64), dtype=torch.int8)
    assert kernels.exact_products(None) is None
    assert kernels.exact_products(Q, "cuda") is None
    assert kernels.exact_products(Q.float()) is None
    assert kernels.exact_products(Q[:40]) is None
    assert kernels.exact_products(Q) is not None


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


def _kinds_exact_here(Q):
    """The kernels exact on this CPU for grids like Q (float32 always)."""
    out = ["float32"]
    ext = torch.cat([kernels._extremes(Q.shape[1]), Q[:60]])
    want = ext.long() @ ext.long().T
    if hasattr(torch, "_int_mm") and Q.shape[1] % 8 == 0:
        if torch.equal(kernels.Products(ext, "int_mm").mm(ext, 0, len(ext)).long(), want):
            out.append("int_mm")
    if kernels._op() is not None:
        pk = kernels.PackedRows(ext)
        if torch.equal(kernels.Products(ext, "onednn", pk).mm(ext, 0, len(ext)).long(), want):
            out.append("onednn")
    return out


def test_scan_gives_the_same_result_on_every_kernel(monkeypatch):
    # 1,600 rows (4 packed chunks of 512, the last partial): every stage still settles rows
    # (gemm 1,312, reflect 113, proof 175, verify 632), at a quarter of 3,000 rows' all-pairs cost
    # (the oneDNN kernel's scan is most of this test's time on CPUs where it is slow)
    W = _head(V=1600)
    results, used = {}, []
    kinds = _kinds_exact_here(torch.randint(-127, 128, (64, W.shape[1]), dtype=torch.int8))
    callers = set()
    true_mm = kernels.Products.mm

    def mm(self, A, a, b):
        callers.add((self.kind, sys._getframe(1).f_globals["__name__"]))
        return true_mm(self, A, a, b)

    monkeypatch.setattr(kernels.Products, "mm", mm)
    for kind in kinds:
        def forced(Q, device="cpu", kind=kind):
            used.append(kind)
            return kernels.Products(Q, kind, kernels.PackedRows(Q) if kind == "onednn" else None)
        monkeypatch.setattr(certificates, "exact_products", forced)
        results[kind] = find_unargmaxable(W)
    assert used == kinds                                  # picked once per scan, by stage gemm
    for kind in kinds:       # the all-pairs stage, the reflect scores and the tilt each ran on it
        assert {(kind, "vocablens.argmax." + m) for m in ("certificates", "scoring", "tilt")} <= callers
    ref = results["float32"]
    for kind, res in results.items():
        assert torch.equal(res.verdict, ref.verdict), kind
        assert torch.equal(res.stage, ref.stage), kind
        assert torch.equal(torch.nan_to_num(res.margin, nan=-7.0), torch.nan_to_num(ref.margin, nan=-7.0)), kind
    assert set(ref.ids("unargmaxable").tolist()) >= set(range(40)) | set(range(70, 80))
    assert ref.counts()["undecided"] == 0
