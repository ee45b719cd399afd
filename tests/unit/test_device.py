"""Devices: one ``--device`` option on every computing command, and analyses that keep their tensors on
the model's device (the same results as on the CPU). The CUDA half runs where CUDA is present."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import make_tiny
from vocablens.cli.common import resolve_device, run_app
from vocablens.errors import BadInput

SRC = Path(__file__).resolve().parents[2] / "src" / "vocablens"
NO_CUDA = "no CUDA device on this machine: the GPU half of this test runs where torch.cuda.is_available()"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]
#: the modules whose loops run per token, chunk, row or layer: no unmarked host copy there
HOT = ["ops", "lens", "vocab_space", "generate", "geometry/embedding.py"]
#: host copies (``.cpu()``/``.numpy()``) and host-made tensors (a factory without ``device=``) allowed
#: without the ``# cpu:`` marker, per file: none, except in lens/logit.py and ops/chunking.py, which are
#: being rewritten elsewhere (logit.py: its result's input_ids copy and the positions index made on the
#: host, which indexing moves; chunking.py: a seeded probe drawn on the host, then moved): a ratchet
UNMARKED_OK = {"lens/logit.py": 1}
FACTORY_OK = {"lens/logit.py": 3, "ops/chunking.py": 1}


def _marked(lines: list[str], i: int) -> bool:
    """A ``# cpu:`` comment on the line or the one above says the host copy is deliberate."""
    return "# cpu" in lines[i] or (i > 0 and "# cpu" in lines[i - 1])


# ------------------------------------------------------------------------------------- the option
def test_resolve_device_names_and_errors(monkeypatch):
    assert resolve_device(None) == resolve_device("cpu") == resolve_device(" CPU ") == "cpu"
    for bad in ("nonsense", "gpu", "cuda:x", "xla"):
        with pytest.raises(BadInput, match="not a device"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BadInput, match="CUDA is not available"):
        resolve_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1" and resolve_device("cuda") == "cuda"
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun: a bare "cuda" is this process's device
    assert resolve_device("cuda") == "cuda:1"
    with pytest.raises(BadInput, match=r"2 CUDA device\(s\), cuda:0\.\.cuda:1"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("device, message", [
    ("nonsense", "is not a device"),
    pytest.param("cuda", "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")),
])
@pytest.mark.parametrize("command", [["score", "t1 t2"], ["neighbors", "t1"], ["lens", "t1 t2"],
                                     ["lens", "eval"], ["argmax"], ["generate", "t1"], ["report"]])
def test_bad_device_is_one_line_and_exit_2_before_loading(command, device, message, capsys):
    # the model does not exist: the device is checked first, so the error is about the device
    assert run_app([*command, "--model", "/nonexistent/model", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_every_computing_command_takes_device():
    import typer.main

    import vocablens.cli  # noqa: F401  (registers the commands)
    from vocablens.cli.common import app

    group = typer.main.get_command(app)
    names = []
    for name, cmd in group.commands.items():
        subs = cmd.commands.items() if hasattr(cmd, "commands") else [(None, cmd)]
        for sub, c in subs:
            names.append((name, sub, any("--device" in p.opts for p in c.params)))
    full = {n if s is None else f"{n} {s}": has for n, s, has in names}
    assert {n for n, has in full.items() if not has} <= {"anatomy", "lens merge"}  # a config counted, shards added: nothing to place
    assert {"neighbors", "lens show", "lens eval", "lens train", "lens anomaly", "score", "project", "explain",
            "settle", "argmax", "bottleneck", "generate", "steer", "align", "report", "serve", "expand",
            "trim"} <= set(full)


# ------------------------------------------------------------------------ CLI: cpu == no option
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = make_tiny("llama")
    d = tmp_path_factory.mktemp("device_tiny")
    model.save_pretrained(d, safe_serialization=True)
    tk = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(model.config.vocab_size)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0").save_pretrained(d)
    return d


def _stable(obj):
    """JSON without wall-clock fields (seconds, rates)."""
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in obj.items() if not re.search(r"(^|_)(s|time|seconds|per_s)$", k)}
    if isinstance(obj, list):
        return [_stable(v) for v in obj]
    return obj


PROMPT = "t5 t17 t3 t42 t8 t8 t61"


@pytest.mark.parametrize("command", [
    ["score", PROMPT], ["lens", PROMPT, "--positions", "all"], ["neighbors", "t5"], ["explain", PROMPT],
    ["generate", PROMPT, "-n", "4"], ["project", "--block", "1", "--neuron", "3"],
])
def test_device_cpu_gives_the_same_json_as_no_option(command, tiny_dir, capsys):
    outs = []
    for extra in ([], ["--device", "cpu"]):
        assert run_app([*command, "--model", str(tiny_dir), "--json", *extra]) == 0, capsys.readouterr().err
        outs.append(_stable(json.loads(capsys.readouterr().out)))
    assert outs[0] == outs[1] and outs[0]


# ------------------------------------------------------------ analyses on each available device
def _analyses(borders, tok=None) -> dict[str, torch.Tensor]:
    """Key ops and analyses of a tiny model; every tensor result, flattened to one dict."""
    from vocablens.geometry.embedding import cosine_neighbors
    from vocablens.generate.loop import generate
    from vocablens.lens.evaluate import evaluate
    from vocablens.lens.jacobian_fit import JacobianFitSettings, fit_jacobian_lens
    from vocablens.lens.logit import logit_lens
    from vocablens.lens.train import TrainSettings, train
    from vocablens.lens.tuned import TunedLens
    from vocablens.ops import linear_cross_entropy, probs_after_filters, sample, token_logprobs
    from vocablens.ops.kl import kl_readout
    from vocablens.generate.score import score_ids
    from vocablens.vocab_space.steer import concept_scores
    from vocablens.vocab_space.circuits import head_circuit
    from vocablens.vocab_space.explain import explain
    from vocablens.vocab_space.search import search_tokens
    from vocablens.vocab_space.settle import settle

    dev = borders.device
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, borders.vocab_size, (2, 12), generator=g)  # cpu: inputs, as a user passes them
    U = borders.unembedding
    out: dict[str, torch.Tensor] = {}
    h = torch.randn(10, borders.d_model, generator=g).to(dev)
    t = rows[0, :10].to(dev)
    tl = token_logprobs(U.normed(h), U.weight, t, top_k=3, entropy=True, **U.head_kwargs())
    out.update(tl_lp=tl.logprob, tl_ent=tl.entropy, tl_ids=tl.topk_ids)
    ref = U.logits(U.normed(h))
    kr = kl_readout(U.normed(h)[None], U.weight, ref, targets=t, rank=True, entropy=True, **U.head_kwargs())
    out.update(kl=kr.kl, kl_rank=kr.target_rank)
    hh = U.normed(h).detach().requires_grad_(True)
    W = U.weight.detach().clone().requires_grad_(True)
    loss = linear_cross_entropy(hh, W, t, chunk_tokens=4)
    loss.backward()
    out.update(ce=loss.detach(), ce_gh=hh.grad, ce_gW=W.grad)
    out.update(greedy=sample(ref, 0.0), top_p=probs_after_filters(ref, 0.8, top_k=40, top_p=0.9))
    out.update(score=score_ids(borders, rows[0], top_k=2).logprobs)
    lens = logit_lens(borders, rows[0], positions="all", k=3)
    out.update(lens_top=lens.layers[1].top_ids, lens_kl=lens.layers[0].kl_to_final)
    tuned = TunedLens.for_model(borders)
    with torch.no_grad():  # the same random translators on every device (drawn on the host)
        tuned.weight.copy_(0.02 * torch.randn(tuned.weight.shape, generator=torch.Generator().manual_seed(1)))
    ev = evaluate(borders, tuned, rows)
    out.update(ev_kl=torch.tensor(ev.tuned_kl + ev.logit_ce))  # cpu: floats
    st = settle(borders, rows, thresholds=[0.1, 0.5])
    out.update(settle=st.settle_layer, settle_hist=st.histogram,
               settle_exits=torch.tensor([e.mean_exit_layer for e in st.exits]))  # cpu: floats
    s = search_tokens(borders, [5, 9], k=3)[1]
    out.update(search_z=s.promote_z, search_ids=s.promote_neurons, search_rank=s.suppress_ranks)
    hc = head_circuit(borders, 1, 0, k=5)
    out.update(circuit=hc.scores, circuit_src=hc.src_ids)
    nid, cos = cosine_neighbors(borders.W_E, borders.W_E[7], 4, exclude=[7])
    out.update(nb_ids=nid, nb_cos=cos)
    ex = explain(borders, rows[0], token_id=9, k=3)
    out.update(explain=torch.tensor([ex.logit_diff_sum, ex.logit_diff_model]  # cpu: floats
                                    + [ly.mlp_dla for ly in ex.blocks]), explain_heads=ex.blocks[0].head_dla)
    gen = generate(borders, rows[0, :5], max_new_tokens=4, top_n=2)
    out.update(gen=torch.tensor([tk.id for tk in gen.tokens]))  # cpu: ids
    out.update(concept=concept_scores(borders, [5, 9])[2])
    jl = fit_jacobian_lens(borders, rows, JacobianFitSettings(skip_first=4, dim_batch=8, prompt_batch=2))
    out.update(jacobian=jl.J)
    res = train(borders, rows[:, :8], TrainSettings(steps=2, tokens_per_step=16, seq_len=8, chunk_rows=16))
    out.update(trained=res.lens.weight.detach(), trained_loss=torch.tensor([h.loss for h in res.history]))  # cpu
    return out


@pytest.fixture(scope="module")
def tiny_model():
    return make_tiny("llama")


_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "randn", "rand", "randint",
              "randperm", "eye", "linspace"}


@pytest.fixture(scope="module")
def cpu_run(tiny_model):
    """The analyses on the CPU, watched by a torch function mode that sees every factory call
    (torch.zeros, arange, tensor, ...): ``(results, {(file, line)} of calls without device= in HOT)``."""
    from torch.overrides import TorchFunctionMode

    from vocablens.models.borders import Borders

    prefixes = [str(SRC / root) for root in HOT]
    hits: set[tuple[str, int]] = set()

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") in _FACTORIES and "device" not in kwargs:
                f = sys._getframe(1)
                while f is not None and "/torch/" in f.f_code.co_filename:
                    f = f.f_back
                if f is not None and any(f.f_code.co_filename.startswith(p) for p in prefixes):
                    hits.add((f.f_code.co_filename, f.f_lineno))
            return func(*args, **kwargs)

    with Watch():
        results = _analyses(Borders.from_model(copy.deepcopy(tiny_model)))
    return results, hits


@pytest.mark.parametrize("device", DEVICES)
def test_analyses_stay_on_the_device_and_match_the_cpu(device, tiny_model, cpu_run):
    from vocablens.models.borders import Borders

    cpu_results = cpu_run[0]
    dev = torch.device(device)
    got = _analyses(Borders.from_model(copy.deepcopy(tiny_model).to(dev)))
    assert got.keys() == cpu_results.keys()
    host_made = {"ev_kl", "settle_exits", "explain", "gen", "trained_loss"}  # floats the test gathered
    tol = 0.0 if dev.type == "cpu" else 1e-4  # the CPU is deterministic; a GPU sums in another order
    for name, t in got.items():
        if name not in host_made:
            assert t.device.type == dev.type, f"{name} came back on {t.device}, the model is on {dev}"
        torch.testing.assert_close(t.cpu(), cpu_results[name], rtol=tol, atol=tol,
                                   msg=lambda m, name=name: f"{name}: {m}")


# ------------------------------------------------------------------ no hidden host copies or tensors
def test_hot_modules_have_no_unmarked_host_copies():
    found: dict[str, list[str]] = {}
    for root in HOT:
        for f in sorted((SRC / root).rglob("*.py")) if (SRC / root).is_dir() else [SRC / root]:
            lines = f.read_text(encoding="utf-8").splitlines()
            rel = f.relative_to(SRC).as_posix()
            for i, line in enumerate(lines):
                code = line.split("#", 1)[0]
                if re.search(r"\.(cpu|numpy)\(\)", code) and not _marked(lines, i):
                    found.setdefault(rel, []).append(f"{rel}:{i + 1}: {line.strip()}")
    over = [hit for rel, hits in found.items() if len(hits) > UNMARKED_OK.get(rel, 0) for hit in hits]
    assert not over, "host copies without a '# cpu:' reason:\n" + "\n".join(over)


def test_hot_paths_create_no_tensor_on_the_host_by_accident(cpu_run):
    """In the hot modules every factory call the analyses made names its device or says (``# cpu:``)
    why its tensor lives on the host."""
    hits = cpu_run[1]
    found: dict[str, list[str]] = {}
    for fn, ln in sorted(hits):
        lines = Path(fn).read_text(encoding="utf-8").splitlines()
        if not _marked(lines, ln - 1):
            rel = Path(fn).relative_to(SRC).as_posix()
            found.setdefault(rel, []).append(f"{rel}:{ln}: {lines[ln - 1].strip()}")
    bad = [hit for rel, hs in found.items() if len(hs) > FACTORY_OK.get(rel, 0) for hit in hs]
    assert hits, "the watch saw no factory call at all: the mode is not intercepting"
    assert not bad, "tensors made on the host without device= or a '# cpu:' reason:\n" + "\n".join(bad)
