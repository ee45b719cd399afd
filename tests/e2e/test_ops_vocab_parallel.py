"""Vocab-parallel embedding and LM head: 1-4 gloo processes on this machine vs the single-process result."""

from __future__ import annotations

import pytest
import torch

from vocablens.errors import BadInput, ShapeMismatch
from vocablens.ops import shard_range, shard_sizes, vocab_parallel_cross_entropy, vocab_parallel_embedding
from vp_worker import run_world

TOL = 2e-5  # float32 vs float64 reference


def _assert_all(results: list[dict], world: int, tol: float = TOL, bf16: tuple[str, ...] = ()) -> None:
    assert len(results) == world
    for rank, res in enumerate(results):
        for key, val in res.items():
            if key.endswith(("_equal",)):
                assert val is True, f"rank {rank}: {key} is {val}"
            elif key.endswith("_err"):
                t = 5e-2 if key.split("/")[0] in bf16 else tol
                assert val <= t, f"rank {rank}: {key} = {val} > {t}"
    # replicated results agree on every rank
    for key in results[0]:
        if "_dW_" in key or "_db_" in key or "emb_grad" in key or "log_softmax_err" in key or "shard_rows" in key \
                or key.endswith("/world"):
            continue
        assert all(r[key] == results[0][key] for r in results), key


def test_shard_ranges_uneven_and_complete():
    assert shard_sizes(49152, 3) == [16384, 16384, 16384]
    assert shard_sizes(1001, 4) == [251, 250, 250, 250]
    assert shard_sizes(7, 7) == [1] * 7
    for V, ws in [(1001, 4), (10, 3), (49152, 3), (5, 2)]:
        rows = [i for r in range(ws) for i in range(*shard_range(V, ws, r))]
        assert rows == list(range(V))


def test_world_larger_than_vocab_is_a_clear_error():
    with pytest.raises(BadInput, match="world size 5 is larger than the vocabulary V=4"):
        shard_range(4, 5, 0)
    with pytest.raises(BadInput):
        shard_range(10, 2, 2)


def test_single_process_functional_bad_input():
    W = torch.randn(10, 4)
    with pytest.raises(BadInput, match="outside"):
        vocab_parallel_embedding(torch.tensor([0, 10]), W, 0, 10)
    with pytest.raises(ShapeMismatch, match="integer"):
        vocab_parallel_embedding(torch.tensor([0.0]), W, 0, 10)
    with pytest.raises(ShapeMismatch, match=r"targets \(3,\)"):
        vocab_parallel_cross_entropy(torch.randn(2, 10), torch.tensor([1, 2, 3]), 0, 10)
    with pytest.raises(BadInput, match="outside"):
        vocab_parallel_cross_entropy(torch.randn(2, 10), torch.tensor([1, 12]), 0, 10)


def test_world_without_a_process_group_is_rank_0_of_1():
    from vocablens.ops.vocab_parallel.comm import world

    assert world() == (0, 1)


def test_world_1(tmp_path):
    sc = [dict(name="w1", V=50, d=8, N=9, bias=True, softcap=5.0, label_smoothing=0.1, ignore_every=4)]
    _assert_all(run_world(1, sc, str(tmp_path)), 1)


def test_world_2_bug_repros(tmp_path):
    sc = [
        # ml-cross-entropy PR #42: V=10 split 5/5, e[6,4]; dE must be the full-vocab gradient on every rank
        dict(name="cce42", V=10, d=4, N=6),
        # ms-swift PR #9947: target owned by rank 1 only (id 6 of 8)
        dict(name="swift9947", V=8, d=4, N=5, target=6),
        # Megatron #7464: 6 positions, V=8, label smoothing 0.1 uses the global V
        dict(name="megatron7464", V=8, d=4, N=6, label_smoothing=0.1, bias=True),
        # all targets ignored: loss 0 for mean and sum, zero gradients, no NaN
        dict(name="allignored", V=9, d=4, N=4, all_ignored=True),
    ]
    res = run_world(2, sc, str(tmp_path))
    _assert_all(res, 2)
    assert res[0]["cce42/emb_shard_rows"] == 5 and res[1]["cce42/emb_shard_rows"] == 5
    assert [r["cce42/world"] for r in res] == [[0, 2], [1, 2]]  # comm.world(): (rank, world size)
    for r in res:
        assert r["allignored/ce_mean_dx_err"] == 0.0 and r["allignored/ce_mean_err"] == 0.0


def test_world_3_default_vocab(tmp_path):
    # the default model's V=49152 split 3 ways (16384 rows each), bf16 weights too
    sc = [dict(name="v49152", V=49152, d=16, N=6, bias=False, ignore_every=3, label_smoothing=0.05, k=8),
          dict(name="bf16", V=301, d=8, N=5, dtype="bfloat16", softcap=3.0)]
    res = run_world(3, sc, str(tmp_path))
    _assert_all(res, 3, bf16=("bf16",))
    assert [r["v49152/emb_shard_rows"] for r in res] == [16384, 16384, 16384]
    assert res[0]["v49152/gather_shape"] == [6, 49152]


def test_world_4_odd_vocab_and_megatron_vector(tmp_path):
    sc = [dict(name="odd", V=1001, d=8, N=7, bias=True, softcap=4.0, label_smoothing=0.2, ignore_every=3, k=6),
          dict(name="meg", V=13, d=4, N=3, megatron=True, k=13)]
    res = run_world(4, sc, str(tmp_path))
    _assert_all(res, 4)
    assert [r["odd/emb_shard_rows"] for r in res] == [251, 250, 250, 250]
    # Megatron-LM tests/unit_tests/tensor_parallel/test_cross_entropy.py expected values
    assert res[0]["meg/megatron_loss"] == [10.2309, 8.2309, 6.2309, 4.2309] * 4


def test_vocab_parallel_token_logprobs_one_rank_equals_float64():
    """vocab_parallel_token_logprobs in a world of one (no process group): log p(target), entropy and
    top-k against float64 log_softmax of the same logits, a -inf column included."""
    from vocablens.ops.vocab_parallel.losses import vocab_parallel_token_logprobs

    g = torch.Generator().manual_seed(2)
    z = torch.randn(6, 40, generator=g) * 8
    z[:, 33] = float("-inf")
    t = torch.tensor([0, 3, 39, 12, 12, 7])
    lp, ent, ti, tv = vocab_parallel_token_logprobs(z, t, 0, 40, top_k=3)
    ref = torch.log_softmax(z.double(), -1)
    assert (lp.double() - ref.gather(1, t[:, None])[:, 0]).abs().max() <= 1e-5
    p = ref.exp()
    assert (ent.double() + torch.where(p > 0, p * ref, torch.zeros_like(p)).sum(-1)).abs().max() <= 1e-5
    rv, ri = torch.topk(ref, 3)
    assert torch.equal(ti, ri) and (tv.double() - rv).abs().max() <= 1e-5
    lp0, _, ti0, tv0 = vocab_parallel_token_logprobs(z, t, 0, 40)
    assert torch.equal(lp0, lp) and ti0.shape == (6, 0) and tv0.shape == (6, 0)
