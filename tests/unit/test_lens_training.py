"""Training and evaluating a tuned lens through the handle (issue 37 §3): ``m.train_lens`` and
``m.eval_lens`` are the one place those workflows live, and ``vocablens lens train`` / ``lens eval``
are their thin clients, on a tiny random llama saved to disk.

Oracles: the commands' own ``--json`` and stdout, run in this process on the same model (their output
before the move is what ``--json`` printed then: the move kept it byte for byte, timings aside); a lens
trained twice with one seed is the same tensor; the evaluation's figure and frame hold the numbers of
its JSON; the lens held by the model and the same lens read back from its float32 file score alike."""

from __future__ import annotations

import io
import json

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.errors import BadInput, OutputExists
from vocablens.render.json import dumps

TRAIN = ["--seq-len", "16", "--tokens-per-step", "32", "--val-fraction", "0.2", "--max-tokens", "256", "--steps", "2"]
EVAL = ["--max-tokens", "48", "--seq-len", "16"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama, a corpus of 30 pydoc topics, and a lens trained on it (one step: not the identity)."""
    from pydoc_data.topics import topics

    import vocablens
    from vocablens.lens.train import TrainSettings

    root = tmp_path_factory.mktemp("lens-training")
    d = save_tiny(root / "a", tiny_tokenizer())
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(topics[k] for k in sorted(topics)[40:70]), encoding="utf-8")
    m = vocablens.load(str(d))
    m.train_lens(str(corpus), root / "lens", TrainSettings(steps=1, tokens_per_step=32, seq_len=16), max_tokens=256,
                 val_fraction=0.2)
    m.translators.pop("tuned")
    return {"dir": d, "corpus": corpus, "root": root, "m": m, "lens": root / "lens"}


@pytest.fixture
def m(tiny, monkeypatch):
    """The tiny model; the commands run on it (no second load), and leave its tuned lens as they found it."""
    import vocablens.cli.tuned

    monkeypatch.setattr(vocablens.cli.tuned, "load_model", lambda *a, **k: tiny["m"])
    yield tiny["m"]
    tiny["m"].translators.pop("tuned", None)


def _printed(d: dict) -> dict:
    """A dict as ``--json`` prints it (floats to their printed precision, NaN as null)."""
    return json.loads(dumps(d))


def _untimed(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("seconds", "tokens_per_s")}


def _shown(res) -> str:
    """``res.table()`` printed as the CLI's stdout console prints it (piped: its width)."""
    from rich.console import Console

    from vocablens.cli.console import PIPED_WIDTH

    buf = io.StringIO()
    Console(file=buf, width=PIPED_WIDTH, highlight=False, soft_wrap=False, emoji=False, markup=False,
            color_system=None).print(res.table())
    return buf.getvalue()


def test_train_lens_is_lens_train(m, tiny, capsys):
    """Every option of the command goes through ``m.train_lens``: the same lens tensors and the same
    ``--json`` (timings aside), a least-squares start included."""
    from vocablens.lens.train import TrainSettings
    from vocablens.lens.tuned import TunedLens

    root, corpus = tiny["root"], str(tiny["corpus"])
    code, out, err = run_cli(capsys, "lens", "train", "-m", tiny["dir"], "--corpus", corpus, "--out", root / "cli",
                             *TRAIN, "--init", "regression", "--init-tokens", "32", "--seed", "3", "--json")
    assert code == 0, err
    want = json.loads(out)
    res = m.train_lens(corpus, root / "api", TrainSettings(steps=2, tokens_per_step=32, seq_len=16, seed=3),
                       max_tokens=256, val_fraction=0.2, seed=3, init="regression", init_tokens=32, checkpoint_every=10)
    got = _printed(res.to_json())
    assert _untimed(got) == {**_untimed(want), "out": str(root / "api")}
    assert want["steps"] == 2 and want["tokens"] == 64 and len(want["final_layer_loss"]) == m.borders.n_layers
    a, b = TunedLens.load(root / "cli"), TunedLens.load(root / "api")
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert a.settings["init"] == b.settings["init"] == "regression" and a.settings["init_tokens"] == 32
    assert (root / "api" / "checkpoint" / "checkpoint.safetensors").is_file()
    assert m.translators["tuned"] is res.lens  # the model reads through the lens it trained
    steps = res.to_pandas()
    assert list(steps["step"]) == [1, 2] and steps["loss"].iloc[-1] == pytest.approx(want["final_loss"])
    assert " ".join(_shown(res).split()).startswith(f"saved the tuned lens to {root / 'api'} (64 tokens in ")


def test_eval_lens_is_lens_eval(m, tiny, capsys):
    """``m.eval_lens(...).to_json()`` is ``lens eval --json`` for the same call, ``.table()`` what it
    prints, for each split; the plot the command writes is named in both."""
    root, corpus, lens = tiny["root"], str(tiny["corpus"]), str(tiny["lens"])
    for split in ("validation", "all"):
        code, out, err = run_cli(capsys, "lens", "eval", "-m", tiny["dir"], "--lens", lens, "--corpus", corpus,
                                 "--split", split, *EVAL, "--json")
        assert code == 0, err
        want = json.loads(out)
        res = m.eval_lens(lens, corpus, split=split, max_tokens=48, seq_len=16)
        assert _printed(res.to_json()) == want
        assert want["data"]["split"] == split and want["lens"] == lens and want["plot"] is None
    code, out, err = run_cli(capsys, "lens", "eval", "-m", tiny["dir"], "--lens", lens, "--corpus", corpus,
                             "--split", split, *EVAL)
    assert code == 0 and out == _shown(res), err
    assert "a, 48 tokens of corpus.txt (all), lens" in out and "tuned KL below logit KL at" in out
    plot = root / "e.html"
    code, out, err = run_cli(capsys, "lens", "eval", "-m", tiny["dir"], "--lens", lens, "--corpus", corpus,
                             *EVAL, "--plot", plot, "--json")
    assert code == 0 and json.loads(out)["plot"] == str(plot) and plot.is_file(), err
    res = m.eval_lens(lens, corpus, max_tokens=48, seq_len=16, plot=plot, force=True)
    assert _printed(res.to_json()) == json.loads(out)
    with pytest.raises(OutputExists):
        m.eval_lens(lens, corpus, max_tokens=48, seq_len=16, plot=plot)


def test_eval_lens_without_a_lens_is_lens_eval_without_lens(m, tiny, capsys, monkeypatch):
    """No lens named: the lens shipped for the model (here the fixture's, shipped for the tiny model's
    directory), whether the model has read it already (``m.tuned_lens``) or not: the JSON of
    ``lens eval -m MODEL``, the lens named ``shipped for MODEL``."""
    import vocablens.lens.tuned as tuned

    spec, corpus = str(tiny["dir"]), str(tiny["corpus"])
    monkeypatch.setattr(tuned, "shipped_lens_path", lambda name="smollm2": tiny["lens"] if str(name) == spec else None)
    code, out, err = run_cli(capsys, "lens", "eval", "-m", spec, "--corpus", corpus, *EVAL, "--json")
    assert code == 0, err
    want = json.loads(out)
    assert want["lens"] == f"shipped for {spec}" and m.spec == spec
    assert _printed(m.eval_lens(corpus=corpus, max_tokens=48, seq_len=16).to_json()) == want
    assert m.tuned_lens is m.translators["tuned"]  # read and held now
    assert _printed(m.eval_lens(corpus=corpus, max_tokens=48, seq_len=16).to_json()) == want


def test_the_evaluation_figure_and_frame_hold_its_numbers(m, tiny):
    """``.figure()``: KL, cross-entropy (nats, or bits per byte) and top-1 agreement per layer, a trace
    per lens; ``.to_pandas()``: a row per (lens, layer), the JSON's numbers."""
    res = m.eval_lens(str(tiny["lens"]), str(tiny["corpus"]), max_tokens=48, seq_len=16)
    d, L = res.to_json(), m.borders.n_layers
    assert len(d["layers"]) == L + 1
    fig = res.figure()
    by_panel = {(t.name, t.xaxis): list(t.y) for t in fig.data}
    for kind in ("logit", "tuned"):
        col = [[ly[kind][f] for ly in d["layers"]] for f in ("kl", "ce", "top1_agreement")]
        assert [by_panel[(f"{kind} lens", ax)] for ax in ("x", "x2", "x3")] == col
    bpb = {t.name: list(t.y) for t in res.figure(unit="bpb").data if t.xaxis == "x2"}
    assert bpb["tuned lens"] == [ly["tuned"]["bpb"] for ly in d["layers"]]
    assert fig.layout.title.text == "a: logit vs tuned lens on corpus.txt (validation)"
    with pytest.raises(BadInput, match="unit"):
        res.figure(unit="bits")
    frame = res.to_pandas()
    assert len(frame) == 2 * (L + 1) and set(frame["kind"]) == {"logit", "tuned"}
    row = frame[(frame["kind"] == "tuned") & (frame["layer"] == 0)].iloc[0]
    assert row["kl"] == d["layers"][0]["tuned"]["kl"] and row["bpb"] == d["layers"][0]["tuned"]["bpb"]
    assert d["layers"][L]["tuned"]["kl"] == 0.0  # layer L is the model itself for both lenses


def test_the_lens_held_scores_as_its_file(m, tiny):
    """The lens the model holds (``eval_lens()`` without a lens; here: read with ``load_lens``, as one
    trained by ``train_lens`` is held) and the same lens read for one call from its float32 file score
    alike."""
    out = tiny["lens"]
    m.load_lens(out)
    held = m.eval_lens(corpus=str(tiny["corpus"]), max_tokens=48, seq_len=16).to_json()
    read = m.eval_lens(str(out), str(tiny["corpus"]), max_tokens=48, seq_len=16).to_json()
    assert held["lens"] == "loaded" and read["lens"] == str(out)
    assert {k: v for k, v in held.items() if k not in ("lens", "lenses")} == \
        {k: v for k, v in read.items() if k not in ("lens", "lenses")}
    assert held["layers"][0]["tuned"] != held["layers"][0]["logit"]  # a lens that translates


def test_bad_options_are_one_line_before_any_work(m, tiny):
    from vocablens.handle.lenses.training import check_train_options
    from vocablens.handle.lenses.evaluation import lens_eval_inputs

    with pytest.raises(BadInput, match="`split` must be validation, train or all"):
        m.eval_lens(split="bogus")
    with pytest.raises(BadInput, match="at least 2"):
        m.eval_lens(max_tokens=1)
    with pytest.raises(BadInput, match="no tuned lens"):
        lens_eval_inputs(str(tiny["dir"]), str(tiny["root"] / "missing"))
    with pytest.raises(BadInput, match="`init` must be zero or regression"):
        m.train_lens(str(tiny["corpus"]), init="bogus")
    with pytest.raises(BadInput, match="`resume`: no checkpoint"):
        check_train_options(tiny["root"] / "nothing-here", resume=True)
    with pytest.raises(OutputExists, match="not a directory"):
        check_train_options(tiny["corpus"])


def test_the_split_packing_lives_in_the_handle():
    """``--split all`` (every document packed, nothing held out) is packed in one place
    (``Model.eval_rows``, beside the held-out split), not in each command that scores a lens."""
    from pathlib import Path

    cli = Path(__file__).resolve().parents[2] / "src" / "vocablens" / "cli"
    assert [f"{p.name}:{i}" for p in cli.glob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if ".pack(" in line] == []
