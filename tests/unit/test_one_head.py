"""One head for every path: a config that ties, a checkpoint that stores another head.

The oracle is transformers' own model (``from_pretrained``): the head it uses
(``get_output_embeddings().weight``), whether it ties it (the head *is* the embedding), and its
logits. Three checkpoints of one tiny llama whose config says ``tie_word_embeddings: true``:
``diff`` stores an ``lm_head.weight`` with other values (transformers unties it), ``copy`` stores
one equal to the embedding bit for bit (transformers ties it), ``none`` stores no head (tied).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

CASES = ("diff", "copy", "none")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("one_head")
    base = save_tiny(root / "none", tiny_tokenizer(), family="llama_tied")
    sd = load_file(base / "model.safetensors")
    assert "lm_head.weight" not in sd and json.loads((base / "config.json").read_text())["tie_word_embeddings"]
    out = {"none": base}
    for case in ("diff", "copy"):
        d = root / case
        shutil.copytree(base, d)
        g = torch.Generator().manual_seed(7)
        E = sd["model.embed_tokens.weight"]
        head = torch.randn(E.shape, generator=g) * 20.0 if case == "diff" else E.clone()
        save_file({**sd, "lm_head.weight": head}, str(d / "model.safetensors"), metadata={"format": "pt"})
        out[case] = d
    return out


@pytest.fixture(scope="module")
def oracle(dirs):
    """case -> (transformers model, its head [V, d], tied by transformers)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    res = {}
    for case, d in dirs.items():
        m = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        head = m.get_output_embeddings().weight
        res[case] = (m, head.detach(), head is m.get_input_embeddings().weight)
    return res


def test_the_oracle_unties_only_the_different_head(oracle):
    assert [oracle[c][2] for c in CASES] == [False, True, True]


def _loaders():
    from vocablens.models import load
    from vocablens.models.files.partial import load_borders_only
    from vocablens.models.files.partial import load_head_only, load_matrices_only
    from vocablens.models.files.streaming import load_streaming

    return {"full": load, "borders_only": load_borders_only, "head_only": load_head_only,
            "matrices_only": load_matrices_only, "streaming": lambda s: load_streaming(s, max_memory="1kB")}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("loader", ["full", "borders_only", "head_only", "matrices_only", "streaming"])
def test_every_loader_reads_the_head_transformers_uses(dirs, oracle, case, loader):
    b = _loaders()[loader](str(dirs[case])).borders
    _, head, tied = oracle[case]
    assert torch.equal(b.unembedding.weight, head)
    assert b.tied is tied
    assert (b.unembedding.weight is b.W_E) is tied  # one matrix exactly when transformers keeps one


@pytest.mark.parametrize("case", ["diff", "copy"])
def test_unembed_gives_transformers_logits_at_every_position(dirs, oracle, case):
    from vocablens.models.files.streaming import load_streaming

    model, _, _ = oracle[case]
    ids = torch.tensor([[0, 5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0].double()
    for lm in (_loaders()["full"](str(dirs[case])), load_streaming(str(dirs[case]), max_memory="1kB")):
        resid, _ = lm.borders.residual_stream(ids)
        got = lm.borders.unembedding(resid[lm.borders.n_layers][0]).double()
        assert (got - ref).abs().max() < 1e-4 * max(1.0, float(ref.abs().max()))


def test_score_uses_the_stored_head(dirs, oracle, capsys):
    model, _, _ = oracle["diff"]
    code, out, err = run_cli(capsys, "score", "the model reads its head", "-m", dirs["diff"], "--json")
    assert code == 0, err
    res = json.loads(out)
    ids = torch.tensor([[res["first_token"]["id"]] + [t["id"] for t in res["tokens"]]])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    want = lp[:-1].gather(1, ids[0, 1:, None])[:, 0]
    got = torch.tensor([t["logprob"] for t in res["tokens"]], dtype=torch.float64)
    assert (got - want).abs().max() < 1e-3


@pytest.mark.parametrize("case", CASES)
def test_anatomy_and_neighbors_report_what_transformers_ties(dirs, oracle, case, capsys):
    tied = oracle[case][2]
    for argv in (["anatomy", dirs[case], "--json"], ["anatomy", dirs[case], "--load", "--json"],
                 ["neighbors", "model", "-m", dirs[case], "--json"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, (argv, err)
        d = json.loads(out)
        d = d["models"][0] if argv[0] == "anatomy" else d   # anatomy: {"models": [...]} for one model too
        assert d["tied"] is tied, argv
    if not tied:  # the untied head counts V x d parameters of its own, as transformers' model has
        code, out, _ = run_cli(capsys, "anatomy", dirs[case], "--json")
        model = oracle[case][0]
        assert json.loads(out)["models"][0]["params_total"] == sum(p.numel() for p in model.parameters())


def test_tie_check_says_the_config_disagrees(dirs, oracle):
    from vocablens.models.files.partial import load_head_only
    from vocablens.geometry.tying import tie_check

    _, head, _ = oracle["diff"]
    b = load_head_only(str(dirs["diff"])).borders
    t = tie_check(b)
    assert (t.tied, t.config_says_tied, t.consistent) == (False, True, False)
    E = oracle["diff"][0].get_input_embeddings().weight.detach()
    assert t.max_abs_diff == pytest.approx(float((head - E).abs().max()), rel=1e-6)
