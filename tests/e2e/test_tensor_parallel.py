"""Tensor parallel (issue 49, B): 2 gloo processes with ``--tp`` / ``vocablens.load(spec, tp=True)``
equal one process on the tiny families whose config has a tensor-parallel plan.

One torchrun launch of 2 ranks (:mod:`tp_worker`) runs everything: the CLI's lens, lens eval, score
and generate with ``--tp`` on a tiny llama (untied and tied), the refusals under torchrun, and for
each family the handle's lens (every position of a batch of 2 prompts), score, generation and lens
evaluation with ``tp=True``. Each is compared with the same call in this one process, floats within
:data:`TOL` (absolute, relative to max(1, |x|): float32 sums taken in another order across ranks),
ids and token choices exactly. Each rank must hold about half of every block and half the head's rows.

The default suite runs :data:`DEFAULT` (one of each kind of head: untied, tied, soft-capped, scaled,
biased, and a mixture of experts); ``VOCABLENS_TP_FAMILIES=all`` runs every family of the installed
transformers' causal-LM mapping that has a plan and builds tiny. Families without a plan, not built
tiny, or refused under ``--tp`` are printed with why (``-s``).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_distributed import _close, _drop_time, _one_process, _save
from tp_worker import reads
from vocablens.cli.common import run_app

TESTS = Path(__file__).parents[1]
TOL = 2e-5
V = 96
PROMPT = [3, 17, 5, 40, 41, 2, 9, 88, 12, 7]
#: one of each kind of head (untied, tied, soft-capped, logit-scaled, biased) and a mixture of experts
DEFAULT = ("llama", "qwen2", "gemma2", "cohere", "phi", "mixtral")


def _plans() -> tuple[list[str], dict[str, str]]:
    """(families of the causal-LM mapping whose config has a tensor-parallel plan, the others with why)."""
    import warnings

    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    has, without = [], {}
    for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = CONFIG_MAPPING[t]()
        except Exception as e:  # noqa: BLE001  (the reason is the result)
            without[t] = f"its config does not build ({type(e).__name__})"
            continue
        if getattr(cfg, "base_model_tp_plan", None):
            has.append(t)
        else:
            without[t] = "no tensor-parallel plan (config.base_model_tp_plan)"
    return has, without


def _families() -> list[str]:
    has, without = _plans()
    for t, why in without.items():
        print(f"{t}: {why}")
    return has if os.environ.get("VOCABLENS_TP_FAMILIES") == "all" else [t for t in DEFAULT if t in has]


@pytest.fixture(scope="module", autouse=True)
def no_first_use_quality():
    """A lens's held-out figures are measured on first use on one process's whole head only (a
    tensor-parallel model reads the lens without them): both sides here read it without them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VOCABLENS_LENS_QUALITY", "0")
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny saved models (with a random tuned lens each), a corpus, the CLI commands and the API jobs."""
    from tiny_families import build as _build

    from vocablens.lens.tuned import TunedLens
    from vocablens.models import load

    root = tmp_path_factory.mktemp("tp")
    corpus = root / "corpus"
    corpus.mkdir()
    g = torch.Generator().manual_seed(1)
    for i in range(3):
        (corpus / f"doc{i}.txt").write_text(" ".join(f"t{int(x)}" for x in torch.randint(1, 95, (40,), generator=g)))
    models, skipped = {}, {}
    for t in _families():
        m = _build(t, V)
        if isinstance(m, str):
            skipped[t] = f"not built tiny: {m}"
            continue
        try:
            if isinstance(getattr(m.config, "layer_types", None), list):  # the default config's 32 layers
                m.config.layer_types = m.config.layer_types[:m.config.num_hidden_layers]
            d = _save(m, root / t)
            lens = TunedLens.for_model(load(d).borders, name=t)
        except Exception as e:  # noqa: BLE001  (the reason is the result)
            skipped[t] = f"not saved and reloaded tiny: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}"
            continue
        with torch.no_grad():
            lens.weight.copy_(0.05 * torch.randn(lens.weight.shape, generator=torch.Generator().manual_seed(0)))
        lens.save(root / f"{t}-lens")
        models[t] = {"dir": d, "lens": str(root / f"{t}-lens"), "corpus": str(corpus)}
    from tiny_models import make_tiny

    tied = _save(make_tiny("llama_tied", seed=4), root / "tied")
    llama, gpt2 = models["llama"]["dir"], _save(make_tiny("gpt2", seed=1), root / "gpt2")
    cli = [
        ["lens", "t3 t17 t5 t40 t41", "-m", llama, "--positions", "all", "-k", "4", "--tp", "--json"],
        ["lens", "t3 t17 t5 t40 t41", "-m", tied, "--tp", "--json"],
        ["lens", "t3 t17 t5 t40 t41", "-m", llama, "--kind", "both", "--lens", models["llama"]["lens"], "--tp", "--json"],
        ["lens", "eval", "-m", llama, "--lens", models["llama"]["lens"], "--corpus", str(corpus), "--split", "all",
         "--max-tokens", "96", "--seq-len", "16", "--tp", "--json"],
        ["score", "t3 t17 t5 t40 t41 t2 t9 t88", "-m", llama, "--top-k", "4", "--tp", "--json"],
        ["score", "t3 t17 t5 t40 t41 t2 t9 t88", "-m", tied, "--tp", "--json"],
        ["generate", "t3 t17 t5", "-m", llama, "-n", "8", "--tp", "--json"],
        ["generate", "t3 t17 t5", "-m", tied, "-n", "6", "-t", "1.5", "--seed", "7", "--tp", "--json"],
    ]
    refused = [
        ["score", "t3 t17", "-m", gpt2, "--tp"],                       # a family without a plan
        ["neighbors", " t3", "-m", llama, "--tp"],                      # a command that does not run split
        ["lens", "eval", "-m", llama, "--kind", "logit,jacobian", "--tp"],
    ]
    return {"cli": cli, "refused": refused, "models": models, "skipped": skipped}


@pytest.fixture(scope="module")
def two_ranks(world, tmp_path_factory):
    """One torchrun of 2 gloo ranks running every job (one output per rank)."""
    out = tmp_path_factory.mktemp("ranks")
    jobs = out / "jobs.json"
    jobs.write_text(json.dumps({"cli": world["cli"] + world["refused"], "models": world["models"],
                                "prompt": PROMPT}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS), str(TESTS / "unit"),
                                                          str(Path(__file__).parent)]), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
                        str(TESTS / "tp_worker.py"), str(jobs), str(out)],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[max(0, r.stderr.find("Traceback")):][:4000]  # the first rank's traceback
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]


def _generation(g: dict) -> dict:
    return _drop_time({k: v for k, v in g.items() if k not in ("tokens_per_s",)})


def _untied(a: dict, b: dict) -> None:
    """Positions of a lens JSON: top tokens compared where their probability is apart from the other
    listed ones by more than TOL (equal probabilities, e.g. a uniform layer, list tokens in either
    order: vocablens's merged top-k puts the lowest id first, torch.topk any of them)."""
    if isinstance(b, dict) and "top_probs" in b:
        p = b["top_probs"]
        apart = [all(abs(p[i] - p[j]) > TOL for j in range(len(p)) if j != i) for i in range(len(p))]
        for key in ("top_tokens", "top_ids"):
            if key in b:
                a[key] = [x if keep else y for x, y, keep in zip(a[key], b[key], apart)]
    elif isinstance(b, dict):
        for k in b:
            if k in a:
                _untied(a[k], b[k])
    elif isinstance(b, list) and isinstance(a, list):
        for x, y in zip(a, b):
            _untied(x, y)


def _figures(d):
    """A result's JSON without the loaded model's provenance (its readout line says how it was loaded)."""
    if isinstance(d, dict):
        return {k: _figures(v) for k, v in d.items() if k != "model"}
    return [_figures(x) for x in d] if isinstance(d, list) else d


def test_cli_with_tp_prints_the_one_process_results(world, two_ranks, capsys):
    """lens, lens eval, score and generate with --tp: rank 0 prints what one process prints without
    --tp (floats within TOL, every id equal); rank 1 prints nothing. A lens's quality figures are not
    measured tensor-parallel (the measurement reads the whole head): the one process measures none
    either (``no_first_use_quality``)."""
    n = len(world["cli"])
    assert all(code == 0 and out == "" for code, out in two_ranks[1]["cli"][:n])
    for argv, (code, got) in zip(world["cli"], two_ranks[0]["cli"][:n]):
        ref_code, ref = _one_process(capsys, [a for a in argv if a != "--tp"])
        assert code == ref_code == 0, argv
        g, r = json.loads(got), json.loads(ref)
        if argv[0] == "generate":
            assert [t["id"] for t in g["tokens"]] == [t["id"] for t in r["tokens"]]  # the same tokens
            g, r = _generation(g), _generation(r)
        _close(_figures(g), _figures(r), TOL, argv[0])


def test_refusals_are_one_line(world, two_ranks, capsys, monkeypatch):
    """--tp on a family without a plan, on a command that does not run split, and on lens eval with
    other lenses: exit 2 on every rank, one line on rank 0 naming why; --tp without torchrun (CLI and
    Python), with a GGUF file, --max-memory or a partial read: one line each."""
    n = len(world["cli"])
    for rank in two_ranks:
        assert [code for code, _ in rank["cli"][n:]] == [2] * len(world["refused"])
    capsys.readouterr()
    assert run_app(world["cli"][4]) == 2  # score --tp in one process: WORLD_SIZE is 1
    err = capsys.readouterr().err
    assert "torchrun" in err and len(err.strip().splitlines()) == 1, err
    from vocablens.cli.torchrun import tp_refusal
    from vocablens.models.tensor_parallel import plan_refusal
    from transformers import GPT2Config

    assert "no tensor-parallel plan" in plan_refusal(GPT2Config())
    import vocablens
    from vocablens.errors import BadInput
    from vocablens.models.tensor_parallel import tp_refusal as load_refusal

    with pytest.raises(BadInput, match="torchrun"):  # the Python API, before anything loads
        vocablens.load(world["models"]["llama"]["dir"], tp=True)
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets: the refusals that follow it
    assert ".gguf" in load_refusal("gguf", None, None)
    assert "`max_memory`" in load_refusal("dir", None, "200MB")
    assert "parts" in load_refusal("dir", ("head",), None)
    assert load_refusal("dir", None, None) is None
    assert "does not run tensor-parallel" in tp_refusal(["neighbors", " t3"], world["refused"][1])
    assert "logit and tuned" in tp_refusal(["lens", "eval"], world["refused"][2])


def test_each_family_with_a_plan_equals_one_process(world, two_ranks):
    """A model loaded with tp=True on 2 ranks equals one process: lens (batch, every position), score,
    greedy generation, lens evaluation; each rank holds half the head's rows and about half the blocks'
    weights (outside a mixture's experts, which some plans keep whole: the share is printed); a plan that
    splits no block is refused in one line."""
    import vocablens

    ok, refused, held, crashed = [], dict(world["skipped"]), {}, {}
    for t, spec in world["models"].items():
        a, b = two_ranks[0]["models"][t], two_ranks[1]["models"][t]
        if "crash" in a or "crash" in b:
            crashed[t] = a.get("crash") or b.get("crash")
            continue
        if "error" in a:
            assert a == b  # refused alike on every rank, in one line
            refused[t] = a["error"]
            continue
        ref = reads(vocablens.load(spec["dir"]), spec, PROMPT)
        try:
            for k in ("lens", "score", "eval", "generate"):
                if "failed" in ref[k]:  # the read fails in one process too: not tensor parallel's doing
                    assert a[k] == b[k] == ref[k], (k, a[k], ref[k])
                    refused[t] = f"{k} fails in one process too: {ref[k]['failed']}"
                    continue
                for got in (a[k], b[k]):
                    _untied(got, ref[k])
                    _close(_figures(got), _figures(ref[k]), TOL, f"{t}.{k}")
            for h in (a["held"], b["held"]):
                assert h["blocks_split"] >= 1, h  # the plan split the blocks (a plan that splits none is refused)
                assert h["W_U_rows"] == V // 2, h
                assert t not in DEFAULT or t == "mixtral" or h["dense_local"] < 0.55 * h["dense_whole"], h
            assert a["readout"].startswith("checked:") and "tensor parallel over 2 ranks" in a["readout"]
            for r in (a["refused"], b["refused"]):  # Model.argmax on a tp=True load: one line, nothing run
                assert r["failed"].startswith("TensorParallelUnsupported: Model.argmax does not run"), r
        except AssertionError as e:
            crashed[t] = f"differs from one process: {str(e).splitlines()[0][:200]}"
            continue
        held[t] = a["held"]["local"] / a["held"]["whole"]
        ok.append(t)
    print(f"\n--tp equals one process on {len(ok)} families (rank 0's share of the block weights): "
          + ", ".join(f"{t} {held[t]:.2f}" for t in ok))
    for t, why in sorted(refused.items()):
        print(f"  {t}: {why}")
    for t, why in sorted(crashed.items()):
        print(f"  {t}: FAILED (not refused in one line): {why}")
    assert not crashed, crashed
    assert set(DEFAULT) - set(refused) <= set(ok)
    assert {"llama", "qwen2", "gemma2"} <= set(ok)
