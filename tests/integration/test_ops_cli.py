"""`vocablens score` on the real default model (loaded once by the session fixture)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import vocablens.cli.ops as cli_ops
from vocablens.cli.common import run_app
from vocablens.errors import BadInput
from vocablens.generate.score import score_ids

TEXT = "The capital of France is Paris."


@pytest.fixture()
def use_smollm2(smollm2, monkeypatch):
    monkeypatch.setattr(cli_ops, "load_model", lambda *a, **k: smollm2)
    return smollm2


@pytest.mark.slow
def test_score_equals_model_log_softmax(smollm2):
    tok, borders = smollm2.tokenizer, smollm2.borders
    ids = tok(TEXT, return_tensors="pt").input_ids[0]
    res = score_ids(borders, ids, top_k=4)
    with torch.no_grad():
        logits = smollm2.model(input_ids=ids[None]).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    want = lp[:-1].gather(1, ids[1:, None]).squeeze(1)
    torch.testing.assert_close(res.logprobs, want, rtol=0, atol=2e-4)
    torch.testing.assert_close(res.topk_logprobs, lp[:-1].topk(4).values, rtol=0, atol=2e-4)
    assert torch.equal(res.topk_ids[:, 0], lp[:-1].argmax(-1))
    ent = -(lp.exp() * lp).sum(-1)[:-1]
    torch.testing.assert_close(res.entropy, ent, rtol=0, atol=2e-3)
    assert math.isclose(res.total_logprob, float(want.double().sum()), abs_tol=1e-3)
    with pytest.raises(BadInput, match="at least 2"):
        score_ids(borders, ids[:1])


@pytest.mark.slow
def test_score_cli_json(use_smollm2, capsys):
    assert run_app(["score", TEXT, "--top-k", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_tokens"] == 7 and d["n_scored"] == 6
    assert [t["token"] for t in d["tokens"]] == [" capital", " of", " France", " is", " Paris", "."]
    assert d["n_bytes"] == len(TEXT.encode()) - len("The")
    assert math.isclose(d["total_logprob"], sum(t["logprob"] for t in d["tokens"]), rel_tol=1e-6)
    assert math.isclose(d["logprob_per_byte"], d["total_logprob"] / d["n_bytes"], rel_tol=1e-9)
    assert math.isclose(d["bits_per_byte"], -d["logprob_per_byte"] / math.log(2), rel_tol=1e-9)
    assert all(len(t["top_k"]) == 2 for t in d["tokens"])
    paris = d["tokens"][4]
    assert paris["top_k"][0]["token"] == " Paris" and paris["logprob"] == paris["top_k"][0]["logprob"]
    assert d["model"]


@pytest.mark.slow
def test_score_cli_file_and_table(use_smollm2, capsys, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    assert run_app(["score", "--file", str(f), "--top-k", "0"]) == 0
    out = capsys.readouterr().out
    assert "' Paris'" in out and "bits/byte" in out


def test_score_cli_errors(capsys, tmp_path):
    assert run_app(["score"]) == 2
    assert "exactly one" in capsys.readouterr().err
    assert run_app(["score", "x", "--file", str(tmp_path / "a.txt")]) == 2
    assert run_app(["score", "--file", str(tmp_path / "missing.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert run_app(["score", "   "]) == 2
    assert "empty" in capsys.readouterr().err
    assert run_app(["score", "hi", "--top-k", "-1"]) == 2
