"""The workflows that moved from the CLI and the explorer into ``vocablens.Model`` (issue 37 §3), on a
tiny random llama saved to disk: ``trajectory`` (the explorer's click), ``lens`` on a cached forward
and with a lens of fewer layers, and ``bottleneck`` / ``align`` / ``anomaly``, whose ``to_json()`` is
the command's ``--json`` for the same call.

Oracles: the trajectory is read on another path (one streamed pass over the head for chosen tokens,
:func:`vocablens.lens.trajectory.layer_readout`) than the lens (top-k and ranks per layer,
:func:`vocablens.lens.logit.lens_batches`), so its ranks, probabilities and top-1 must equal the lens's
``final_top1_rank`` / ``final_top1_prob`` / top token; the commands' JSON comes from the CLI run in
this process on the same directory."""

from __future__ import annotations

import json

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.render.json import dumps

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Two tiny llamas with one vocabulary, and a tuned lens (random, not the identity) for the first."""
    import vocablens
    from vocablens.lens.tuned import TunedLens

    root = tmp_path_factory.mktemp("clients")
    tok = tiny_tokenizer()
    a, b = save_tiny(root / "a", tok), save_tiny(root / "b", tok, seed=1)
    m = vocablens.load(str(a))
    lens = TunedLens.for_model(m.borders, name="a")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        lens.weight.copy_(torch.randn(lens.weight.shape, generator=g) * 0.2)
        lens.bias.copy_(torch.randn(lens.bias.shape, generator=g) * 0.2)
    lens.save(root / "lens")
    return a, b, root / "lens"


@pytest.fixture
def m(dirs):
    import vocablens

    lm = vocablens.load(str(dirs[0]))
    lm.load_lens(dirs[2])
    return lm


def _printed(d: dict) -> dict:
    return json.loads(dumps(d))


def _cli_json(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_trajectory_is_the_lens_read_another_way(m):
    lens = m.lens(PROMPT, kind="both", positions=[3], k=1)
    top1 = int(lens[0, "logit"].final_top1[0])
    t = m.trajectory(PROMPT, position=3, token=top1)
    d = t.to_json()
    assert d["position"] == 3 and d["token_id"] == top1 and d["n_layers"] == m.borders.n_layers
    assert d["tokens"] == m.tokens(m.encode(PROMPT)[0])
    for kind in ("logit", "tuned"):
        layers = lens[0, kind].layers
        assert d[kind]["rank"] == [int(ly.final_top1_rank[0]) for ly in layers]
        assert torch.allclose(torch.tensor(d[kind]["prob"]), torch.stack([ly.final_top1_prob[0] for ly in layers]),
                              rtol=1e-4, atol=1e-6)
        assert d[kind]["top1"] == [m.tokens([int(ly.top_ids[0, 0])])[0] for ly in layers]
    assert d["logit"]["rank"][-1] == 0 and d["logit"]["rank"] != d["tuned"]["rank"]  # the lens translates
    # the default token is the model's own top-1 there; logit only: "tuned" is null
    only = m.trajectory(PROMPT, position=3, kinds=("logit",)).to_json()
    assert only["token_id"] == top1 and only["tuned"] is None and only["logit"] == d["logit"]


def test_lens_reads_a_cached_forward_without_running_the_model(m):
    ids = m.encode(PROMPT)
    stream = m.forward(ids)
    calls = []
    h = m.borders.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        cached = m.lens(ids, kind="both", k=3, positions="all", stream=stream).to_json()
        t = m.trajectory(ids, position=-1, token=" the", stream=stream).to_json()
    finally:
        h.remove()
    assert calls == []
    assert cached == m.lens(ids, kind="both", k=3, positions="all").to_json()
    assert t == m.trajectory(ids, position=-1, token=" the").to_json()
    with pytest.raises(Exception, match="one prompt"):
        m.lens([PROMPT, "a dog"], stream=stream)


class _Partial:
    """A translator fitted on one layer only (a published Jacobian lens fits no matrix for layer 0)."""
    kind = "jacobian"

    def __init__(self, d: int) -> None:
        self.layers, self.d = [1], d  # of the tiny model's 2 blocks

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        assert layer in self.layers, layer
        return 0.5 * h.float()


def test_a_lens_of_fewer_layers_reads_its_own(m):
    L = m.borders.n_layers
    m.add_lens("jacobian", _Partial(m.borders.d_model))
    res = m.lens(PROMPT, kind="logit,jacobian", k=2)
    assert L == 2 and [ly.layer for ly in res[0, "jacobian"].layers] == [1, L]
    assert [ly.layer for ly in res[0, "logit"].layers] == list(range(L + 1))
    alone = m.lens(PROMPT, k=2).to_json()
    assert res.to_json()["logit"] == {k: v for k, v in alone.items() if k != "model"}


def test_bottleneck_align_anomaly_to_json_are_the_commands_json(m, dirs, capsys, tmp_path, monkeypatch):
    import vocablens
    import vocablens.cli.align
    import vocablens.cli.anomaly
    import vocablens.cli.argmax

    a, b, lens_dir = dirs
    other = vocablens.load(str(b))
    loaded = {str(a): m, str(b): other}  # the commands run on these models (no second load)
    for mod in (vocablens.cli.align, vocablens.cli.anomaly, vocablens.cli.argmax):
        monkeypatch.setattr(mod, "load_model", lambda spec, *_, **__: loaded[str(spec)])
    want = _cli_json(capsys, "bottleneck", "-m", a, "--contexts", "80", "--seq-len", "16")
    got = _printed(m.bottleneck(contexts=80, seq_len=16).to_json())
    assert got == want and want["corpus"] == "pydoc-topics"

    want = _cli_json(capsys, "align", a, b, "--top", "3")
    res = m.align(other, top=3)
    assert _printed(res.to_json()) == want and len(want["best_matches"]) == 3
    assert want["model_b"] == _printed({"p": other.provenance.to_dict()})["p"] != want["model_a"]

    normal = tmp_path / "normal.txt"
    normal.write_text("the cat sat\ndogs run fast\nhello world\nsome text here\nmore of it\nand one more\n")
    test = tmp_path / "test.jsonl"
    test.write_text('{"text": "the cat", "label": 0}\n{"text": "zz qq xx", "label": 1}\n'
                    '{"text": "hello there", "label": 0}\n')
    want = _cli_json(capsys, "lens", "anomaly", "--normal", normal, "--test", test, "-m", a, "--lens", lens_dir,
                     "--kind", "tuned", "--detector", "iforest")
    got = _printed(m.anomaly(normal, test, kind="tuned", detector="iforest").to_json())
    assert got == want and want["kinds"] == ["tuned"] and want["auroc"] is not None
    # texts given as lists: the same scores
    lists = m.anomaly(normal.read_text().splitlines(), ["the cat", "zz qq xx", "hello there"], labels=[0, 1, 0],
                      kind="tuned", detector="iforest")
    assert _printed(lists.to_json()) == want
