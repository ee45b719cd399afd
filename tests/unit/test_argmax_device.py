"""``--device`` for the argmax scan: the certificate products of stage ``gemm`` run where asked; on
the CPU the verdicts equal a brute-force reference; a missing CUDA is one clear error. No test needs
a GPU (the CUDA cases run only where there is none to check the error, or where there is one to
compare against the CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.argmax import find_unargmaxable
from vocablens.errors import BadInput

NO_CUDA = not torch.cuda.is_available()


def _brute(W: np.ndarray) -> np.ndarray:
    """float64 brute force: row i is a vertex of the hull (no bias) iff an LP finds x with
    w_i . x >= w_j . x + 1 for all j != i (scipy HiGHS); distinct rows only."""
    from scipy.optimize import linprog

    V, d = W.shape
    out = np.zeros(V, dtype=bool)
    for i in range(V):
        A = W[np.arange(V) != i] - W[i]                     # (w_j - w_i) . x <= -1
        r = linprog(np.zeros(d), A_ub=A, b_ub=-np.ones(V - 1), bounds=[(None, None)] * d, method="highs")
        out[i] = r.status == 0
    return out


def _adversarial(seed: int) -> np.ndarray:
    """Rows with near-duplicates, rows at the mean, planted interior rows and a near-tie pair."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((90, 6)) * np.exp(0.4 * rng.standard_normal((90, 1)))
    W[10:15] = W[20:25] * (1 + 1e-6 * rng.standard_normal((5, 6)))     # near-duplicates
    W[30:33] = W[40:].mean(0) + 1e-3 * rng.standard_normal((3, 6))    # reserved rows at the mean
    W[50] = 0.5 * (W[60] + W[61])                                      # on an edge: not a vertex
    W[51] = 0.25 * (W[62] + W[63]) + 0.5 * W[40:].mean(0)              # planted interior
    W[52] = W[64] * (1 - 1e-9)                                         # a near-tie with row 64
    return W


@pytest.mark.parametrize("seed", [0, 1])
def test_device_cpu_matches_brute_force_on_adversarial_rows(seed):
    W = _adversarial(seed)
    res = find_unargmaxable(torch.from_numpy(W), device="cpu", max_rounds=80)
    want = _brute(W)
    v = res.verdict.numpy()
    decided = v != 3                                       # 0 argmaxable, 1 unargmaxable, 3 undecided
    # a 1e-6 near-duplicate may stay undecided (its proof stalls): never guessed, and only those
    assert set(np.nonzero(~decided)[0]) <= set(range(10, 15)) | set(range(20, 25))
    assert np.array_equal((v == 0)[decided], want[decided])
    assert v[50] == 1 and v[51] == 1 and v[30:33].tolist() == [1, 1, 1]
    same = find_unargmaxable(torch.from_numpy(W), max_rounds=80)
    assert torch.equal(same.verdict, res.verdict) and torch.equal(same.stage, res.stage)


def test_unknown_or_missing_device_is_one_clear_error():
    W = torch.randn(20, 4)
    with pytest.raises(BadInput, match="cpu or an available CUDA GPU"):
        find_unargmaxable(W, device="mps")
    with pytest.raises(BadInput, match="device must be cpu or cuda"):
        find_unargmaxable(W, device="not-a-device")


@pytest.mark.skipif(not NO_CUDA, reason="checks the error where CUDA is missing")
def test_cuda_without_cuda_is_bad_input():
    with pytest.raises(BadInput, match="CUDA is not available"):
        find_unargmaxable(torch.randn(20, 4), device="cuda")


@pytest.mark.skipif(NO_CUDA, reason="needs a GPU")
def test_cuda_gives_the_cpu_verdicts():        # pragma: no cover - runs only where a GPU is lent
    W = torch.from_numpy(_adversarial(2))
    a = find_unargmaxable(W, device="cpu")
    b = find_unargmaxable(W, device="cuda")
    assert torch.equal(a.verdict, b.verdict) and torch.equal(a.stage, b.stage)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("argdev") / "tiny"
    save_tiny(d, tiny_tokenizer())
    return d


def test_cli_argmax_device_cpu(tiny_dir, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VOCABLENS_ARGMAX_CACHE", "off")
    code, out, err = run_cli(capsys, "argmax", "--model", tiny_dir, "--device", "cpu", "--json", "--no-norm")
    assert code == 0, err
    d = json.loads(out)
    assert d["counts"]["undecided"] == 0 and sum(d["counts"].values()) == len(d["per_token"]["verdict"])


@pytest.mark.skipif(not NO_CUDA, reason="checks the error where CUDA is missing")
def test_cli_argmax_device_cuda_missing(tiny_dir, capsys):
    code, out, err = run_cli(capsys, "argmax", "--model", tiny_dir, "--device", "cuda")
    assert code == 2 and out == ""
    lines = [s for s in err.splitlines() if s.strip()]
    assert len(lines) == 1 and "CUDA is not available" in lines[0] and "Traceback" not in err
