"""vocablens.vocab_space read the vocabulary block by block: every analysis gives the same result with
blocks of 7 rows as with the whole readout in one block (tiny models; the blocks are forced small)."""

from __future__ import annotations

import importlib

import pytest
import torch

from tiny_models import make_tiny
from vocablens import vocab_space as vs
from vocablens.models import Borders
from vocablens.vocab_space import search

ro = importlib.import_module("vocablens.vocab_space.readout")  # the package exports a function of that name
FAMILIES = ["llama", "opt_project", "gemma2"]  # gain folded in; project_out (a GEMM per block); softcap


@pytest.fixture(scope="module")
def models():
    return {f: Borders.from_model(make_tiny(f)) for f in FAMILIES}


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 vocabulary rows (V = 96: 14 blocks, the last one short), on one thread (many tiny
    GEMMs: on a busy machine each multi-threaded one waits for a descheduled thread)."""
    def use(b):
        monkeypatch.setattr(ro, "BLOCK_BYTES", 4 * int(b.d_model) * 7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield use
    torch.set_num_threads(threads)


def test_vocab_blocks_cover_the_vocabulary():
    assert ro.vocab_blocks(10, 4, block_bytes=48) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert ro.vocab_blocks(49152, 576) == [(a, min(49152, a + 3640)) for a in range(0, 49152, 3640)]
    assert ro.vocab_blocks(5, 1000, block_bytes=1) == [(a, a + 1) for a in range(5)]


@pytest.mark.parametrize("family", FAMILIES)
def test_readout_rows_are_the_readout_rows(models, family):
    b = models[family]
    for gain in (True, False):
        R = vs.readout(b, gain)
        blocks = torch.cat([ro.readout_rows(b, slice(a, c), gain) for a, c in ro.vocab_blocks(len(R), 64, 4 * 64 * 7)])
        picked = ro.readout_rows(b, [5, 2, 5], gain)
        if b.project_out is None:  # elementwise float32 operations per row: the same bits
            assert torch.equal(blocks, R) and torch.equal(picked, R[[5, 2, 5]])
        else:  # W_U · P, a GEMM per block: equal to its rounding
            torch.testing.assert_close(blocks, R, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(picked, R[[5, 2, 5]], rtol=1e-6, atol=1e-7)


def test_top_bottom_ties_lowest_id_across_blocks():
    s = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -2.0, -2.0, 1.0]])
    tb = ro.TopBottom(4)
    for a in range(0, 8, 3):
        tb.add(s[:, a:a + 3], a)
    ti, tv, bi, bv = tb.result()
    assert ti.tolist() == [[1, 2, 4, 0]] and tv.tolist() == [[3.0, 3.0, 3.0, 1.0]]
    assert bi.tolist() == [[5, 6, 3, 0]] and bv.tolist() == [[-2.0, -2.0, 0.0, 1.0]]
    assert [t.tolist() for t in ro.top_bottom(s, 4)] == [t.tolist() for t in (ti, tv, bi, bv)]


@pytest.mark.parametrize("family", FAMILIES)
def test_project_vectors_blocked_equal_whole(models, small_blocks, family):
    b = models[family]
    layers, neurons = vs.sample_neurons(b, 5, seed=2)
    kinds = ("value", "key")
    whole = {kind: vs.project_vectors(b, layers, neurons, k=6, kind=kind, chunk_rows=4) for kind in kinds}
    small_blocks(b)
    for kind in kinds:
        blocked, ref = vs.project_vectors(b, layers, neurons, k=6, kind=kind, chunk_rows=4), whole[kind]
        assert torch.equal(blocked.top_ids, ref.top_ids) and torch.equal(blocked.bottom_ids, ref.bottom_ids)
        torch.testing.assert_close(blocked.top_scores, ref.top_scores, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(blocked.bottom_scores, ref.bottom_scores, rtol=1e-6, atol=1e-7)
        # and the brute-force [n, V] scores
        M = vs.readout(b) if kind == "value" else vs.input_embedding(b)
        S = vs.vectors.gather_vectors(b, layers, neurons, kind) @ M.t()
        torch.testing.assert_close(blocked.top_scores, torch.topk(S, 6).values, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(blocked.bottom_scores, torch.topk(S, 6, largest=False).values, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_value_stats_and_search_blocked(models, small_blocks, family):
    b = models[family]
    whole = search._value_stats(b, True)
    ref = vs.search_tokens(b, [11, 40], k=5, stats=whole)
    small_blocks(b)
    st = search._value_stats(b, True)
    torch.testing.assert_close(st.mean, whole.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st.std, whole.std, rtol=1e-5, atol=1e-6)
    R = vs.readout(b)  # brute force: every value vector's logits
    S = torch.cat([v.W_out.detach().float() @ R.t() for v in vs.search.block_views(b)])
    std, mean = torch.std_mean(S.double(), dim=1, correction=0)
    torch.testing.assert_close(st.mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st.std.double(), std, rtol=1e-5, atol=1e-6)
    got = vs.search_tokens(b, [11, 40], k=5, stats=whole)
    for g, r in zip(got, ref):
        for f in ("promote_blocks", "promote_neurons", "promote_ranks", "suppress_blocks", "suppress_neurons",
                  "suppress_ranks", "promote_scores", "promote_z"):
            assert torch.equal(getattr(g, f), getattr(r, f)), f
        t = g.token_id
        rows = g.promote_blocks * S.shape[0] // b.n_layers + g.promote_neurons
        assert g.promote_ranks.tolist() == [int((S[i] > S[i, t]).sum()) for i in rows.tolist()]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_interpretable_and_circuits_blocked(models, small_blocks, family):
    b = models[family]
    whole = vs.interpretable_vectors(b, n=3, per_block=6, k=3, seed=1)
    ov = vs.head_circuit(b, 1, 0, circuit="ov", k=8)
    qk = vs.head_circuit(b, 1, 1, circuit="qk", k=8, max_sources=50)
    small_blocks(b)
    got = vs.interpretable_vectors(b, n=3, per_block=6, k=3, seed=1)
    assert torch.equal(got.vectors.blocks, whole.vectors.blocks)
    assert torch.equal(got.vectors.neurons, whole.vectors.neurons)
    assert torch.equal(got.vectors.top_ids, whole.vectors.top_ids)
    torch.testing.assert_close(got.top_z, whole.top_z, rtol=1e-5, atol=1e-6)
    for c, kw in ((ov, {"circuit": "ov", "head": 0}), (qk, {"circuit": "qk", "head": 1, "max_sources": 50})):
        g = vs.head_circuit(b, 1, k=8, **kw)
        assert torch.equal(g.src_ids, c.src_ids) and torch.equal(g.tgt_ids, c.tgt_ids)
        torch.testing.assert_close(g.scores, c.scores, rtol=1e-6, atol=1e-7)
        assert g.self_top1_fraction == c.self_top1_fraction


def test_cli_block_out_of_range_is_one_line_before_loading(tmp_path, monkeypatch, capsys):
    """``project --block 5`` on a 2-block model: one error line from the config alone, nothing loaded."""
    import transformers

    import vocablens.cli.vocab_space as cli_vs
    from vocablens.cli.common import run_app

    transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48, num_attention_heads=2,
                             vocab_size=64).save_pretrained(tmp_path)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli_vs, "load_model", no_load)
    for block, words in (("5", "blocks 0..1"), ("-1", "blocks count from 0")):
        assert run_app(["project", "--model", str(tmp_path), "--block", block, "--neuron", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error:") and words in err, err
