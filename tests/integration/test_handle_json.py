"""``vocablens.Model``'s results print the CLI's ``--json`` for the same call (issue 37): lens (one
prompt and a batch), score, neighbors and anatomy, each compared with the command run in-process on the
same loaded model (the ``cli`` fixture). Floats are compared to the precision the JSON prints them at
(the text that ``--json`` writes, parsed back), so an equal result is equal to the last printed digit."""

from __future__ import annotations

import json

import pytest

from vocablens.render.json import dumps


def _printed(d: dict) -> dict:
    """``d`` as ``--json`` prints it, parsed back (NaN -> null, floats at their printed precision)."""
    return json.loads(dumps(d))


def _cli_json(cli, *args) -> dict:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_lens_to_json_is_lens_json(cli, smollm2):
    want = _cli_json(cli, "lens", "The capital of France is", "-k", "3", "--positions", "all")
    got = _printed(smollm2.lens("The capital of France is", k=3, positions="all").to_json())
    assert got == want
    assert want["final_top1"][-1] == " Paris"  # a real reading, not two empty dicts


def test_lens_of_a_batch_is_lens_file_json(cli, smollm2, tmp_path):
    prompts = ["The capital of France is", "2 + 2 =", "The opposite of hot is"]
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    want = _cli_json(cli, "lens", "--file", f, "--kind", "both", "--layers", "0,10,20,30")
    res = smollm2.lens(prompts, kind="both", layers=[0, 10, 20, 30])
    assert _printed(res.to_json()) == want
    assert res.prompts == prompts and res.kinds == ["logit", "tuned"] and len(want["prompts"]) == 3


def test_score_to_json_is_score_json(cli, smollm2):
    text = "The quick brown fox jumps over the lazy dog."
    want = _cli_json(cli, "score", text, "--top-k", "2")
    got = _printed(smollm2.score(text, top_k=2).to_json())
    assert got == want
    # no BOS in this tokenizer: the first token ("The") has no prefix and is not scored, nor its 3 bytes
    assert want["n_bytes"] == len(text.encode()) - 3 and want["n_scored"] == want["n_tokens"] - 1


def test_neighbors_to_json_is_neighbors_json(cli, smollm2):
    want = _cli_json(cli, "neighbors", " king", " Paris", "-k", "5")
    got = _printed(smollm2.neighbors([" king", " Paris"], k=5).to_json())
    assert got == want
    assert [q["query"] for q in want["queries"]] == [" king", " Paris"] and len(want["queries"][0]["input"]) == 5


def test_anatomy_to_json_is_anatomy_load_json(cli, smollm2):
    want = _cli_json(cli, "anatomy", "--load")
    got = _printed(smollm2.anatomy().to_json())
    assert got == want
    assert want["models"][0]["vocab_size"] == 49152 and want["models"][0]["params_embedding"] == 49152 * 576


def test_the_tuned_lens_loads_by_model_name(smollm2):
    import vocablens

    lens = vocablens.TunedLens.load("smollm2", smollm2.borders)
    assert lens.n_layers == smollm2.borders.n_layers == 30
    res = smollm2.lens("The capital of France is", kind="tuned", layers=[25])
    top = smollm2.tokens(res[0, "tuned"].layers[0].top_ids[0, :1])
    assert res.kinds == ["tuned"] and top == [" Paris"]  # the tuned lens, not the logit lens relabelled


@pytest.mark.parametrize("kind", ["logit", "both"])
def test_lens_results_show_themselves(smollm2, kind):
    res = smollm2.lens(["The capital of France is", "2 + 2 ="], kind=kind)
    html = res._repr_html_()
    assert "final top-1 &#x27; Paris&#x27;" in html or "final top-1 ' Paris'" in html
    fig = res.figure()
    assert len(fig.data) == len(res.kinds) and len(fig.data[0].x) == 2  # one column per prompt (last position)
    assert fig.data[0].y[-1] == 30


def test_the_cli_fixture_reuses_the_session_model(cli, smollm2, monkeypatch):
    """The comparisons above are between one loaded model's two surfaces: the in-process CLI must not load
    the model again (the fixture once patched a function the CLI no longer called, and every command
    loaded afresh), and the session's model is the one every later load reads (the float32 cache), so a
    cold cache (a fresh CI machine) gives the same provenance on both sides."""
    import os

    from vocablens.models.files import loader

    calls = []
    real = loader.load
    monkeypatch.setattr(loader, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    code, out, err = cli("score", "The capital of France is", "--json")
    assert code == 0 and calls == [], err
    if os.environ.get("VOCABLENS_CACHE", "").lower() != "off":
        assert smollm2.provenance.loaded_from  # read from the cache, as the CLI's and the explorer's loads are
