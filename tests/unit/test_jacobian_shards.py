"""A Jacobian-lens fit split into shards and merged (``lens fit-jacobian --shard I/N``, ``lens merge``) equals
the one-process fit on all the prompts; shards of different fits are refused in one line; the fitted lens
carries its held-out quality (KL to the final distribution and top-1 agreement, beside the logit lens),
checked against a float64 reference computed here from the model's own norm and head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

#: merged vs one-process fit, float32 shards: the same sums in another order, then one float64 division
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("shards")
    tok = tiny_tokenizer()
    model_a = save_tiny(root / "tiny-a", tok, seed=0)
    model_b = save_tiny(root / "tiny-b", tok, seed=1)
    corpus = root / "corpus"
    corpus.mkdir()
    for k in sorted(topics)[30:70]:  # 40 documents: a validation split of about 4
        (corpus / f"{k}.txt").write_text(topics[k][:1500])
    return root, model_a, model_b, corpus


def _fit(capsys, model: Path, corpus: Path, out: Path, *extra: str) -> dict:
    code, o, e = run_cli(capsys, "lens", "fit-jacobian", "-m", model, "--corpus", corpus, "--out", out,
                         "--seq-len", "12", "--max-tokens", "48", "--skip-first", "2", "--dim-batch", "64",
                         "--quality-tokens", "64", "--json", *extra)
    assert code == 0, e
    return json.loads(o)


def _lens(path: Path):
    from vocablens.lens.jacobian import JacobianLens

    return JacobianLens.load(path)


def test_two_shards_merge_to_the_one_process_fit(setup, capsys):
    root, model_a, model_b, corpus = setup
    _fit(capsys, model_a, corpus, root / "whole", "--save-dtype", "float32")
    _fit(capsys, model_a, corpus, root / "s1", "--shard", "1/2")
    _fit(capsys, model_a, corpus, root / "s2", "--shard", "2/2")
    s1, s2, whole = _lens(root / "s1"), _lens(root / "s2"), _lens(root / "whole")
    assert s1.settings["shard"] == {"index": 1, "count": 2, "range": [0, 2]}
    assert s2.settings["shard"] == {"index": 2, "count": 2, "range": [2, 4]}
    assert s1.settings["stored_dtype"] == "float32"  # a shard is stored exactly by default
    assert s1.settings["data"]["manifest_sha256"] == whole.settings["data"]["manifest_sha256"]
    assert s1.settings["data"]["prompts_sha256"] != s2.settings["data"]["prompts_sha256"]
    code, o, e = run_cli(capsys, "lens", "merge", root / "s1", root / "s2", "--out", root / "merged",
                         "--save-dtype", "float32", "--json")
    assert code == 0, e
    rec = json.loads(o)
    assert rec["n_prompts"] == 4 and [s["index"] for s in rec["shards"]] == [1, 2]
    merged = _lens(root / "merged")
    assert merged.settings["n_prompts"] == whole.settings["n_prompts"] == 4
    # without --json: nothing on stdout, the one line on stderr (the merge ends through show, its line
    # the lens_merge renderer's)
    code, o, e = run_cli(capsys, "lens", "merge", root / "s1", root / "s2", "--out", root / "merged-text")
    assert code == 0 and o == "" and e.strip() == f"merged 2 shards (4 prompts) into {root / 'merged-text'}", e
    assert merged.layers == whole.layers
    scale = whole.J.abs().max()
    assert (merged.J - whole.J).abs().max() <= REL_TOL * scale
    # and the merge is the prompt-weighted mean, not a plain mean of something else
    assert torch.allclose(merged.J, (s1.J + s2.J) / 2, rtol=0, atol=1e-6 * float(scale))
    # refused in one line: a shard of another model, the same shard twice, a lens without shards' records
    _fit(capsys, model_b, corpus, root / "other", "--shard", "2/2")
    code, o, e = run_cli(capsys, "lens", "merge", root / "s1", root / "other", "--out", root / "bad")
    assert code == 2 and len(e.strip().splitlines()) == 1
    assert "shard 2 differs from shard 1 in model (unembedding hash)" in e
    code, o, e = run_cli(capsys, "lens", "merge", root / "s1", root / "s1", "--out", root / "bad")
    assert code == 2 and "are the same shard" in e and len(e.strip().splitlines()) == 1
    _fit(capsys, model_a, corpus, root / "s2skip", "--shard", "2/2", "--skip-first", "3")
    code, o, e = run_cli(capsys, "lens", "merge", root / "s1", root / "s2skip", "--out", root / "bad")
    assert code == 2 and "differs from shard 1 in skip_first: 3 vs 2" in e
    assert not (root / "bad").exists()


def test_fitted_lens_carries_its_held_out_quality(setup, capsys):
    """The stored figures equal KL(final ‖ lens) and top-1 agreement computed here in float64 from the
    model's own final norm and head on the same held-out rows, and every read shows them."""
    import vocablens
    from transformers import AutoModelForCausalLM

    root, model_a, _, corpus = setup
    out = root / "q"
    _fit(capsys, model_a, corpus, out)
    lens = _lens(out)
    q = lens.settings["quality"]
    assert q["split"] == "validation" and q["corpus"] == "corpus" and q["tokens"] == 64
    m = vocablens.load(str(model_a))
    rows, _ = m.eval_rows(str(corpus), "validation", 64, 64, 0.1, 0)
    hf = AutoModelForCausalLM.from_pretrained(model_a).double().eval()
    L = m.borders.n_layers
    J = lens.J.double()
    with torch.no_grad():
        o = hf(rows, output_hidden_states=True)  # hidden_states[l] = stream layer l for l < L
        final = torch.log_softmax(o.logits[0], -1)
        for layer in range(L):
            h = o.hidden_states[layer][0]
            for mine, key in ((h @ J[layer].T, "kl"), (h, "logit_kl")):
                lp = torch.log_softmax(hf.lm_head(hf.model.norm(mine)), -1)
                kl = (final.exp() * (final - lp)).sum(-1).mean()
                top = (lp.argmax(-1) == final.argmax(-1)).double().mean()
                assert q[key][layer] == pytest.approx(float(kl), rel=1e-3, abs=1e-4)
                assert q[key.replace("kl", "top1")][layer] == pytest.approx(float(top), abs=1e-5)  # stored to 5 decimals
    assert q["kl"][L] == 0.0 and q["top1"][L] == 1.0
    # every read shows it: the CLI footer and table column, --json under "lenses"
    code, o, e = run_cli(capsys, "lens", "the class", "-m", model_a, "--kind", "jacobian", "--lens", out)
    assert code == 0 and "held-out KL / top-1" in o and "jacobian lens quality on held-out corpus" in o
    assert f"mean KL {q['mean_kl']:.2f} nats" in e  # the caption
    code, o, e = run_cli(capsys, "lens", "the class", "-m", model_a, "--kind", "jacobian", "--lens", out, "--json")
    assert json.loads(o)["lenses"][0]["quality"] == q
