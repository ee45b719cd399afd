"""The batched lens: per prompt, the results of the single-prompt lens (issue 28, item 3).

Oracle: each prompt's own forward (``logit_lens`` on that prompt alone, i.e. no padding, no other
prompt in the batch) and, for the stream itself, the model run on the prompt alone; the batch pads
right (or takes a left-padded tensor with its mask), so a broken mask or a position read from the
wrong row shows as a different distribution.
"""

import pytest
import torch

from tiny_models import FAMILIES, make_tiny
from vocablens.errors import BadInput
from vocablens.lens import logit_lens
from vocablens.lens.logit import logit_lens_batch
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders


def _prompts(V, lengths=(7, 3, 5, 1), seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def _same(a, b, atol=1e-5, rtol=0.0):
    assert torch.equal(a.positions, b.positions) and torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.final_top1, b.final_top1)
    assert [x.layer for x in a.layers] == [x.layer for x in b.layers]
    for x, y in zip(a.layers, b.layers):
        assert torch.equal(x.top_ids, y.top_ids), x.layer
        assert torch.equal(x.final_top1_rank, y.final_top1_rank), x.layer
        for f in ("top_probs", "entropy", "kl_to_final", "final_top1_prob"):
            torch.testing.assert_close(getattr(x, f), getattr(y, f), rtol=rtol, atol=atol)
    assert (a.model_max_abs_diff != a.model_max_abs_diff and b.model_max_abs_diff != b.model_max_abs_diff) or \
        abs(a.model_max_abs_diff - b.model_max_abs_diff) <= 1e-5


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gpt_neox", "phi"])
@pytest.mark.parametrize("positions", ["last", "all", [0, -1]])
def test_batch_equals_each_prompt_alone(family, positions):
    assert family in FAMILIES, f"{family} is not among the tiny families any more"
    b = Borders.from_model(make_tiny(family))
    prompts = _prompts(b.vocab_size)
    got = logit_lens(b, prompts, positions=positions, k=3)
    assert isinstance(got, list) and len(got) == len(prompts)
    for x, r in zip(prompts, got):
        _same(r, logit_lens(b, x, positions=positions, k=3))


def test_one_gemm_pass_per_layer_for_the_whole_batch(monkeypatch):
    """All prompts' positions go through one kl_readout (plus the one layer-L check)."""
    import vocablens.ops as ops

    b = Borders.from_model(make_tiny("llama"))
    calls = []
    real = ops.kl_readout
    monkeypatch.setattr(ops, "kl_readout", lambda X, *a, **kw: calls.append(tuple(X.shape)) or real(X, *a, **kw))
    prompts = _prompts(b.vocab_size)
    logit_lens(b, prompts, positions="all", k=2)
    N = sum(int(x.numel()) for x in prompts)
    assert (b.n_layers, N, b.d_emb) in calls and len(calls) == 2  # the lens and the layer-L check


def test_left_padded_tensor_with_mask_and_per_prompt_positions():
    b = Borders.from_model(make_tiny("llama"))
    prompts = _prompts(b.vocab_size, (6, 2, 4))
    T = 6
    ids = torch.full((3, T), 5, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, x in enumerate(prompts):
        ids[i, T - len(x):] = x
        mask[i, T - len(x):] = 1
    specs = ["all", [0], "last"]
    got = logit_lens(b, ids, positions=specs, k=4, attention_mask=mask)
    for x, spec, r in zip(prompts, specs, got):
        _same(r, logit_lens(b, x, positions=spec, k=4))


def test_the_stream_of_a_padded_prompt_is_its_own():
    """Independent of the lens: the layer-L row the batch reads is the model's own, prompt alone."""
    model = make_tiny("llama")
    b = Borders.from_model(model)
    prompts = _prompts(b.vocab_size, (2, 6))
    got = logit_lens(b, prompts, positions="all", k=1)
    for x, r in zip(prompts, got):
        with torch.no_grad():
            p = torch.softmax(model(x[None]).logits[0].double(), -1)
        assert torch.equal(r.layers[-1].top_ids[:, 0], p.argmax(-1))
        torch.testing.assert_close(r.layers[-1].top_probs[:, 0].double(), p.max(-1).values, rtol=0, atol=1e-6)


def test_tuned_lens_batch_equals_single():
    b = Borders.from_model(make_tiny("llama"))
    tl = TunedLens.for_model(b)
    with torch.no_grad():
        tl.weight.normal_(0, 0.05)
        tl.bias.normal_(0, 0.05)
    prompts = _prompts(b.vocab_size)
    got = logit_lens(b, prompts, positions="all", k=2, translator=tl)
    for x, r in zip(prompts, got):
        assert r.kind == "tuned"
        _same(r, logit_lens(b, x, positions="all", k=2, translator=tl))
    assert not torch.allclose(got[0].layers[0].entropy, logit_lens(b, prompts[0], positions="all", k=2).layers[0].entropy)


def test_small_batch_token_budget_splits_forwards_with_the_same_results():
    b = Borders.from_model(make_tiny("llama"))
    prompts = _prompts(b.vocab_size)
    whole = logit_lens_batch(b, prompts, positions="all", k=2)
    split = logit_lens_batch(b, prompts, positions="all", k=2, batch_tokens=1)
    for x, y in zip(whole, split):
        _same(x, y)


def test_bad_batches():
    b = Borders.from_model(make_tiny("llama"))
    x = _prompts(b.vocab_size)
    with pytest.raises(BadInput, match="prompt 2 is empty"):
        logit_lens(b, [x[0], torch.zeros(0, dtype=torch.long)])
    with pytest.raises(BadInput, match="no prompts"):
        logit_lens(b, [])
    with pytest.raises(BadInput, match="2 position lists for 4 prompts"):
        logit_lens(b, x, positions=[[0], "last"])
    with pytest.raises(BadInput, match="outside the prompt"):
        logit_lens(b, x, positions=[5])  # prompt 2 has 3 tokens
    with pytest.raises(BadInput, match="attention_mask has shape"):
        logit_lens(b, torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4))


@pytest.mark.slow
def test_default_model_batch_equals_single(smollm2):
    from vocablens.models.tokens import encode_prompt

    _, tok, b, _ = smollm2
    texts = ["The capital of France is", "One, two, three, four,", "Hi"]
    prompts = [encode_prompt(tok, t) for t in texts]
    got = logit_lens(b, prompts, positions="all", k=5)
    for x, r in zip(prompts, got):
        # float32 forwards of another shape (padding, batch): KL ~ 28 nats at layer 0 moves by 7e-5
        _same(r, logit_lens(b, x, positions="all", k=5), atol=2e-5, rtol=1e-5)


def test_cli_file_gives_each_prompt_its_own_json(tmp_path, capsys):
    """``lens --file F --json``: one entry per line, each the JSON of ``lens LINE --json`` (no "model")."""
    import json

    from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

    m = str(save_tiny(tmp_path / "m", tiny_tokenizer()))
    lines = ["The value of x is a number", " the", "a b"]
    (tmp_path / "p.txt").write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    code, out, err = run_cli(capsys, "lens", "--file", str(tmp_path / "p.txt"), "--positions", "all", "-m", m, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert set(got) == {"prompts", "model"} and len(got["prompts"]) == 3
    for line, entry in zip(lines, got["prompts"]):
        code, out, err = run_cli(capsys, "lens", line, "--positions", "all", "-m", m, "--json")
        alone = json.loads(out)
        alone.pop("model")
        assert entry["tokens"] == alone["tokens"] and entry["final_top1"] == alone["final_top1"]
        for a, b in zip(entry["layers"], alone["layers"]):
            for x, y in zip(a["positions"], b["positions"]):
                assert x["top_ids"] == y["top_ids"] and abs(x["kl_to_final"] - y["kl_to_final"]) <= 1e-5
