"""Models larger than memory: blocks streamed from the checkpoint give the normal path's results."""

import json

import pytest
import torch

from tiny_models import make_tiny
from test_lazy import _write_tokenizer
from vocablens.errors import BadInput
from vocablens.models import load
from vocablens.models.files.streaming import checkpoint_bytes, load_streaming, parse_bytes


@pytest.fixture(scope="module", params=["llama_tied", "gpt2", "gemma3_text"])
def saved(request, tmp_path_factory):
    model = make_tiny(request.param)
    d = tmp_path_factory.mktemp(f"stream_{request.param}")
    model.save_pretrained(d, safe_serialization=True)
    _write_tokenizer(d, model.config.vocab_size)
    return request.param, d


def test_streamed_lens_and_logits_equal_normal_path(saved):
    from vocablens.lens.logit import logit_lens

    family, d = saved
    full = load(str(d))
    size = checkpoint_bytes(d)
    st = load_streaming(str(d), max_memory=size // 2)  # below the model's size
    streamers = st.model.vocablens_streamers
    assert streamers and len(streamers) <= st.borders.n_layers
    assert all(p.is_meta for s in streamers for p in s.block.parameters())
    ids = torch.tensor([3, 17, 5, 42, 8, 9])
    r1, l1 = full.borders.residual_stream(ids)
    r2, l2 = st.borders.residual_stream(ids)
    assert torch.allclose(r1, r2, atol=1e-5, rtol=0) and torch.allclose(l1, l2, atol=1e-5, rtol=0)
    a = logit_lens(full.borders, ids, positions="all", k=3)
    b = logit_lens(st.borders, ids, positions="all", k=3)
    assert len(a.layers) == len(b.layers) == full.borders.n_layers + 1
    for x, y in zip(a.layers, b.layers):
        assert torch.equal(x.top_ids, y.top_ids) and torch.equal(x.final_top1_rank, y.final_top1_rank)
        for f in ("top_probs", "entropy", "kl_to_final", "final_top1_prob"):
            assert torch.allclose(getattr(x, f), getattr(y, f), atol=1e-5, rtol=0), f
    assert a.model_max_abs_diff == pytest.approx(b.model_max_abs_diff, abs=1e-5)
    # each streamed block was read once per forward (two forwards) and dropped again
    assert all(s.loads == 2 for s in streamers)
    assert all(p.is_meta for s in streamers for p in s.block.parameters())


def test_blocks_that_fit_stay_resident(saved):
    family, d = saved
    whole = load_streaming(str(d), max_memory=10 * checkpoint_bytes(d))
    assert whole.model.vocablens_streamers == []
    assert not any(p.is_meta for p in whole.model.parameters())
    tiny = load_streaming(str(d), max_memory=1)  # nothing fits: every block streams
    assert len(tiny.model.vocablens_streamers) == tiny.borders.n_layers


def test_parse_bytes():
    assert parse_bytes("200MB") == 200 * 10**6 and parse_bytes("1.5GiB") == int(1.5 * 2**30)
    assert parse_bytes("512") == 512 and parse_bytes(4096) == 4096
    for bad in ("lots", "-3MB", "0", "2XB"):
        with pytest.raises(BadInput, match="max_memory"):
            parse_bytes(bad)


def test_cli_score_with_max_memory_equals_normal(tmp_path, capsys):
    import vocablens.cli  # noqa: F401  (registers the commands)
    from vocablens.cli.common import run_app

    model = make_tiny("llama")
    model.save_pretrained(tmp_path, safe_serialization=True)
    _write_tokenizer(tmp_path, model.config.vocab_size)
    outs = []
    for extra in ([], ["--max-memory", "1kB"]):
        assert run_app(["score", "t3 t9 t4 t7", "--model", str(tmp_path), "--json", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["tokens"] == outs[1]["tokens"] and outs[0]["total_logprob"] == outs[1]["total_logprob"]
    # without --json the loading lines say how many blocks stream (nothing fits in 1 kB)
    assert run_app(["score", "t3 t9", "--model", str(tmp_path), "--max-memory", "1kB"]) == 0
    n = model.config.num_hidden_layers
    assert f"--max-memory 1kB: 0 of {n} blocks resident, {n} read from the checkpoint" in capsys.readouterr().err
    assert run_app(["score", "t3 t9", "--model", str(tmp_path), "--max-memory", "lots"]) == 2


def test_bad_max_memory_is_one_line_before_loading(capsys):
    """`score hi --max-memory abc` printed 'loading smollm2 ...' before its error: now one line."""
    from vocablens.cli.common import run_app

    for bad in ("abc", "0", "-5MB"):
        assert run_app(["score", "hi", "--max-memory", bad]) == 2
        e = capsys.readouterr().err
        assert e.count("\n") == 1 and e.startswith("error:") and "loading" not in e, e
