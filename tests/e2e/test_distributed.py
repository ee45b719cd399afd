"""Several processes (torch.distributed, gloo): ``lens eval`` and ``settle`` split rows over ranks,
``score`` and ``generate`` split the embedding and LM head rows; each equals one process."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import make_tiny
from vocablens.cli.common import run_app
from vocablens.ops.vocab_parallel.comm import share
from vocablens.parallel.processes import VocabParallelModel
from vocablens.models import Borders, load
from vocablens.generate.score import score_ids

TESTS = Path(__file__).parents[1]
TEXT = "t3 t17 t5 t40 t41 t2 t9 t88 t12 t7 t60 t33 t1 t21 t5 t5 t70 t44 t90 t13 t8 t31"


def _save(model, d: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(d, safe_serialization=True)
    V = model.config.vocab_size
    tk = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(V)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", eos_token="t95").save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny saved models, a tuned lens for the first, a 6-document corpus, and the commands."""
    from vocablens.lens.tuned import TunedLens

    root = tmp_path_factory.mktemp("dist")
    untied, tied = _save(make_tiny("llama", seed=3), root / "llama"), _save(make_tiny("llama_tied", seed=4), root / "tied")
    lens = TunedLens.for_model(load(untied).borders, name="tiny")
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        lens.weight.copy_(0.05 * torch.randn(lens.weight.shape, generator=g))
        lens.bias.copy_(0.05 * torch.randn(lens.bias.shape, generator=g))
    lens.save(root / "lens")
    corpus = root / "corpus"
    corpus.mkdir()
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(" ".join(f"t{int(x)}" for x in torch.randint(1, 95, (70,), generator=g)))
    cmds = [
        ["lens", "eval", "-m", untied, "--lens", str(root / "lens"), "--corpus", str(corpus), "--split", "all",
         "--max-tokens", "320", "--seq-len", "32", "--json"],
        ["settle", "-m", untied, "--corpus", str(corpus), "--max-tokens", "384", "--seq-len", "32", "--batch", "2",
         "--json"],
        ["score", TEXT, "-m", untied, "--top-k", "4", "--json"],
        ["score", TEXT, "-m", tied, "--top-k", "3", "--json"],
        ["generate", "t3 t17 t5", "-m", untied, "-n", "12", "--json"],
        ["generate", "t3 t17 t5", "-m", untied, "-n", "8", "-t", "1.5", "--json"],  # no seed: one drawn for all ranks
        ["lens", "fit-jacobian", "-m", untied, "--corpus", str(corpus), "--out", str(root / "jl-ranks"), "--seq-len",
         "12", "--max-tokens", "48", "--skip-first", "2", "--dim-batch", "64", "--quality-tokens", "0",
         "--save-dtype", "float32", "--json"],
    ]
    return {"commands": cmds, "models": [untied, tied], "root": str(root)}


@pytest.fixture(scope="module")
def two_ranks(world, tmp_path_factory):
    """One torchrun of 2 gloo ranks running every command (rank outputs, one per rank)."""
    out = tmp_path_factory.mktemp("ranks")
    jobs = out / "jobs.json"
    jobs.write_text(json.dumps(world))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS), str(Path(__file__).parent)]), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
                        str(TESTS / "dist_cli_worker.py"), str(jobs), str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]


def _one_process(capsys, argv):
    capsys.readouterr()
    code = run_app(argv)
    return code, capsys.readouterr().out


def _close(a, b, tol, path="$"):
    """JSON values equal, floats within tol (absolute, relative to max(1, |b|))."""
    if isinstance(b, float) or isinstance(a, float):
        assert abs(a - b) <= tol * max(1.0, abs(b)), f"{path}: {a} != {b}"
    elif isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in b:
            _close(a[k], b[k], tol, f"{path}.{k}")
    elif isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, tol, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _drop_time(d):
    return {k: v for k, v in d.items() if k not in ("time_s", "prefill_s", "tokens_per_s", "seconds")}


def test_two_ranks_print_the_one_process_results(world, two_ranks, capsys):
    """lens eval and settle (rows split, sums all-reduced) and score and generate (head split over V)
    under 2 gloo ranks: rank 0 prints what one process prints, rank 1 prints nothing."""
    assert all(code == 0 and out == "" for code, out in two_ranks[1]["runs"])
    for argv, (code, got) in zip(world["commands"], two_ranks[0]["runs"]):
        if argv[1] == "fit-jacobian":
            _fit_jacobian_ranks_equal_one_process(world, argv, code, capsys)
            continue
        ref_code, ref = _one_process(capsys, argv)
        assert code == ref_code == 0, argv
        g, r = json.loads(got), json.loads(ref)
        if "-t" in argv:  # sampled without a seed: the ranks agreed on one (else they would hang)
            assert 1 <= len(g["tokens"]) <= 8
        elif argv[0] == "generate":
            assert [t["id"] for t in g["tokens"]] == [t["id"] for t in r["tokens"]]  # the same greedy tokens
            assert len(g["tokens"]) == 12
            _close(_drop_time(g), _drop_time(r), 1e-5)
        elif argv[0] == "score":
            _close(g, r, 1e-5)  # log-probabilities within 1e-5 nats
        else:
            _close(g, r, 1e-6)  # float64 sums: equal up to float32 rounding of each row
    ev = json.loads(two_ranks[0]["runs"][0][1])
    assert ev["tokens"] == 320 and ev["layers"][0]["logit"]["kl"] > 0


def _fit_jacobian_ranks_equal_one_process(world, argv, code, capsys):
    """``torchrun ... lens fit-jacobian``: the 2 ranks fit 2 prompts each and all-reduce the prompt-weighted
    sums; rank 0's saved lens equals the one-process fit of the 4 prompts (float32 rounding, 1e-5 relative)."""
    from vocablens.lens.jacobian import JacobianLens

    assert code == 0
    ranks = JacobianLens.load(Path(world["root"]) / "jl-ranks")
    one = list(argv)
    one[one.index("--out") + 1] = str(Path(world["root"]) / "jl-one")
    ref_code, _ = _one_process(capsys, one)
    assert ref_code == 0
    whole = JacobianLens.load(Path(world["root"]) / "jl-one")
    assert ranks.settings["n_prompts"] == whole.settings["n_prompts"] == 4 and ranks.settings["world_size"] == 2
    assert ranks.settings["data"]["prompts_sha256"] == whole.settings["data"]["prompts_sha256"]
    assert (ranks.J - whole.J).abs().max() <= 1e-5 * whole.J.abs().max()


def test_each_rank_holds_only_its_slice_of_the_vocabulary(world, two_ranks):
    for spec in world["models"]:
        for k, rank in enumerate(two_ranks):
            h = rank["held"][spec]
            lo, hi = share(h["V"], k, 2)
            assert h["rows"] == h["emb_rows"] == hi - lo == h["V"] // 2
            assert h["full_params"] == []  # no [V, ...] parameter left on the rank


@pytest.mark.parametrize("family", ["gemma3_text", "opt_project", "granite", "cohere"])
def test_vocab_parallel_model_of_one_rank_scores_as_the_model(family):
    """The sharded path (embedding module swapped, head from logsumexp) on one rank equals score_ids
    for families with an input scale inside the embedding (Gemma 3), in the model (Granite), a logit
    scale (Cohere) and project_out (OPT); untied and tied llama run on two ranks above."""
    ids = torch.tensor([5, 17, 3, 3, 60, 22, 9, 41])
    ref = score_ids(Borders.from_model(make_tiny(family, seed=2)), ids, top_k=3)
    b = Borders.from_model(make_tiny(family, seed=2))
    vp = VocabParallelModel(b)
    assert b.unembedding.weight.numel() == 0 and vp.held_rows() == b.vocab_size  # the full matrices were freed
    got = vp.score(ids, top_k=3)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, ref.entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.topk_logprobs, ref.topk_logprobs, atol=1e-5, rtol=0)
    assert torch.equal(got.topk_ids, ref.topk_ids)


def test_share_covers_every_row_once_in_order():
    for n in (0, 1, 5, 7):
        parts = [share(n, k, 3) for k in range(3)]
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1
