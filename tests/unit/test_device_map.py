"""One model over several devices (issue 49 A): ``--device-map`` / ``vocablens.load(device_map=...)``.

On this CPU-only machine the devices are ``cpu`` and ``disk`` (accelerate's disk offload: a block's
weights stay on ``meta`` and are read from the checkpoint at each of its forwards). Oracle: the same
tiny checkpoint loaded whole on one device; every analysis gives the same figures there and placed
(``TOL``: float32, the same kernels in the same order, so the figures agree to rounding at most).
The placement itself is checked against what was asked (``hf_device_map``, which tensors are real),
and :func:`vocablens.models.files.placement.pinned` against the rule (embedding where block 0 runs, head
where the last block runs) on maps naming GPUs this machine does not have (no device is touched)."""

from __future__ import annotations

import json

import pytest
import torch

import vocablens
from vocablens.errors import BadInput

#: |placed - whole| allowed on every figure (float32; in practice the figures are equal bit for bit)
TOL = 1e-5
#: block 1 on disk, the rest in CPU memory (a tiny llama has 2 blocks)
DISK_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
            "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny_dirs import save_tiny, tiny_tokenizer

    return save_tiny(tmp_path_factory.mktemp("devmap") / "llama", tiny_tokenizer())


@pytest.fixture(scope="module")
def loads(tiny_dir):
    """(whole, placed by DISK_MAP, placed by auto with a CPU cap of 1 KB: every block on disk)."""
    whole = vocablens.load(str(tiny_dir))
    placed = vocablens.load(str(tiny_dir), device_map=DISK_MAP)
    auto = vocablens.load(str(tiny_dir), device_map="auto", max_memory={"cpu": "1KB"})
    return whole, placed, auto


#: keys of a ``to_json`` that measure the run, not the model (wall times), and how a lens was matched
#: to the model (the tuned lens below is made for the whole load, and checked by hash on the others)
CLOCKS = ("seconds", "tokens_per_s", "verified")


def _without_notes(obj):
    """A ``to_json`` with the provenance's notes (the placed load's note says where it went), the wall
    times (``*_s``, :data:`CLOCKS`) dropped."""
    if isinstance(obj, dict):
        return {k: _without_notes(v) for k, v in obj.items() if k != "notes" and k not in CLOCKS and not k.endswith("_s")}
    if isinstance(obj, list):
        return [_without_notes(v) for v in obj]
    return obj


def _close(a, b, path="") -> None:
    """``a`` and ``b`` (JSON) equal, floats within TOL."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= TOL or a == b, (path, a, b)
    else:
        assert a == b, (path, a, b)


# ------------------------------------------------------------------------------ where things went
def test_the_placement_is_what_was_asked(loads):
    whole, placed, auto = loads
    assert placed.model.hf_device_map == DISK_MAP
    b = placed.borders
    assert not b.W_E.is_meta and not b.unembedding.weight.is_meta and not any(p.is_meta for p in b.final_norm.parameters())
    assert not any(p.is_meta for p in b.blocks[0].parameters())  # cpu: resident
    assert all(p.is_meta for p in b.blocks[1].parameters())  # disk: read at each forward
    assert "device map: embedding cpu, blocks 0 cpu, 1 disk, head cpu" in placed.provenance.notes
    # auto with 1 KB of CPU memory: every block goes to disk, the borders stay where the stream is
    dm = auto.model.hf_device_map
    assert [dm[f"model.layers.{i}"] for i in range(2)] == ["disk", "disk"]
    assert dm["model.embed_tokens"] == dm["lm_head"] == dm["model.norm"] == "cpu"
    assert not auto.borders.W_E.is_meta and not auto.borders.unembedding.weight.is_meta
    assert all(p.is_meta for blk in auto.borders.blocks for p in blk.parameters())
    # the readout check ran on the placed model
    assert placed.provenance.readout.startswith("checked") and auto.provenance.readout.startswith("checked")


def test_borders_are_pinned_where_the_stream_is():
    """A map that puts the borders elsewhere is corrected: embedding (+ project_in) where block 0 runs,
    final norm + head where the last block runs; a block on cpu or disk runs on the first GPU named."""
    from accelerate import init_empty_weights
    from tiny_models import _config
    from transformers import AutoModelForCausalLM

    from vocablens.models.files.placement import pinned

    with init_empty_weights():
        untied = AutoModelForCausalLM.from_config(_config("llama"))
        tied = AutoModelForCausalLM.from_config(_config("llama_tied"))
    coarse = {"model.embed_tokens": "disk", "model.layers.0": 1, "model.layers.1": 2, "model.norm": "cpu",
              "model.rotary_emb": 0, "lm_head": "disk"}
    fine = pinned(untied, coarse)
    assert fine["model.embed_tokens"] == 1 and fine["model.norm"] == fine["lm_head"] == 2
    assert fine["model.layers.0"] == 1 and fine["model.layers.1"] == 2 and fine["model.rotary_emb"] == 0
    off = pinned(untied, {**coarse, "model.layers.0": "disk", "model.layers.1": "cpu"})
    assert off["model.embed_tokens"] == off["lm_head"] == 0  # both blocks run on the first GPU of the map
    t = pinned(tied, coarse)
    assert t["lm_head"] == t["model.embed_tokens"] == 1  # a tied head stays one tensor, with the embedding
    assert t["model.norm"] == 2
    # a coarse map ({"": device}, or by parent module) is refined to one entry per block and border
    fine = pinned(untied, {"model": "disk", "lm_head": "cpu"})
    assert fine["model.layers.0"] == fine["model.layers.1"] == "disk" and fine["model.embed_tokens"] == "cpu"
    with pytest.raises(BadInput, match="not a module"):
        pinned(untied, {"model.nothing": "cpu", "": "cpu"})


# ------------------------------------------------------------------------------ the same figures
def test_every_analysis_gives_the_whole_loads_figures(loads):
    """The ops and analyses of test_device's device check (score, logit lens, tuned-lens eval and
    training, settle, token search, head circuit, explain, generate, Jacobian-lens fit ...)."""
    from test_device import _analyses

    whole, placed, _ = loads
    want, got = _analyses(whole.borders), _analyses(placed.borders)
    assert want.keys() == got.keys()
    for k in want:
        assert want[k].shape == got[k].shape, k
        assert torch.allclose(want[k].double(), got[k].double(), atol=TOL, rtol=0), k


def test_workflows_give_the_whole_loads_json(loads, tmp_path):
    """lens (logit, tuned, jacobian), score, generate with and without early exit, backward lens,
    Jacobian-lens fit, tuned-lens eval, explain, settle, trajectory, anomaly, bottleneck: ``to_json``
    equal (floats within TOL). The tuned lens is one random lens given to the three loads."""
    from vocablens.generate import ExitRule
    from vocablens.lens.jacobian_fit import JacobianFitSettings
    from vocablens.lens.tuned import TunedLens

    whole, placed, auto = loads
    tuned = TunedLens.for_model(whole.borders)
    with torch.no_grad():
        tuned.weight.copy_(0.05 * torch.randn(tuned.weight.shape, generator=torch.Generator().manual_seed(2)))
    for m in loads:
        m.add_lens("tuned", tuned)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"the cat {i} sat on the mat and the dog ran far away. " * 4 for i in range(20)),
                      encoding="utf-8")
    fits = [m.fit_jacobian_lens(str(corpus), max_tokens=16, seq_len=8,
                                settings=JacobianFitSettings(skip_first=2, dim_batch=64, prompt_batch=2))
            for m in (whole, placed, auto)]
    for f in fits[1:]:
        _close(_without_notes(fits[0].to_json()), _without_notes(f.to_json()))
        assert torch.allclose(fits[0].value.J, f.value.J, atol=TOL, rtol=0)
    prompt = "the cat sat on the mat"

    def runs(m, every: bool):  # the auto load: lens, score, generate (and the fit above)
        some = {
            "lens": m.lens([prompt, "the dog"], kind=["logit", "tuned", "jacobian"], k=3, positions="all"),
            "score": m.score(prompt, top_k=3),
            "generate": m.generate("the cat", max_new_tokens=5, top=2),
        }
        return some if not every else {**some,
            "early_exit": m.generate("the cat", max_new_tokens=5, early_exit=ExitRule(threshold=0.05)),
            "early_exit_tuned": m.generate("the cat", max_new_tokens=4,
                                           early_exit=ExitRule(lens="tuned", threshold=0.05, tuned=tuned)),
            "eval": m.eval_lens(tuned, corpus=str(corpus), max_tokens=64, seq_len=16),
            "settle": m.settle(str(corpus), max_tokens=64, seq_len=16, lens="tuned"),
            "anomaly": m.anomaly(["the cat sat", "dogs run", "hello world", "the mat", "more text"],
                                 ["the cat", "zz qq xx"], labels=[0, 1], kind="both", detector="iforest"),
            "backward": m.backward_lens(prompt, target=" the", k=3),
            "explain": m.explain(prompt, k=3),
            "trajectory": m.trajectory(prompt),
            "bottleneck": m.bottleneck(str(corpus), contexts=80, seq_len=8),
        }

    want = {k: _without_notes(v.to_json()) for k, v in runs(whole, True).items()}
    for m, every in ((placed, True), (auto, False)):
        got = {k: _without_notes(v.to_json()) for k, v in runs(m, every).items()}
        assert set(got) <= set(want) and len(got) >= 3
        for k in got:
            _close(want[k], got[k], k)


# ------------------------------------------------------------------------------ the command line
def test_cli_device_map_flags(tiny_dir, tmp_path, capsys):
    from tiny_dirs import run_cli

    mp = tmp_path / "map.json"
    mp.write_text(json.dumps(DISK_MAP))
    code, whole, err = run_cli(capsys, "score", "the cat sat", "-m", tiny_dir, "--json")
    assert code == 0, err
    for extra in (["--device-map", mp], ["--device-map=auto", "--max-memory", "cpu=1KB"],
                  ["--device-map", "sequential", "--offload-folder", tmp_path / "off", "--max-memory=cpu=1KB"]):
        code, out, err = run_cli(capsys, "score", "the cat sat", "-m", tiny_dir, "--json", *extra)
        assert code == 0, err
        assert _without_notes(json.loads(out)) == _without_notes(json.loads(whole))
    code, whole, err = run_cli(capsys, "lens", "the cat", "-m", tiny_dir, "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "--device-map", mp, "lens", "the cat", "-m", tiny_dir, "--json")
    assert code == 0 and _without_notes(json.loads(out)) == _without_notes(json.loads(whole)), err


@pytest.mark.parametrize("argv, says", [
    (["--device-map", "nowhere"], "--device-map takes auto"),
    (["--device-map"], "--device-map needs a value"),
    (["--device-map", "auto", "--max-memory", "5GB"], "names each device"),
    (["--device-map", "auto", "--max-memory", "7=5GB"], "GPU 7 asked for"),
    (["--device-map", "auto", "--max-memory", "cpu=lots"], "takes a size"),
    (["--device-map", "auto", "--max-memory", "disk=5GB"], "disk has no cap"),
    (["--offload-folder", "x"], "give --device-map too"),
    (["--device-map", "missing.json"], "no such file"),
])
def test_cli_refuses_bad_placements_in_one_line(tiny_dir, capsys, argv, says):
    from tiny_dirs import run_cli

    code, out, err = run_cli(capsys, "score", "the cat", "-m", tiny_dir, *argv)
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1, err


def test_cli_refuses_a_device_map_where_no_blocks_are_read(tiny_dir, tmp_path, capsys):
    from tiny_dirs import run_cli

    mp = tmp_path / "bad.json"
    mp.write_text(json.dumps({"model.embed_tokens": "gpu9"}))
    for argv, says in ((["neighbors", " the", "--device-map", "auto"], "reads its matrices only"),
                       (["score", "x", "--device-map", mp], "is not a device")):
        code, out, err = run_cli(capsys, *argv, "-m", tiny_dir)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_load_refuses_bad_combinations(tiny_dir):
    with pytest.raises(BadInput, match="not both"):
        vocablens.load(str(tiny_dir), device="cuda", device_map="auto")
    with pytest.raises(BadInput, match="a read of some parts"):
        vocablens.load(str(tiny_dir), device_map="auto", read=("head",))
    with pytest.raises(BadInput, match="give a device map too"):
        vocablens.load(str(tiny_dir), offload_folder="/tmp/x")
    with pytest.raises(BadInput, match="not a module"):
        vocablens.load(str(tiny_dir), device_map={"model.nothing": "cpu", "": "cpu"})


def _same(a, b, path="") -> None:
    """Two analysis results equal: dataclasses field by field, tensors and floats within TOL."""
    import dataclasses

    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            if f.name not in CLOCKS and not f.name.endswith("_s") and f.name != "model":
                _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, path
        assert torch.allclose(a.double(), b.double(), atol=TOL, rtol=0, equal_nan=True), path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float):
        assert abs(a - b) <= TOL or a == b, (path, a, b)
    elif isinstance(a, (int, str, bool, type(None))):
        assert a == b, (path, a, b)


def test_report_and_explorer_give_the_whole_loads_answers(loads, tmp_path):
    """The report's sections that run the model, and the explorer's lens, explain, project and
    trajectory answers, on the placed model equal the whole load's."""
    from serve_tiny import client

    from vocablens.serve import ServerState, create_app

    whole, placed, _ = loads
    only = ("lens", "explain", "settle")  # value vectors: the explorer's project below
    runs = [m.report(only=only, budget_s=600) for m in (whole, placed)]
    for key in only:
        a, b = runs[0].get(key), runs[1].get(key)
        assert a.result is not None and a.cut_short is None and b.cut_short is None, key
        _same(a.result, b.result, key)
    asks = [("/api/lens", {"prompt": "the cat sat", "kind": "logit", "k": 3}),
            ("/api/explain", {"prompt": "the cat sat", "position": -1}),
            ("/api/project", {"token": " the", "k": 4}),
            ("/api/trajectory", {"prompt": "the cat sat", "position": 2, "token": " the"})]
    answers = []
    for m in (whole, placed):
        state = ServerState(m, model_spec="tiny", max_tokens=16, argmax=False)
        state.start()
        c = client(create_app(state))
        answers.append([c.post(path, json=body) for path, body in asks])
    for (path, _), a, b in zip(asks, *answers):
        assert a.status_code == b.status_code == 200, (path, a.text, b.text)
        _close(_without_notes(a.json()), _without_notes(b.json()), path)
