"""Damaged files on every reader path: one line naming the file and what to do, exit 2, no traceback.

Reader paths: the full load (``score``, ``lens``, ``anatomy --load``), the borders-only load
(``neighbors``, ``argmax``: models/files/partial.py), the config-only path (``anatomy``), GGUF files, the
GGUF cache, tuned-lens directories, and an ``expand`` output read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tiny_dirs import run_cli as _run
from tiny_dirs import save_tiny, save_tiny_gguf, tiny_tokenizer


def _cut(p: Path, keep: float | int) -> None:
    b = p.read_bytes()
    p.write_bytes(b[: int(len(b) * keep) if isinstance(keep, float) else keep])


def _json_edit(p: Path, **kw) -> None:
    p.write_text(json.dumps({**json.loads(p.read_text()), **kw}))


def _shard(d: Path) -> None:
    """Split the index over two shards and lose the second (an interrupted download)."""
    from safetensors import safe_open

    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    with safe_open(str(d / "model-00001-of-00002.safetensors"), framework="pt") as h:
        keys = list(h.keys())
    wm = {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(keys)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


#: damage name -> (how to damage a copy of the model directory, words the error line must hold)
DAMAGE = {
    "truncated-weights": (lambda d: _cut(d / "model.safetensors", 0.5), ["model.safetensors", "download it again"]),
    "truncated-header": (lambda d: _cut(d / "model.safetensors", 20), ["model.safetensors", "download it again"]),
    "missing-shard": (_shard, ["model-00002-of-00002.safetensors", "download"]),
    "tokenizer-not-json": (lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "trunc'),
                           ["tokenizer.json", "not valid JSON"]),
    "config-not-json": (lambda d: (d / "config.json").write_text("{"), ["config.json"]),
    "config-sizes-disagree": (lambda d: _json_edit(d / "config.json", hidden_size=128),
                              ["the config and the weights disagree"]),
    # `{}` as config.json gave transformers' cut-off "Couldn't instantiate the backend tokenizer from one of:"
    "config-empty": (lambda d: (d / "config.json").write_text("{}"), ["config.json", "model_type"]),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), ["no", "weights"]),
    "no-tokenizer": (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")
                                if (d / n).exists()], ["tokenizer"]),
}
#: command -> argv before ``-m DIR``
COMMANDS = {
    "score": ["score", "hello world"],
    "lens": ["lens", "hello world"],
    "anatomy-load": ["anatomy", "--load"],
    "neighbors": ["neighbors", " the"],
    "argmax": ["argmax", "--budget", "5"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupt")
    tok = tiny_tokenizer()
    save_tiny(root / "good", tok)
    for name, (damage, _) in DAMAGE.items():
        shutil.copytree(root / "good", root / name)
        damage(root / name)
    gguf = save_tiny_gguf(root / "tiny.gguf", tok)
    for name, keep in (("half.gguf", 0.5), ("head.gguf", 3000), ("stub.gguf", 100)):
        shutil.copy(gguf, root / name)
        _cut(root / name, keep)
    return root


def _one_error_line(code: int, out: str, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and out == "", (code, out, err)
    return lines[0]


#: every damage on the full load (score) and the borders-only load (neighbors); the cut-short
#: weights also on lens, anatomy --load and argmax
PAIRS = [(d, c) for d in DAMAGE for c in ("score", "neighbors")] + [
    ("truncated-weights", c) for c in ("lens", "anatomy-load", "argmax")] + [("missing-shard", "argmax")]


@pytest.mark.parametrize("damage, command", PAIRS)
def test_damaged_model_directory(files, capsys, damage, command):
    line = _one_error_line(*_run(capsys, *COMMANDS[command], "-m", files / damage))
    for words in DAMAGE[damage][1]:
        assert words in line, line


@pytest.mark.parametrize("name, argv", [("half.gguf", ["anatomy"]), ("head.gguf", ["anatomy"]),
                                        ("stub.gguf", ["anatomy"]), ("half.gguf", ["score", "hello"]),
                                        ("head.gguf", ["neighbors", " the"])])
def test_truncated_gguf(files, capsys, monkeypatch, tmp_path, name, argv):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    line = _one_error_line(*_run(capsys, *argv, "-m", files / name))
    assert str(files / name) in line and "truncated" in line and "download it again" in line, line
    assert not list((tmp_path / "cache").rglob("*.safetensors"))  # nothing cached from a broken file


def test_anatomy_config_only_ignores_a_broken_tokenizer(files, capsys):
    """The config-only path reads no tokenizer: a broken tokenizer.json leaves its answer correct."""
    code, out, err = _run(capsys, "anatomy", "-m", files / "tokenizer-not-json", "--json")
    good = _run(capsys, "anatomy", "-m", files / "good", "--json")
    assert code == 0 and json.loads(out)["models"][0]["params_total"] == json.loads(good[1])["models"][0]["params_total"]


# ------------------------------------------------------------------------------------ GGUF cache
def test_gguf_cache_damaged_or_incomplete_entry_is_not_used(files, monkeypatch, tmp_path):
    from vocablens.models import load
    from vocablens.models.files.gguf_cache import CACHE_MARK, cache_dir
    from vocablens.models.files.partial import load_borders_only

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    gguf = files / "tiny.gguf"
    ref = load(str(gguf)).borders.unembedding.weight.clone()
    cdir = cache_dir(gguf)
    assert (cdir / CACHE_MARK).is_file()
    # a damaged complete entry (a disk error after the write): the full load falls back to the GGUF
    # file and writes the entry again
    _cut(cdir / "model.safetensors", 0.5)
    lm = load(str(gguf))
    assert torch.equal(lm.borders.unembedding.weight, ref) and lm.provenance.loaded_from == ""
    assert torch.equal(load(str(gguf)).borders.unembedding.weight, ref)  # rewritten whole: read from the cache now
    assert load(str(gguf)).provenance.loaded_from == str(cdir)
    # ... and so does the borders-only load (it used to say "download it again" about the cache)
    _cut(cdir / "model.safetensors", 0.5)
    assert torch.equal(load_borders_only(str(gguf)).borders.unembedding.weight, ref)
    # an entry without its mark (a writer killed before the swap) is never read
    (cdir / CACHE_MARK).unlink()
    (cdir / "model.safetensors").write_bytes(b"garbage")
    lm = load(str(gguf))
    assert torch.equal(lm.borders.unembedding.weight, ref) and (cdir / CACHE_MARK).is_file()


# ------------------------------------------------------------------------------------ lens files
def _lens_dir(root: Path, name: str) -> Path:
    from vocablens.lens.tuned import TunedLens

    d = root / name
    TunedLens(64, 2).save(d, force=True)
    return d


def test_lens_files_damaged(files, capsys, tmp_path):
    from safetensors.torch import save_file

    from vocablens.lens.tuned import TunedLens

    good = files / "good"
    # the lens's weights are [1, 32, 32] while its config.json says 2 layers of width 64 (a lens
    # written without metadata in its header, as older versions did)
    bad = _lens_dir(tmp_path, "mismatch")
    save_file({"weight": torch.zeros(1, 32, 32), "bias": torch.zeros(1, 32)}, str(bad / "lens.safetensors"))
    line = _one_error_line(*_run(capsys, "lens", "x", "-m", good, "--kind", "tuned", "--lens", bad))
    assert str(bad / "lens.safetensors") in line and "[2, 64, 64]" in line
    # a truncated lens file, on `lens` and on `lens eval`
    cut = _lens_dir(tmp_path, "truncated")
    _cut(cut / "lens.safetensors", 0.6)
    for argv in (["lens", "x", "--kind", "tuned"], ["lens", "eval", "--corpus", "pydoc-topics", "--max-tokens", "64",
                                                    "--seq-len", "32"]):
        line = _one_error_line(*_run(capsys, *argv, "-m", good, "--lens", cut))
        assert str(cut / "lens.safetensors") in line and "truncated" in line and "again" in line, line
    # a config.json that is not JSON beside a lens file without header metadata
    nojson = _lens_dir(tmp_path, "nojson")
    save_file({"weight": torch.zeros(2, 64, 64), "bias": torch.zeros(2, 64)}, str(nojson / "lens.safetensors"))
    (nojson / "config.json").write_text('{"format": "vocablens-tuned')
    line = _one_error_line(*_run(capsys, "lens", "x", "-m", good, "--kind", "tuned", "--lens", nojson))
    assert str(nojson / "config.json") in line and "not valid JSON" in line
    # a good lens still loads (the header metadata wins over a stale config.json)
    ok = _lens_dir(tmp_path, "ok")
    (ok / "config.json").write_text("{}")
    assert TunedLens.load(ok).n_layers == 2


def test_expand_output_read_back_truncated(files, capsys, tmp_path):
    """An edited model directory whose weights were cut short afterwards (a copy interrupted)."""
    out = tmp_path / "expanded"
    code, _, err = _run(capsys, "expand", "-m", files / "good", "--add", " zzq", "--out", out,
                        "--eval-text", "The class statement defines a new type.", "--json")
    assert code == 0, err
    assert _run(capsys, "score", "hello", "-m", out)[0] == 0
    _cut(out / "model.safetensors", 0.7)
    for argv in (["score", "hello"], ["neighbors", " zzq"]):
        line = _one_error_line(*_run(capsys, *argv, "-m", out))
        assert str(out / "model.safetensors") in line and "again" in line, line


def test_gguf_cache_key_follows_content_not_location(tmp_path, monkeypatch):
    """The same GGUF file elsewhere (a fresh virtual environment, a copy with a new mtime) maps to the
    same cache entry; one changed byte of tensor data maps to another. Before, the key held the path
    and mtime, so each new environment converted again and left a second 0.5 GB entry."""
    import shutil

    from tiny_dirs import save_tiny_gguf, tiny_tokenizer
    from vocablens.models.files.gguf_cache import cache_dir

    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    a = save_tiny_gguf(tmp_path / "a" / "tiny.gguf", tiny_tokenizer())
    (tmp_path / "b").mkdir()
    b = tmp_path / "b" / "tiny.gguf"
    shutil.copyfile(a, b)  # a new path and a new mtime
    assert cache_dir(a) == cache_dir(b)
    data = bytearray(b.read_bytes())
    data[len(data) // 2] ^= 0xFF
    b.write_bytes(bytes(data))
    assert cache_dir(a) != cache_dir(b)
