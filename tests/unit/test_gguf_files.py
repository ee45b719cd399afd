"""GGUF files read as they are (issue 43): the cache entry found by the whole content, the metadata
checked against the tensors and the token list, a tokenizer that cannot be built as one line.

Every file here is written by gguf-py's ``GGUFWriter`` (tests/tiny_dirs.py: ``save_tiny_gguf``).
Oracles: hashlib over the file's bytes; the file dequantized directly (not from a cache entry); gguf-py's own
``GGUFReader`` for where a tensor's bytes lie; the numbers the test wrote into the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tiny_dirs import run_cli, save_tiny, save_tiny_gguf, tiny_tokenizer

MIB = 1 << 20


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _json(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def _one_error_line(code: int, out: str, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and out == "", (code, out, err)
    return lines[0]


def _row_outside_samples(path: Path) -> tuple[int, int]:
    """(offset, bytes) of one row of a feed-forward tensor lying wholly outside the first, middle and
    last MiB of the file (what the cache key used to hash), found with gguf-py's reader."""
    from gguf import GGUFReader

    size = path.stat().st_size
    windows = [(0, MIB), (size // 2 - MIB // 2, size // 2 + MIB // 2), (size - MIB, size)]
    for t in GGUFReader(str(path)).tensors:
        if not t.name.startswith("blk.") or "ffn" not in t.name:
            continue
        row = int(t.shape[0]) * 4  # float32: ne[0] values per row
        for r in range(int(t.shape[1])):
            a = t.data_offset + r * row
            if all(a + row <= lo or a >= hi for lo, hi in windows):
                return a, row
    raise AssertionError("no row outside the sampled windows: make the file bigger")


def test_same_name_and_size_other_weights_is_another_cache_entry(tmp_path, cache, capsys, tok):
    """Two files with the same name and size, one feed-forward row apart outside every sampled MiB:
    each is scored with its own weights (it used to be the first file's score, from its cache)."""
    import numpy as np

    (tmp_path / "a").mkdir()
    (tmp_path / "g").mkdir()
    a = save_tiny_gguf(tmp_path / "a" / "m.gguf", tok, intermediate_size=3072)
    g = tmp_path / "g" / "m.gguf"
    shutil.copyfile(a, g)
    off, n = _row_outside_samples(g)
    data = bytearray(g.read_bytes())
    data[off:off + n] = (np.frombuffer(bytes(data[off:off + n]), dtype="<f4") * -300).astype("<f4").tobytes()
    g.write_bytes(bytes(data))
    assert g.stat().st_size == a.stat().st_size and g.read_bytes() != a.read_bytes()

    first = _json(capsys, "score", "hello world", "-m", a)
    second = _json(capsys, "score", "hello world", "-m", g)
    assert second["model"]["loaded_from"] == str(g)                 # dequantized from the file, not a's entry
    again = _json(capsys, "score", "hello world", "-m", g)
    assert again["model"]["loaded_from"] == "vocablens cache of the dequantized GGUF"
    for p, d in ((a, first), (g, second), (g, again)):
        assert d["model"]["content_sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert len(list((cache / "gguf").iterdir())) == 2
    # second was dequantized from g itself (loaded_from): the oracle for g's entry, read back as again
    assert again["total_logprob"] == pytest.approx(second["total_logprob"], abs=1e-5)
    assert abs(first["total_logprob"] - second["total_logprob"]) > 1e-3


def test_the_hash_is_reused_only_while_the_stat_is_unchanged(tmp_path, cache, monkeypatch, tok):
    """The whole file is hashed once; the stored hash stands while (device, inode, size, mtime_ns,
    ctime_ns) stand, in this process and the next; a byte changed in place with the size and mtime
    put back is hashed again (ctime moved)."""
    import vocablens.models.files.gguf_cache as G

    p = save_tiny_gguf(tmp_path / "t.gguf", tok)
    hashed = []
    real = G._sha256
    monkeypatch.setattr(G, "_sha256", lambda path: hashed.append(path) or real(path))
    h1 = G.file_identity(p)
    assert h1 == hashlib.sha256(p.read_bytes()).hexdigest() and len(hashed) == 1
    assert G.file_identity(p) == h1 and len(hashed) == 1
    G._MEMO.clear()                                                  # a new process: the stored stat answers
    assert G.file_identity(p) == h1 and len(hashed) == 1
    memo = next((cache / "hashes").iterdir())
    assert json.loads(memo.read_text())["sha256"] == h1
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[-5] ^= 0xFF
    with open(p, "r+b") as f:                                        # the same inode, the same size
        f.write(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))                 # and the old mtime
    assert (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    G._MEMO.clear()
    h2 = G.file_identity(p)
    assert h2 == hashlib.sha256(bytes(data)).hexdigest() != h1 and len(hashed) == 2


def test_metadata_vocab_size_above_the_rows_is_a_note(tmp_path, cache, capsys, tok):
    """llama.vocab_size 364 over 300 embedding rows and 300 tokens: V is 300, the tokenizer 300 tokens,
    the parameters those of 300 rows, a note names both numbers; score runs on the same weights as
    the sound file (it said "truncated ... download it again")."""
    sound = save_tiny_gguf(tmp_path / "sound.gguf", tok)
    bad = save_tiny_gguf(tmp_path / "bad.gguf", tok, meta_vocab_size=len(tok) + 64)
    ref, a = (_json(capsys, "anatomy", "-m", p)["models"][0] for p in (sound, bad))
    assert (a["vocab_size"], a["tokenizer_vocab_size"]) == (len(tok), len(tok))
    assert a["params_total"] == ref["params_total"] and a["params_embedding"] == len(tok) * 64
    assert len(a["notes"]) == 1 and "364" in a["notes"][0] and "300 rows" in a["notes"][0]
    loaded = _json(capsys, "anatomy", "--load", "-m", bad)["models"][0]
    assert loaded["vocab_size"] == len(tok) and loaded["notes"] == a["notes"]
    s_ref, s = (_json(capsys, "score", "hello world", "-m", p) for p in (sound, bad))
    assert s["total_logprob"] == pytest.approx(s_ref["total_logprob"], abs=1e-5)
    assert s["model"]["notes"] == a["notes"] and s_ref["model"]["notes"] == []
    again = _json(capsys, "score", "hello world", "-m", bad)["model"]     # the note kept by the cache entry
    assert again["loaded_from"] == "vocablens cache of the dequantized GGUF" and again["notes"] == a["notes"]


def test_padded_head_tokenizer_size_is_the_token_list(tmp_path, cache, capsys, tok):
    """364 rows (metadata 364, or no vocab_size key at all) and 300 tokens: V 364, tokenizer 300
    (it was the metadata's 364); without the key transformers took V from the token list and failed."""
    pad = save_tiny_gguf(tmp_path / "pad.gguf", tok, extra_rows=64)
    nokey = save_tiny_gguf(tmp_path / "nokey.gguf", tok, extra_rows=64, meta_vocab_size=0)
    for p in (pad, nokey):
        a = _json(capsys, "anatomy", "-m", p)["models"][0]
        assert (a["vocab_size"], a["tokenizer_vocab_size"]) == (len(tok) + 64, len(tok))
        assert a["notes"] == [f"64 rows beyond the tokenizer's {len(tok)} tokens are padding"]
    s1, s2 = (_json(capsys, "score", "hello world", "-m", p)["total_logprob"] for p in (pad, nokey))
    assert s1 == pytest.approx(s2, abs=1e-5)


@pytest.mark.parametrize("argv", [["anatomy"], ["score", "hello"], ["neighbors", " the"]])
def test_head_rows_unlike_the_embedding_is_one_line(tmp_path, cache, capsys, tok, argv):
    p = save_tiny_gguf(tmp_path / "head.gguf", tok, head_rows=len(tok) + 8)
    line = _one_error_line(*run_cli(capsys, *argv, "-m", p))
    assert str(p) in line and "308 rows" in line and "300" in line and "truncated" not in line, line
    assert not list(cache.rglob("*.safetensors"))


@pytest.mark.parametrize("meta, words", [
    ({"block_count": 3}, ["llama.block_count 3", "2 of those blocks"]),            # was: a random third block, exit 0
    ({"feed_forward_length": 128}, ["feed_forward_length 128", "96 rows"]),         # was: "truncated or damaged"
    ({"head_count_kv": 4}, ["model.layers.0.self_attn.k_proj.weight", "[64, 64]", "[32, 64]"]),
])
def test_metadata_unlike_the_tensors_is_one_line(tmp_path, cache, capsys, tok, meta, words):
    """Numbers of the metadata the tensors contradict: one line naming both, nothing cached, never
    "truncated" (the last one found by transformers' loading report: k_proj built for 4 kv heads)."""
    p = save_tiny_gguf(tmp_path / "m.gguf", tok, meta=meta)
    line = _one_error_line(*run_cli(capsys, "score", "hello", "-m", p))
    assert str(p) in line and "truncated" not in line and all(w in line for w in words), line
    assert not list(cache.rglob("*.safetensors"))


@pytest.mark.parametrize("argv", [["score", "hello"], ["neighbors", " the"], ["anatomy", "--load"]])
def test_token_list_shorter_than_its_merges_need_is_one_line(tmp_path, cache, capsys, tok, argv):
    """tokenizer.ggml.tokens cut by 100, merges unchanged (it was a 75-line traceback, exit 1)."""
    p = save_tiny_gguf(tmp_path / "cut.gguf", tok, drop_tokens=100)
    line = _one_error_line(*run_cli(capsys, *argv, "-m", p))
    assert f"cannot build the tokenizer of {p}: merge" in line, line
    assert "tokenizer.ggml.tokens, 200 entries" in line and "does not hold" in line, line
    assert not list(cache.rglob("*.safetensors"))


def test_bos_id_past_the_token_list_is_one_line(tmp_path, cache, capsys, tok):
    """tokenizer.ggml.bos_token_id 1,000 of 300 tokens (it said "truncated or damaged (list index out of range)")."""
    p = save_tiny_gguf(tmp_path / "bos.gguf", tok, bos_token_id=1000)
    line = _one_error_line(*run_cli(capsys, "score", "hello", "-m", p))
    assert line == (f"error: cannot build the tokenizer of {p}: tokenizer.ggml.bos_token_id is 1,000, past the end "
                    "of the token list (tokenizer.ggml.tokens, 300 entries)"), line


@pytest.mark.parametrize("argv", [["score", "hello"], ["neighbors", " the"]])
def test_directory_tokenizer_with_a_merge_outside_its_vocab_is_one_line(tmp_path, capsys, tok, argv):
    """The same fault in a model directory's tokenizer.json, on the full and the borders-only load."""
    d = save_tiny(tmp_path / "m", tok)
    tj = json.loads((d / "tokenizer.json").read_text())
    a, b = tj["model"]["merges"][0] if isinstance(tj["model"]["merges"][0], list) else \
        tj["model"]["merges"][0].split(" ")
    del tj["model"]["vocab"][a + b]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    line = _one_error_line(*run_cli(capsys, *argv, "-m", d))
    assert f"cannot build the tokenizer of {d}: tokenizer.json: merge 1 of" in line, line
    assert repr(a + b) in line and "model.vocab" in line, line


def test_truncated_data_names_the_bytes(tmp_path, cache, capsys, tok):
    """A file cut inside its tensor data: the line says where the tensors end and what the file holds."""
    p = save_tiny_gguf(tmp_path / "t.gguf", tok)
    size = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(size - 1000)
    line = _one_error_line(*run_cli(capsys, "anatomy", "-m", p))
    assert f"{size:,}" in line and f"{size - 1000:,}" in line and "truncated" in line, line
