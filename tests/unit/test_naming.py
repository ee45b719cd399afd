"""One naming (issue 23, item 5): a *layer* is a residual-stream layer 0..L, a *block* a transformer
block 0..L-1 (block i reads layer i and writes layer i+1), in every table and ``--json``.

Failed before: ``explain`` called block 24 "layer 24" (JSON ``layers[].layer``, tables, the explorer's
"L24 head 4"), ``project`` called the same neuron "block 24" in its table and ``layer`` in its JSON,
and ``steer`` printed "layer (block) 22 (21)" for one neuron.
"""

from __future__ import annotations

import json

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

PROMPT = "The value of x is a number"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("naming") / "m", tiny_tokenizer()))


def _json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_explain_and_project_name_a_neuron_by_the_same_block(tiny, capsys):
    """An FFN sub-update that explain lists as (block b, neuron n) is the value vector project reads
    at --block b --neuron n: the tokens it promotes are the same (the sub-update is activation x that
    vector, read through the same head; a positive activation keeps the order, a negative one reverses
    it). The next block's neuron n promotes other tokens, so an off-by-one would show."""
    ex = _json(capsys, "explain", PROMPT, "-k", "5", "--subs", "3", "-m", tiny)
    L = len(ex["blocks"])
    assert [b["block"] for b in ex["blocks"]] == list(range(L)) and "layers" not in ex
    subs = [s for b in ex["blocks"] for s in b["sub_updates"]]
    assert all(s["block"] == b["block"] for b in ex["blocks"] for s in b["sub_updates"])
    checked = 0
    for s in sorted(subs, key=lambda s: -abs(s["activation"]))[:2]:  # the two clearest
        pj = _json(capsys, "project", "--block", s["block"], "--neuron", s["neuron"], "-k", "5", "-m", tiny)
        (v,) = pj["vectors"]
        assert (v["block"], v["neuron"]) == (s["block"], s["neuron"]) and "layer" not in v
        assert s["top_tokens"] == (v["top_tokens"] if s["activation"] > 0 else v["bottom_tokens"]), s
        other = _json(capsys, "project", "--block", (s["block"] + 1) % L, "--neuron", s["neuron"], "-k", "5", "-m", tiny)
        assert other["vectors"][0]["top_tokens"] != v["top_tokens"]
        checked += 1
    assert checked == 2


def test_lens_counts_layers_and_explain_counts_blocks(tiny, capsys):
    """lens reads layers 0..L (L+1 entries, the last one L = n_layers); explain reports blocks 0..L-1."""
    lens = _json(capsys, "lens", PROMPT, "-m", tiny)
    ex = _json(capsys, "explain", PROMPT, "-m", tiny)
    L = lens["n_layers"]
    assert [ly["layer"] for ly in lens["layers"]] == list(range(L + 1))
    assert [b["block"] for b in ex["blocks"]] == list(range(L))


def test_tables_say_block(tiny, capsys, monkeypatch):
    """explain's tables and steer's vector table head their block column "block"; steer's JSON names
    each vector by its block only."""
    monkeypatch.setenv("COLUMNS", "200")        # wide enough for the header on one line, whatever the
    #                                             environment says (pytest-xdist's workers set 80)
    code, out, err = run_cli(capsys, "explain", PROMPT, "-m", tiny)
    assert code == 0, err
    header = next(line for line in out.splitlines() if "Δlogp top-1 attn" in line)
    assert header.split("┃")[1].strip() == "block"
    code, out, err = run_cli(capsys, "steer", "--promote", " the", "--top-n", "2", "--new-tokens", "0",
                             "--prompt", PROMPT, "-m", tiny)
    assert code == 0, err
    assert "layer (block)" not in out
    header = next(line for line in out.splitlines() if "neuron" in line and "role" in line)
    assert [c.strip() for c in header.split("┃")[1:4]] == ["role", "block", "neuron"]
    st = _json(capsys, "steer", "--promote", " the", "--top-n", "2", "--new-tokens", "0", "--prompt", PROMPT, "-m", tiny)
    assert all(set(v) == {"role", "block", "neuron", "z", "factor", "top_tokens"} for v in st["vectors"])
    assert all(0 <= v["block"] < 2 for v in st["vectors"])


def test_python_results_name_blocks_blocks():
    """The Python API too: a result field that holds block indices is ``block``/``blocks``, never
    ``layer``/``layers`` (those hold stream layers 0..L only, as in the lens and ``settle``)."""
    import dataclasses
    import importlib

    stream_layer_fields = {("vocablens.lens.logit", "LensLayer", "layer"), ("vocablens.lens.logit", "LensResult", "layers")}
    checked = 0
    for mod in ("vocablens.vocab_space.vectors", "vocablens.vocab_space.search", "vocablens.vocab_space.circuits",
                "vocablens.vocab_space.explain", "vocablens.vocab_space.interpretable", "vocablens.vocab_space.align",
                "vocablens.lens.logit"):
        m = importlib.import_module(mod)
        for name, obj in vars(m).items():
            if dataclasses.is_dataclass(obj) and obj.__module__ == mod:
                for f in dataclasses.fields(obj):
                    checked += 1
                    if "layer" in f.name and f.name != "n_layers":  # n_layers: L, the config's count
                        assert (mod, name, f.name) in stream_layer_fields, f"{mod}.{name}.{f.name} holds blocks"
    assert checked > 40
    from vocablens.vocab_space import Explanation, HeadCircuit, TokenSearch, VectorProjection

    assert {"blocks"} <= {f.name for f in dataclasses.fields(VectorProjection)}
    assert "blocks" in {f.name for f in dataclasses.fields(Explanation)} and "block" in {f.name for f in dataclasses.fields(HeadCircuit)}
    assert {"promote_blocks", "suppress_blocks"} <= {f.name for f in dataclasses.fields(TokenSearch)}
