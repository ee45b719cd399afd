"""Tests of the tuned lens (vocablens.lens.tuned): math, training, files, CLI, report section."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import make_tiny
from vocablens.errors import (
    BadInput, CheckpointMismatch, CorruptModelFile, OutputExists, TrainingDiverged,
)
from vocablens.lens.evaluate import evaluate
from vocablens.lens.logit import lens_pair, logit_lens
from vocablens.lens.regression import regression_init
from vocablens.lens.train import TrainSettings, lens_from_checkpoint, load_checkpoint, train
from vocablens.lens.tuned import TunedLens, find_lens, model_identity, shipped_lens_path
from vocablens.models import Borders
from vocablens.ops import linear_kl

TESTS = Path(__file__).parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread avoids OpenMP spin-waiting on a busy machine (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(family: str = "llama", seed: int = 0) -> Borders:
    return Borders.from_model(make_tiny(family, seed=seed))


def rows_for(b: Borders, n: int = 8, T: int = 16, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, b.vocab_size, (n, T), generator=g)


def random_lens(b: Borders, scale: float = 0.05, seed: int = 0) -> TunedLens:
    lens = TunedLens.for_model(b)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lens.weight.copy_(scale * torch.randn(lens.weight.shape, generator=g))
        lens.bias.copy_(scale * torch.randn(lens.bias.shape, generator=g))
    return lens


# ------------------------------------------------------------------ the lens itself
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", "opt_project"])
def test_untrained_tuned_lens_is_exactly_the_logit_lens(family):
    b = tiny(family)
    ids = rows_for(b, 1, 12)[0]
    ref = logit_lens(b, ids, positions="all", k=5)
    got = logit_lens(b, ids, positions="all", k=5, translator=TunedLens.for_model(b))
    assert got.kind == "tuned"
    for a, c in zip(ref.layers, got.layers):
        assert torch.equal(a.top_ids, c.top_ids)
        assert torch.equal(a.top_probs, c.top_probs)
        assert torch.equal(a.kl_to_final, c.kl_to_final)
        assert torch.equal(a.entropy, c.entropy)


def test_translate_is_residual_affine_and_batched_form_agrees():
    b = tiny()
    lens = random_lens(b)
    H = torch.randn(b.n_layers, 5, b.d_model)
    batched = lens.translate_all(H)
    for layer in range(b.n_layers):
        expect = H[layer] + H[layer] @ lens.weight[layer].T + lens.bias[layer]
        torch.testing.assert_close(lens.translate(layer, H[layer]), expect)
        torch.testing.assert_close(batched[layer], expect, rtol=1e-5, atol=1e-6)
    with pytest.raises(BadInput):
        lens.translate(b.n_layers, H[0])


@pytest.mark.parametrize("family", ["llama_tied", "gemma2", "opt_project"])
def test_chunked_kl_and_ce_and_their_gradients_equal_autograd(family):
    """The analytic, token-chunked loss/gradient equals a dense autograd reference (softcap, project_out)."""
    b = tiny(family)
    lens = random_lens(b)
    ids = rows_for(b, 2, 9)
    L, N = b.n_layers, ids.numel()
    with torch.no_grad():
        resid, logits = b.residual_stream(ids)
    H = resid[:L].reshape(L, N, -1).float()
    flp = torch.log_softmax(logits.reshape(N, -1).float(), -1)
    lq = torch.log_softmax(b.unembedding(lens.translate_all(H)).float(), -1)
    kl_ref = (flp.exp() * (flp - lq)).sum(-1).mean(-1)
    gW, gb = torch.autograd.grad(kl_ref.sum(), [lens.weight, lens.bias], retain_graph=True)
    U = b.unembedding.float32()
    X = U.normed(lens.translate_all(H), torch.float32)
    res = linear_kl(X.detach(), U.weight, logits.reshape(N, -1), **U.head_kwargs(), grad_scale=1.0 / N, chunk_rows=5)
    losses = res.loss
    X.backward(res.grad)
    torch.testing.assert_close(losses.float() / N, kl_ref.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lens.weight.grad, gW, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(lens.bias.grad, gb, rtol=1e-4, atol=1e-7)
    # cross-entropy to the next token, last position of each row excluded
    lens.weight.grad = lens.bias.grad = None
    tg = torch.zeros_like(ids)
    tg[:, :-1] = ids[:, 1:]
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, -1] = False
    lq4 = lq.view(L, 2, 9, -1)[:, :, :-1]
    ce_ref = -lq4.gather(3, ids[:, 1:].view(1, 2, 8, 1).expand(L, 2, 8, 1)).mean((1, 2, 3))
    gW, gb = torch.autograd.grad(ce_ref.sum(), [lens.weight, lens.bias])
    X = U.normed(lens.translate_all(H), torch.float32)
    res = linear_kl(X.detach(), U.weight, targets=tg.reshape(-1), valid=valid.reshape(-1), **U.head_kwargs(),
                    grad_scale=1.0 / 16, chunk_rows=3)
    losses = res.loss
    X.backward(res.grad)
    torch.testing.assert_close(losses.float() / 16, ce_ref.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lens.weight.grad, gW, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------ training
SMALL = TrainSettings(steps=6, tokens_per_step=32, seq_len=16, chunk_rows=64)


def test_training_lowers_kl_below_the_logit_lens_at_every_layer():
    b = tiny("llama")
    rows = rows_for(b, 24, 16)
    res = train(b, rows[:20], TrainSettings(steps=40, tokens_per_step=64, seq_len=16, chunk_rows=64))
    assert res.history[-1].loss < res.history[0].loss
    ev = evaluate(b, res.lens, rows[20:])
    for layer in range(b.n_layers):
        assert ev.tuned_kl[layer] < ev.logit_kl[layer]
    assert ev.tuned_kl[-1] == 0.0 and ev.logit_top1[-1] == 1.0
    assert ev.to_dict()["tuned_below_logit_every_layer"] is True


def test_evaluate_matches_the_logit_lens_per_position():
    """Per-layer KL and entropy of ``evaluate`` are the means of logit_lens's per-position values."""
    b = tiny("gemma2")
    rows = rows_for(b, 2, 10)
    lens = random_lens(b, 0.1)
    ev = evaluate(b, lens, rows)
    for kind, tr in (("logit", None), ("tuned", lens)):
        kl = torch.zeros(b.n_layers + 1)
        ent = torch.zeros(b.n_layers + 1)
        for r in rows:
            res = logit_lens(b, r, positions="all", k=1, translator=tr)
            kl += torch.stack([ly.kl_to_final.sum() for ly in res.layers])
            ent += torch.stack([ly.entropy.sum() for ly in res.layers])
        torch.testing.assert_close(torch.tensor(getattr(ev, f"{kind}_kl")).float(), kl / rows.numel(),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(getattr(ev, f"{kind}_entropy")).float(), ent / rows.numel(),
                                   rtol=1e-4, atol=1e-5)
    ev_b = evaluate(b, lens, rows, n_bytes=100)
    assert ev_b.tuned_bpb[0] == pytest.approx(ev_b.tuned_ce[0] * ev_b.ce_tokens / 100 / math.log(2))
    # layer L (read off the model's own logits) is the model's cross-entropy on the next token
    with torch.no_grad():
        ce = sum(torch.nn.functional.cross_entropy(b.model(r[None]).logits[0, :-1].double(), r[1:], reduction="sum")
                 for r in rows) / ev.ce_tokens
    assert ev.logit_ce[-1] == ev.tuned_ce[-1] == pytest.approx(float(ce), rel=1e-5)
    assert ev.logit_top1[-1] == 1.0 and ev.logit_kl[-1] == 0.0


def test_training_is_deterministic_for_a_seed_and_the_seed_matters():
    b = tiny()
    rows = rows_for(b, 8, 16)
    a = train(b, rows, SMALL).lens
    c = train(b, rows, SMALL).lens
    d = train(b, rows, TrainSettings(**{**SMALL.__dict__, "seed": 1})).lens
    assert torch.equal(a.weight, c.weight) and torch.equal(a.bias, c.bias)
    assert not torch.equal(a.weight, d.weight)


def test_resume_is_exact(tmp_path):
    b = tiny()
    rows = rows_for(b, 8, 16)
    full = train(b, rows, SMALL).lens

    def stop_at_3(info):
        if info.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(b, rows, SMALL, checkpoint_dir=tmp_path, checkpoint_every=3, on_step=stop_at_3)
    _, meta = load_checkpoint(tmp_path)
    assert meta["step"] == 3
    partial = lens_from_checkpoint(tmp_path, b)
    assert partial.settings["stopped_at_step"] == 3 and partial.settings["tokens"] == 3 * 32
    res = train(b, rows, SMALL, checkpoint_dir=tmp_path, checkpoint_every=3, resume=True)
    assert res.resumed_from == 3 and len(res.history) == SMALL.steps
    assert torch.equal(res.lens.weight, full.weight) and torch.equal(res.lens.bias, full.bias)
    with pytest.raises(CheckpointMismatch):  # other settings
        train(b, rows, TrainSettings(**{**SMALL.__dict__, "steps": 9}), checkpoint_dir=tmp_path, resume=True)


def test_nan_stops_training_names_the_layer_and_keeps_the_last_good_checkpoint(tmp_path):
    b = tiny()
    rows = rows_for(b, 8, 16)
    lens = TunedLens.for_model(b)

    def poison(info):
        if info.step == 2:
            with torch.no_grad():
                lens.weight[1, 0, 0] = float("nan")

    with pytest.raises(TrainingDiverged, match="layer 1"):
        train(b, rows, SMALL, lens=lens, checkpoint_dir=tmp_path, checkpoint_every=2, on_step=poison)
    tensors, meta = load_checkpoint(tmp_path)
    assert meta["step"] == 2
    assert torch.isfinite(tensors["weight"]).all()


def test_bad_settings_and_rows():
    b = tiny()
    with pytest.raises(BadInput, match="`steps`"):
        train(b, rows_for(b, 4, 16), TrainSettings(steps=0, seq_len=16))
    with pytest.raises(BadInput):
        train(b, rows_for(b, 4, 8), SMALL)  # rows are not seq_len wide
    with pytest.raises(BadInput):
        TrainSettings(loss="mse").validate()


def test_ce_loss_and_bf16_gemms_train():
    b = tiny("qwen2")
    rows = rows_for(b, 8, 16)
    for s in (TrainSettings(**{**SMALL.__dict__, "loss": "ce"}),
              TrainSettings(**{**SMALL.__dict__, "gemm_dtype": "bfloat16"})):
        res = train(b, rows, s)
        assert all(math.isfinite(h.loss) for h in res.history)
        assert res.lens.weight.abs().sum() > 0


def test_regression_init_is_never_worse_than_the_logit_lens_on_its_calibration_rows():
    b = tiny("llama")
    rows = rows_for(b, 10, 16)
    lens, alphas = regression_init(b, rows[:8], calib=rows[8:])
    assert len(alphas) == b.n_layers
    ev = evaluate(b, lens, rows[8:])
    for layer in range(b.n_layers):
        assert ev.tuned_kl[layer] <= ev.logit_kl[layer] + 1e-6


def test_data_parallel_two_processes_equal_one_process(tmp_path):
    """torchrun with 2 gloo processes computes the same update as one process on the same batch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS), str(Path(__file__).parent)]),
           "OMP_NUM_THREADS": "1"}
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
           str(TESTS / "tuned_dist_worker.py"), str(tmp_path / "dist.pt")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = torch.load(tmp_path / "dist.pt", weights_only=True)
    b = tiny()
    ref = train(b, rows_for(b, 8, 16), SMALL).lens
    torch.testing.assert_close(got["weight"], ref.weight.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got["bias"], ref.bias.detach(), rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ files
def test_save_load_roundtrip_atomic_and_no_overwrite(tmp_path):
    b = tiny()
    lens = random_lens(b)
    lens.settings = {"steps": 3}
    lens.save(tmp_path / "l")
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == ["config.json", "lens.safetensors"]
    back = TunedLens.load(tmp_path / "l", b)
    assert torch.equal(back.weight, lens.weight) and torch.equal(back.bias, lens.bias)
    cfg = json.loads((tmp_path / "l" / "config.json").read_text())
    assert cfg["d_model"] == b.d_model and cfg["n_layers"] == b.n_layers
    assert cfg["model"]["unembed_sha256"] == model_identity(b)["unembed_sha256"]
    assert cfg["training"] == {"steps": 3} and cfg["vocablens_version"]
    with pytest.raises(OutputExists):
        lens.save(tmp_path / "l")
    lens.save(tmp_path / "h", dtype=torch.bfloat16)
    half = TunedLens.load(tmp_path / "h", b)
    torch.testing.assert_close(half.weight, lens.weight, rtol=1e-2, atol=1e-3)


def test_a_lens_of_another_model_is_refused(tmp_path):
    b = tiny("llama")
    random_lens(b).save(tmp_path / "l")
    with pytest.raises(CheckpointMismatch, match="another model"):
        TunedLens.load(tmp_path / "l", tiny("llama", seed=5))  # same shapes, other weights
    with pytest.raises(CheckpointMismatch):
        TunedLens.load(tmp_path / "l", tiny("gpt2"))  # other shapes? same d, L: caught by the hash


def test_truncated_files_are_clear_errors(tmp_path):
    b = tiny()
    random_lens(b).save(tmp_path / "l")
    p = tmp_path / "l" / "lens.safetensors"
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(CorruptModelFile, match="truncated"):
        TunedLens.load(tmp_path / "l", b)
    train(b, rows_for(b, 8, 16), SMALL, checkpoint_dir=tmp_path / "c", checkpoint_every=2)
    c = tmp_path / "c" / "checkpoint.safetensors"
    c.write_bytes(c.read_bytes()[:-100])
    with pytest.raises(CorruptModelFile):
        load_checkpoint(tmp_path / "c")
    with pytest.raises(BadInput):
        TunedLens.load(tmp_path / "nothing-here")


def test_reads_a_lens_saved_by_the_tuned_lens_library(tmp_path):
    """Fixture in the tuned-lens layout: params.pt = state dict of layer_translators ({i}.weight/bias)."""
    b = tiny("llama")
    d, L = b.d_model, b.n_layers
    g = torch.Generator().manual_seed(7)
    state = {}
    for i in range(L):
        state[f"{i}.weight"] = 0.01 * torch.randn(d, d, generator=g)
        state[f"{i}.bias"] = 0.01 * torch.randn(d, generator=g)
    (tmp_path / "tl").mkdir()
    torch.save(state, tmp_path / "tl" / "params.pt")
    (tmp_path / "tl" / "config.json").write_text(json.dumps({
        "base_model_name_or_path": "tiny-llama", "d_model": d, "num_hidden_layers": L, "bias": True,
        "base_model_revision": None, "unembed_hash": "abc", "lens_type": "linear_tuned_lens"}))
    with pytest.raises(CheckpointMismatch, match="tuned-lens unembedding hash abc"):  # not this model's head
        TunedLens.load(tmp_path / "tl", b)
    from vocablens.lens.identity import tuned_lens_unembed_hash

    cfg = json.loads((tmp_path / "tl" / "config.json").read_text())
    (tmp_path / "tl" / "config.json").write_text(json.dumps({**cfg, "unembed_hash": tuned_lens_unembed_hash(b)}))
    lens = TunedLens.load(tmp_path / "tl", b)
    h = torch.randn(3, d)
    for i in range(L):
        expect = h + torch.nn.functional.linear(h, state[f"{i}.weight"], state[f"{i}.bias"])
        torch.testing.assert_close(lens.translate(i, h), expect)
    bad = dict(state)
    bad["0.weight"] = torch.zeros(d, d + 1)
    torch.save(bad, tmp_path / "tl" / "params.pt")
    with pytest.raises(CorruptModelFile):
        TunedLens.load(tmp_path / "tl", b)


# ------------------------------------------------------------------ rendering
def test_report_section_and_plots(tmp_path):
    from vocablens.render.html import Section
    from vocablens.render.lens_eval import save_eval_plot
    from vocablens.render.tuned import tuned_lens_section

    b = tiny("llama")

    class Tok:
        def convert_ids_to_tokens(self, i):
            return f"t{i}"

        def decode(self, ids, **kw):
            return "".join(f"t{i}" for i in ids)

    lens = random_lens(b)
    ids = rows_for(b, 1, 8)[0]
    lo, tu = lens_pair(b, ids, lens, max_positions=6)
    assert lo.positions.tolist() == [2, 3, 4, 5, 6, 7] and tu.kind == "tuned"
    sec = tuned_lens_section(lo, tu, Tok(), lens.info(), eval_result=evaluate(b, lens, rows_for(b, 1, 8)))
    assert isinstance(sec, Section) and sec.id == "tuned-lens"
    assert sec.html.count('class="figure"') == 4
    with pytest.raises(CheckpointMismatch):
        lens_pair(tiny("llama", seed=9), ids, lens)
    with pytest.raises(BadInput, match="colour"):
        tuned_lens_section(lo, tu, Tok(), colours=("hue",))
    ev = evaluate(b, lens, rows_for(b, 1, 8))
    assert save_eval_plot(ev, tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    assert "plotly" in save_eval_plot(ev, tmp_path / "e.html").read_text()[:100000].lower()


# ------------------------------------------------------------------ CLI
def test_cli_bad_input_exits_2_before_loading_a_model(tmp_path, capsys):
    from vocablens.cli.common import run_app

    assert run_app(["lens", "train", "--steps", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--steps" in capsys.readouterr().err
    assert run_app(["lens", "train", "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_app(["lens", "train", "--corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "no text" in capsys.readouterr().err
    b = tiny()
    random_lens(b).save(tmp_path / "have")
    assert run_app(["lens", "train", "--out", str(tmp_path / "have")]) == 2
    assert "--force" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert run_app(["lens", "some text", "--lens", str(tmp_path / "have")]) == 2  # --kind logit reads no lens
    assert "--kind tuned" in capsys.readouterr().err
    assert run_app(["lens", "some text", "--kind", "tuned", "--lens", str(tmp_path)]) == 2
    assert "lens directory" in capsys.readouterr().err
    assert run_app(["lens", "eval", "--lens", str(tmp_path / "missing")]) == 2
    assert "lens directory" in capsys.readouterr().err


def test_lens_help_lists_the_lens_options_and_the_subcommands(capsys):
    from vocablens.cli.common import run_app

    assert run_app(["lens", "--help"]) == 0
    text = capsys.readouterr().out
    for opt in ("--top-k", "--positions", "--layers", "--kind", "--lens", "--chat", "--json", "train", "eval"):
        assert opt in text, opt
    assert "0..L" in text


# ------------------------------------------------------------------ corpora (issue 11 §2, issue 15)
NOTES = "\n\n".join(f"Note {i}. " + " ".join(f"word{(i * 7 + j) % 50}" for j in range(60)) for i in range(40))


def test_one_long_text_is_split_into_documents_and_recorded_without_its_path(tmp_path):
    from vocablens.corpus import corpus_record, load_documents, split_documents, split_text

    (tmp_path / "my_notes.txt").write_text(NOTES)
    docs = load_documents(tmp_path / "my_notes.txt")
    assert len(docs) == len(NOTES) // 2000 or len(docs) == len(NOTES) // 2000 + 1
    assert len(docs) >= 5 and [d.name for d in docs] == [f"my_notes.txt#{i + 1}" for i in range(len(docs))]
    # nothing lost, nothing reordered, cut at paragraph boundaries
    assert "\n\n".join(d.text for d in docs) == NOTES
    assert all(len(d.text) >= 2000 for d in docs[:-1])
    train_docs, val_docs = split_documents(docs, 0.1, 0)
    assert train_docs and val_docs
    rec = corpus_record(tmp_path / "my_notes.txt", docs)
    assert rec["corpus"] == "my_notes.txt" and str(tmp_path) not in json.dumps(rec)
    # the same text elsewhere hashes the same; other text does not
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "my_notes.txt").write_text(NOTES)
    assert corpus_record(tmp_path / "b" / "my_notes.txt", load_documents(tmp_path / "b" / "my_notes.txt")) == rec
    assert corpus_record("x", docs[:-1])["corpus_sha256"] != rec["corpus_sha256"]
    short = split_text(docs[0].__class__("s", "one paragraph"))
    assert [d.text for d in short] == ["one paragraph"]
    one_line = split_text(docs[0].__class__("l", "x" * 9000))  # no paragraph, no line, no space: hard cuts
    assert "".join(d.text for d in one_line) == "x" * 9000 and len(one_line) == 5


def test_the_split_does_not_depend_on_where_the_corpus_lies(tmp_path):
    """CI failed once: document names held the corpus's absolute path, so a one-document notes file
    fell into validation (no train documents) in about 1 of 10 temporary directories."""
    from vocablens.corpus import load_documents, split_documents

    one = "The class statement defines a new type. An object is an instance of that type.\n" * 12
    splits = set()
    for i in range(40):  # 40 places: P(all of them agree by chance) under path-salted hashing ~ 0.9**40
        d = tmp_path / f"place{i}" / "deeper"
        (d / "sub").mkdir(parents=True)
        (d / "notes.txt").write_text(one)
        (d / "sub" / "a.md").write_text("alpha text")
        (d / "sub" / "b.txt").write_text("beta text")
        (d / "c.jsonl").write_text('{"text": "gamma"}\n"delta"\n')
        file_split = split_documents(load_documents(d / "notes.txt"), 0.1, 0)
        assert [x.name for x in file_split[0]] == ["notes.txt"] and file_split[1] == []
        docs = load_documents(d)
        assert [x.name for x in docs] == ["c.jsonl#1", "c.jsonl#2", "notes.txt", "sub/a.md", "sub/b.txt"]
        train_docs, val_docs = split_documents(docs, 0.3, 0)
        splits.add((tuple(x.name for x in train_docs), tuple(x.name for x in val_docs)))
    assert len(splits) == 1
    stdlib = load_documents("cpython-stdlib", max_docs=3)
    assert all(x.name.startswith("stdlib/") and x.name.endswith(".py") and "/" not in x.name[7:] for x in stdlib)


def test_find_lens_is_the_one_way_to_find_a_lens(tmp_path):
    assert find_lens("smollm2") == shipped_lens_path("smollm2")
    with pytest.raises(BadInput, match="no tuned lens shipped"):
        find_lens("other-model")
    with pytest.raises(BadInput, match="lens directory"):
        find_lens("smollm2", tmp_path)
    b = tiny()
    random_lens(b).save(tmp_path / "l")
    assert find_lens("anything", tmp_path / "l") == tmp_path / "l"
    assert find_lens("anything", tmp_path / "l" / "config.json") == tmp_path / "l"


def test_shipped_config_records_no_local_path():
    cfg = (shipped_lens_path("smollm2") / "config.json").read_text()
    for root in ("/work", "/home", "/root", "/tmp", "/usr"):
        assert root not in cfg
    data = json.loads(cfg)["training"]["data"]
    assert data["corpus"] == "mix" and len(data["corpus_sha256"]) == 64


# ------------------------------------------------------------------ the shipped lens on the real model
# Written for this test (never seen in training): prose in the training corpus's domain (Python docs).
HELD_OUT = (
    "A list comprehension builds a new list by applying an expression to each item of an iterable, "
    "optionally keeping only the items for which a condition is true. The result is usually shorter and "
    "faster than the equivalent loop that appends to a list. When the expression has side effects, or "
    "when the loop body needs several statements, an ordinary for statement is clearer. Generator "
    "expressions use the same syntax with parentheses instead of brackets; they produce items lazily, "
    "one at a time, so they can process sequences that do not fit in memory. The built-in functions "
    "sum, any and all accept a generator expression directly, without extra parentheses."
)


@pytest.mark.slow
def test_shipped_lens_beats_the_logit_lens_at_every_layer_via_cli(smollm2, monkeypatch, capsys, tmp_path):
    """`vocablens lens eval` on held-out text (written for this test, never trained on): tuned KL <
    logit KL at every layer 0..L-1."""
    import vocablens.cli.tuned as cli_tuned
    from vocablens.cli.common import run_app

    assert shipped_lens_path("smollm2") is not None
    (tmp_path / "heldout.txt").write_text(HELD_OUT)
    monkeypatch.setattr(cli_tuned, "load_model", lambda *a, **k: smollm2)
    assert run_app(["lens", "eval", "--corpus", str(tmp_path / "heldout.txt"), "--split", "all",
                    "--max-tokens", "96", "--seq-len", "96", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_layers"] == 30 and d["tokens"] == 96
    for row in d["layers"][:30]:
        assert row["tuned"]["kl"] < row["logit"]["kl"], row
    assert d["tuned_below_logit_every_layer"] is True
    assert d["layers"][30]["tuned"]["kl"] == 0.0


@pytest.mark.slow
def test_lens_eval_on_a_one_file_corpus_and_no_unasked_path(smollm2, monkeypatch, capsys, tmp_path):
    """`vocablens lens eval --corpus my_notes.txt` (one long text) scores its held-out part; no output
    names a path the user did not give (the shipped lens's directory, the training machine's corpus)."""
    import vocablens.cli.tuned as cli_tuned
    from vocablens.cli.common import run_app

    (tmp_path / "my_notes.txt").write_text(NOTES)
    monkeypatch.setattr(cli_tuned, "load_model", lambda *a, **k: smollm2)
    assert run_app(["lens", "eval", "--corpus", str(tmp_path / "my_notes.txt"), "--max-tokens", "64",
                    "--seq-len", "64", "--json"]) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert d["tokens"] == 64 and d["data"]["split"] == "validation" and d["data"]["corpus"] == "my_notes.txt"
    assert d["lens"] == "shipped for smollm2" and cap.err == ""
    assert str(shipped_lens_path("smollm2")) not in cap.out
    assert run_app(["lens", "eval", "--max-tokens", "32", "--seq-len", "32"]) == 0  # trained-on corpus absent
    cap = capsys.readouterr()
    assert "'mix'" in cap.err and "/work" not in cap.err + cap.out and "site-packages" not in cap.out


@pytest.mark.slow
def test_lens_show_kind_both_on_the_real_model(smollm2, monkeypatch, capsys):
    import vocablens.cli.core as cli_core
    from vocablens.cli.common import run_app

    monkeypatch.setattr(cli_core, "load_model", lambda *a, **k: smollm2)
    assert run_app(["lens", "The capital of France is", "--kind", "both", "--json", "-k", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "both" and d["logit"]["kind"] == "logit" and d["tuned"]["kind"] == "tuned"
    lo, tu = d["logit"]["layers"], d["tuned"]["layers"]
    lo, tu = [[ly["positions"][0] for ly in x] for x in (lo, tu)]  # one position read: one entry each
    assert lo[30]["top_ids"] == tu[30]["top_ids"]  # layer L is the model itself for both
    assert tu[5]["kl_to_final"] < lo[5]["kl_to_final"]
    assert run_app(["lens", "x", "--kind", "nope"]) == 2
