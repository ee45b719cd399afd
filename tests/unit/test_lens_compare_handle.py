"""``lens eval --kind K1,K2,...``, ``lens backward`` and ``lens fit-jacobian`` as clients of
``vocablens.Model`` (issue 37 §3): ``m.compare_lenses``, ``m.backward_lens`` and ``m.fit_jacobian_lens``
hand back results whose ``.to_json()`` is the command's ``--json`` and whose ``.table()`` is what it
prints, on a tiny random llama saved to disk with a tuned and a Jacobian lens fitted here.

Oracles: the commands run in this process on the same directory (their stdout, their ``--json``,
the figure in the HTML file ``--plot`` writes, read back out of the page); the backward figure and
the frames are checked against the command's JSON; the refusals against the files on disk."""

from __future__ import annotations

import json
import math

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.render.json import dumps


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny llama, a corpus, and in one folder a tuned lens (random, not the identity) and a Jacobian
    lens fitted beside it."""
    import torch

    import vocablens
    from vocablens.cli.common import run_app
    from vocablens.lens.tuned import TunedLens

    root = tmp_path_factory.mktemp("compare")
    a = save_tiny(root / "a", tiny_tokenizer())
    corpus = root / "corpus.txt"
    corpus.write_text(("The value of x is a number. " * 40 + "\n") * 6)
    lens = TunedLens.for_model(vocablens.load(str(a)).borders, name="a")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        lens.weight.copy_(torch.randn(lens.weight.shape, generator=g) * 0.2)
        lens.bias.copy_(torch.randn(lens.bias.shape, generator=g) * 0.2)
    lens.save(root / "lens")
    assert run_app(["lens", "fit-jacobian", "--corpus", str(corpus), "--out", str(root / "lens"), "--seq-len", "8",
                    "--skip-first", "2", "--dim-batch", "16", "--max-tokens", "16", "-m", str(a), "--json"]) == 0
    return str(a), str(corpus), str(root / "lens")


@pytest.fixture
def m(dirs, monkeypatch):
    """The model, also the one the commands load (no second load)."""
    import vocablens
    import vocablens.cli.jacobian
    import vocablens.cli.lenses

    lm = vocablens.load(dirs[0])
    for mod in (vocablens.cli.lenses, vocablens.cli.jacobian):
        monkeypatch.setattr(mod, "load_model", lambda *_, **__: lm)
    return lm


def _printed(d: dict) -> dict:
    return json.loads(dumps(d))


def _cli(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return out


def _shown(capsys, res) -> str:
    """What the CLI's stdout console prints for ``res.table()``."""
    from vocablens.cli.console import out

    capsys.readouterr()
    out.print(res.table())
    return capsys.readouterr().out


def _page_figure(path) -> tuple[list, dict]:
    """The traces and layout of the plotly figure in an HTML page plotly wrote (``Plotly.newPlot``)."""
    text = path.read_text()
    at = text.index("Plotly.newPlot(")
    at = text.index(",", at) + 1  # past the div's id
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
    rest = text[end:].lstrip()[1:]
    layout, _ = dec.raw_decode(rest, len(rest) - len(rest.lstrip()))
    return data, layout


def test_compare_lenses_is_lens_eval_kind(m, dirs, capsys, tmp_path):
    a, corpus, lens = dirs
    plot = tmp_path / "cmp.html"
    argv = ["lens", "eval", "--kind", "logit,tuned,jacobian", "--corpus", corpus, "--lens", lens, "--split", "all",
            "--seq-len", "16", "--max-tokens", "32", "-m", a]
    want = json.loads(_cli(capsys, *argv, "--plot", plot, "--json"))
    res = m.compare_lenses(["logit", "tuned", "jacobian"], lenses=lens, corpus=corpus, split="all", max_tokens=32,
                           seq_len=16, plot=plot, force=True)
    assert _printed(res.to_json()) == want
    assert want["kinds"] == ["logit", "tuned", "jacobian"] and want["plot"] == str(plot) and want["tokens"] == 32
    assert [r["kind"] for r in want["lenses"]] == ["tuned", "jacobian"]
    # .figure() is the figure --plot wrote, read back out of the page
    data, layout = _page_figure(plot)
    fig = json.loads(res.figure().to_json())
    assert fig["data"] == data and fig["layout"]["title"] == layout["title"]
    assert layout["title"]["text"] == "a: logit, tuned, jacobian lenses on corpus.txt (all)"
    assert [t["name"] for t in data] == ["logit lens", "tuned lens", "jacobian lens"] * 3
    # .table() is what the command prints without --json
    assert _shown(capsys, res) == _cli(capsys, *argv, "--plot", tmp_path / "cmp2.html")
    # one row per (layer, lens), the JSON's numbers
    frame = res.to_pandas()
    assert len(frame) == 3 * (want["n_layers"] + 1)
    for row in frame.itertuples():
        got = want["layers"][row.layer][row.kind]
        for metric in ("kl", "ce", "top1_agreement"):
            assert getattr(row, metric) == pytest.approx(got[metric], rel=1e-12)


def test_compare_lenses_finds_the_corpus_the_lens_saw_and_reads_the_lenses_it_holds(m, dirs, capsys):
    """Without a corpus: the one the first fitted lens was fitted on (a file here: pydoc-topics then);
    without ``lenses``: the lenses this model holds (loaded with load_lens / load_jacobian_lens)."""
    a, corpus, lens = dirs
    m.load_lens(lens)
    m.load_jacobian_lens(lens)
    res = m.compare_lenses(["logit", "jacobian"], corpus=corpus, max_tokens=32, seq_len=16)
    want = json.loads(_cli(capsys, "lens", "eval", "--kind", "logit,jacobian", "--corpus", corpus, "--lens", lens,
                           "--seq-len", "16", "--max-tokens", "32", "-m", a, "--json"))
    assert _printed(res.to_json()) == want and want["data"]["split"] == "validation"


def test_backward_lens_is_lens_backward(m, dirs, capsys):
    a = dirs[0]
    argv = ["lens", "backward", "The value of x", "--target", " is", "-k", "3", "--position", "-2", "-m", a]
    want = json.loads(_cli(capsys, *argv, "--json"))
    res = m.backward_lens("The value of x", " is", position=-2, k=3)
    assert _printed(res.to_json()) == want and want["kind"] == "backward"
    assert _shown(capsys, res) == _cli(capsys, *argv)
    for by_id in (m.backward_lens("The value of x", f"id:{want['target_id']}", position=-2, k=3),  # id:N
                  m.backward_lens("The value of x", want["target_id"], position=-2, k=3)):  # an int
        assert _printed(by_id.to_json()) == want
    argv_id = ["lens", "backward", "The value of x", "--target-id", str(want["target_id"]), "-k", "3",
               "--position", "-2", "-m", a, "--json"]
    assert json.loads(_cli(capsys, *argv_id)) == want
    # the figure: a row per layer, a column per rank, the JSON's scores and tokens
    fig = res.figure()
    (heat,) = fig.data
    L1 = len(want["layers"])
    assert list(heat.y) == list(range(L1)) and len(heat.x) == 3
    for ly in want["layers"]:
        assert list(heat.text[ly["layer"]]) == ly["top_tokens"]
        assert [round(x, 6) for x in heat.z[ly["layer"]]] == pytest.approx(ly["top_scores"], abs=1e-6)
    frame = res.to_pandas()
    assert len(frame) == 3 * L1 and list(frame["token"][:3]) == want["layers"][0]["top_tokens"]
    assert all(math.isclose(g, want["layers"][ly]["grad_norm"], rel_tol=1e-6)
               for ly, g in zip(frame["layer"], frame["grad_norm"]))


def test_fit_jacobian_lens_is_lens_fit_jacobian(m, dirs, capsys, tmp_path):
    """The same lens and the same JSON (but the wall seconds); a refusal names the folder it looked in."""
    import torch
    from safetensors.torch import load_file

    from vocablens.errors import BadInput
    from vocablens.handle.lenses.training import check_fit_options

    a, corpus, _ = dirs
    fit = ["--corpus", corpus, "--seq-len", "8", "--skip-first", "2", "--dim-batch", "16", "--max-tokens", "16"]
    want = json.loads(_cli(capsys, "lens", "fit-jacobian", *fit, "--out", tmp_path / "cli", "-m", a, "--json"))
    from vocablens.lens.jacobian_fit import JacobianFitSettings

    res = m.fit_jacobian_lens(corpus, 16, 8, JacobianFitSettings(skip_first=2, dim_batch=16), out=tmp_path / "api",
                              checkpoint_every=1)
    got = _printed(res.to_json())
    assert {**got, "out": None, "seconds": None} == {**want, "out": None, "seconds": None}
    assert want["out"] == str(tmp_path / "cli") and want["stored_dtype"] == "float16" and want["n_prompts"] == 2
    cli_j, api_j = load_file(tmp_path / "cli" / "jacobian.safetensors"), load_file(tmp_path / "api" / "jacobian.safetensors")
    assert cli_j.keys() == api_j.keys() and all(torch.equal(cli_j[k], api_j[k]) for k in cli_j)
    assert _shown(capsys, res).startswith(f"saved the Jacobian lens to {tmp_path / 'api'} (2 prompts, 16 tokens, ")
    # --resume where no checkpoint was written names the folder it looked in (it named ``checkpoint``)
    with pytest.raises(BadInput, match="no checkpoint in .*jacobian-checkpoint"):
        check_fit_options(tmp_path / "none", resume=True, seq_len=8, skip_first=2, max_tokens=16)
    code, out, err = run_cli(capsys, "lens", "fit-jacobian", *fit, "--out", tmp_path / "none", "--resume", "-m", a)
    assert code == 2 and f"no checkpoint in {tmp_path / 'none' / 'jacobian-checkpoint'}" in err


def test_the_lens_eval_figures_share_one_builder():
    """``lens eval`` (logit vs tuned) and ``lens eval --kind`` draw the same three panels: for the same
    numbers, the two builders give the same figure."""
    from vocablens.lens.compare import LensComparison
    from vocablens.lens.evaluate import LensEval
    from vocablens.render.lens_compare import comparison_figure
    from vocablens.render.lens_eval import eval_figure

    import dataclasses

    kl = {"logit": [2.0, 1.0, 0.0], "tuned": [1.5, 0.5, 0.0]}
    ce = {"logit": [9.0, 8.0, 7.0], "tuned": [8.5, 7.5, 7.0]}
    top1 = {"logit": [0.1, 0.5, 1.0], "tuned": [0.2, 0.6, 1.0]}
    nan = [float("nan")] * 3
    fields = {f.name for f in dataclasses.fields(LensEval)}
    vals = {f"{k}_{m}": v[k] for k in ("logit", "tuned") for m, v in (("kl", kl), ("ce", ce), ("top1", top1))}
    ev = LensEval(**{f: vals.get(f, nan) for f in fields if f.startswith(("logit_", "tuned_"))},
                  **{f: 2 if f == "n_layers" else 6 for f in fields if not f.startswith(("logit_", "tuned_"))})
    cmp = LensComparison(2, ["logit", "tuned"], 6, 6, 0,
                         {k: {"kl": kl[k], "ce": ce[k], "top1_agreement": top1[k], "bpb": nan, "entropy": nan}
                          for k in ("logit", "tuned")})
    assert eval_figure(ev, "t").to_json() == comparison_figure(cmp, "t").to_json()
