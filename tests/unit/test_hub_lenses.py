"""Published lenses fetched from a hub: a local stand-in (tests/hub_stub.py, ``HF_ENDPOINT``) serves a
Jacobian lens in neuronpedia/jacobian-lens's layout and a tuned lens in tuned-lens's Space layout; they are
downloaded at the resolved commit, cached, pinned in the provenance and read (the matrices equal the file's),
the short forms find them by the model's hub id, and offline the cache serves them. Missing files, revisions,
repositories and an unreachable hub are one line (exit 2). Never the real hub.

huggingface_hub reads ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` when imported (and tests/conftest.py sets
``HF_HUB_OFFLINE=1``), so each case runs in a subprocess with its own environment."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

import reference_lens_files as ref
from hub_stub import StubHub

HUB_ID = "EleutherAI/pythia-70m-deduped"
JPATH = "pythia-70m-deduped/jlens/Salesforce-wikitext/pythia-70m-deduped_jacobian_lens.pt"
SHA = "5e" * 20


def _model_dir(tmp: Path) -> tuple[Path, int, int]:
    """A tiny llama saved as a model the collections list: its config names the hub id."""
    from tiny_dirs import save_tiny, tiny_tokenizer

    d = save_tiny(tmp / "pythia-70m-deduped", tiny_tokenizer())
    cfg = json.loads((d / "config.json").read_text())
    cfg["_name_or_path"] = HUB_ID
    (d / "config.json").write_text(json.dumps(cfg))
    return d, int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])


def _repos(tmp: Path, model_dir: Path, L: int, d: int) -> tuple[dict, dict[int, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    from vocablens.models import Borders

    g = torch.Generator().manual_seed(0)
    J = {blk: torch.randn(d, d, generator=g) for blk in range(L - 1)}
    buf = io.BytesIO()
    torch.save({"J": J, "n_prompts": 7, "source_layers": sorted(J), "d_model": d,
                "metadata": {"model_name": HUB_ID, "target_layer": L - 1}}, buf)
    b = Borders.from_model(AutoModelForCausalLM.from_pretrained(model_dir))
    ref.save_tuned_lens(tmp / "tl", d, L, HUB_ID, None, ref.tensor_hash(b.unembedding.weight))
    tuned = {f"lens/{HUB_ID}/{f.name}": f.read_bytes() for f in (tmp / "tl").iterdir()}
    repos = {("model", "neuronpedia/jacobian-lens"): {JPATH: buf.getvalue(), "README.md": b"lenses"},
             ("space", "AlignmentResearch/tuned-lens"): {**tuned, "app.py": b""}}
    return repos, J


def _run(env_extra: dict, home: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HUB_CACHE")}
    env.update(HF_HOME=str(home), PYTHONPATH=os.pathsep.join(sys.path), **env_extra)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "vocablens", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


SCRIPT = """
import json, sys, vocablens
from vocablens.errors import VocabLensError
m = vocablens.load(sys.argv[1])
out = {}
j = m.load_jacobian_lens("neuronpedia/jacobian-lens/%(jpath)s@main")
out["explicit"] = j.info() | {"J": j.J.tolist(), "layers": j.layers}
out["short"] = m.load_jacobian_lens("jacobian:published").info()
out["tuned"] = m.load_lens("tuned:published").info()
out["errors"] = []
for spec in ["neuronpedia/jacobian-lens/nope.pt", "neuronpedia/jacobian-lens/%(jpath)s@v9", "nobody/none/x.pt"]:
    try:
        m.load_jacobian_lens(spec)
    except VocabLensError as exc:
        out["errors"].append(str(exc))
print(json.dumps(out, default=str))
""" % {"jpath": JPATH}


def test_hub_lenses_downloaded_pinned_cached_and_read(tmp_path, monkeypatch, capsys):
    model_dir, L, d = _model_dir(tmp_path)
    repos, J = _repos(tmp_path, model_dir, L, d)
    home = tmp_path / "hf"
    with StubHub(repos, sha=SHA) as hub:
        r = _run({"HF_ENDPOINT": hub.endpoint}, home, code=SCRIPT.replace("sys.argv[1]", repr(str(model_dir))))
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        # the explicit spec: the file's matrices, block l as stream layer l+1, pinned at the resolved commit
        ex = out["explicit"]
        assert ex["hub"] == {"repo": "neuronpedia/jacobian-lens", "repo_type": "model", "revision": SHA, "path": JPATH}
        assert ex["layers"] == list(range(1, L)) and ex["n_prompts"] == 7
        assert torch.equal(torch.tensor(ex["J"]), torch.stack([J[b] for b in range(L - 1)]))
        assert ex["verified"] == "verified: model name"
        # the short forms: found by the model's hub id in each collection
        assert out["short"]["hub"] == ex["hub"]
        assert out["tuned"]["hub"] == {"repo": "AlignmentResearch/tuned-lens", "repo_type": "space", "revision": SHA,
                                       "path": f"lens/{HUB_ID}"}
        assert out["tuned"]["verified"] == "verified: model name, tuned-lens unembedding hash"
        e_file, e_rev, e_repo = out["errors"]
        assert e_file.endswith(f"neuronpedia/jacobian-lens at {SHA[:12]} holds no 'nope.pt'")
        assert "has no revision 'v9'" in e_rev and "no hub repository 'nobody/none'" in e_repo
        gets = [p for (m, p, _) in hub.requests if m == "GET" and "/resolve/" in p]
        assert all(f"/resolve/{SHA}/" in p for p in gets)  # every file downloaded at the pinned commit
    # offline (in this process: conftest's HF_HUB_OFFLINE=1, the cache pointed at the download's):
    # the cache serves the short form through the CLI; an uncached file and an unreachable hub are one line
    import huggingface_hub.constants as hc
    from tiny_dirs import run_cli

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    code, out_, err = run_cli(capsys, "lens", "the class", "-m", model_dir, "--kind", "jacobian", "--lens",
                              "published", "--json")
    assert code == 0, err
    (rec,) = json.loads(out_)["lenses"]
    assert rec["hub"]["revision"] == SHA and rec["n_prompts"] == 7
    code, out_, err = run_cli(capsys, "lens", "x", "-m", model_dir, "--kind", "jacobian", "--lens",
                              "neuronpedia/jacobian-lens/other.pt")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not in the local cache of the Hugging Face hub and HF_HUB_OFFLINE is set" in err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hc, "ENDPOINT", closed)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    code, out_, err = run_cli(capsys, "lens", "x", "-m", model_dir, "--kind", "jacobian", "--lens",
                              "neuronpedia/jacobian-lens/other.pt")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"the hub at {closed} cannot be reached" in err


def test_short_form_names_and_specs():
    from vocablens.errors import BadInput
    from vocablens.lens.hub import hub_origin, model_hub_id, published_spec, split_hub_spec

    assert split_hub_spec("a/b/c/d.pt@v1.0") == ("a/b", "c/d.pt", "v1.0")
    assert split_hub_spec("a/b") == ("a/b", "", None)
    assert published_spec("jacobian", "openai-community/gpt2") == (
        "neuronpedia/jacobian-lens/gpt2-small/jlens/Salesforce-wikitext/gpt2_jacobian_lens.pt", "model")
    assert published_spec("tuned", "gpt2") == ("AlignmentResearch/tuned-lens/lens/gpt2", "space")
    assert model_hub_id("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    try:
        published_spec("jacobian", "smollm2")
        raise AssertionError("no lens for SmolLM2 in the collection")
    except BadInput as exc:
        assert "neuronpedia/jacobian-lens has no lens for HuggingFaceTB/SmolLM2-135M-Instruct" in str(exc)
    p = Path("/c/hub/spaces--Org--x/snapshots") / SHA / "lens" / "m"
    assert hub_origin(p) == {"repo": "Org/x", "repo_type": "space", "revision": SHA, "path": "lens/m"}
    assert hub_origin(Path("/tmp/lens.pt")) is None
