"""The one reader of the text files a user gives (:func:`vocablens.files.read_text`): a UTF-8
byte-order mark is skipped, UTF-16/UTF-32 decode by their mark, undecodable bytes are refused with the
file's name and byte offset, and ``-`` is standard input — on every command that reads user text."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.errors import BadInput
from vocablens.files import decode_text, read_text

TEXT = "Résumé: the café's naïve cooperation — 東京.\nSecond line.\n"


@pytest.mark.parametrize("enc, bom", [("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"),
                                      ("utf-16-be", b"\xfe\xff"), ("utf-32-le", b"\xff\xfe\x00\x00"),
                                      ("utf-32-be", b"\x00\x00\xfe\xff")])
def test_bom_decodes_and_is_dropped(tmp_path, enc, bom):
    p = tmp_path / "t.txt"
    p.write_bytes(bom + TEXT.encode(enc))
    assert read_text(p) == TEXT


def test_plain_utf8_unchanged(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(TEXT.encode("utf-8"))
    assert read_text(p) == TEXT


def test_undecodable_names_file_and_offset(tmp_path):
    p = tmp_path / "latin.txt"
    data = "abc café".encode("latin-1")  # é = 0xe9 at byte 7, not followed by continuation bytes
    p.write_bytes(data)
    with pytest.raises(BadInput) as e:
        read_text(p, "--file")
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and "--file" in msg
    assert "0xe9" in msg and "offset 7 " in msg


def test_utf16_offset_counts_the_mark():
    data = b"\xff\xfe" + "ab".encode("utf-16-le") + b"\x00\xdc"  # a lone low surrogate at byte 6
    with pytest.raises(BadInput, match=r"byte offset 6 is not UTF-16 LE"):
        decode_text(data, "x.txt")


def test_missing_and_directory(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        read_text(tmp_path / "nope.txt")
    with pytest.raises(BadInput, match="directory"):
        read_text(tmp_path)


def test_dash_reads_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + TEXT.encode())))
    assert read_text("-") == TEXT


def test_corpus_reads_utf16_and_bom(tmp_path):
    from vocablens.corpus import load_documents

    (tmp_path / "u16.txt").write_bytes(b"\xff\xfe" + TEXT.encode("utf-16-le"))
    (tmp_path / "bom.md").write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    docs = load_documents(tmp_path)
    assert [d.text for d in docs] == [TEXT, TEXT]
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe\xfd")
    with pytest.raises(BadInput, match=r"bad\.txt.*0xff at byte offset 3"):
        load_documents(tmp_path)


def test_corpus_dash_is_stdin(monkeypatch):
    from vocablens.corpus import load_documents

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TEXT.encode("utf-8"))))
    assert [d.text for d in load_documents("-")] == [TEXT]


def test_anomaly_inputs_bom(tmp_path):
    from vocablens.lens.anomaly import read_inputs

    p = tmp_path / "in.txt"
    p.write_bytes(b"\xef\xbb\xbf" + "first\nsecond\n".encode())
    assert read_inputs(p)[0] == ["first", "second"]


def test_no_errors_replace_on_user_text():
    src = Path(__file__).resolve().parents[2] / "src" / "vocablens"
    hits = [str(f) for f in src.rglob("*.py") if re.search(r"errors\s*=\s*['\"]replace", f.read_text("utf-8"))
            and f.name in ("corpus.py", "files.py", "anomaly.py", "ops.py", "core.py", "surgery.py")]
    assert hits == []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("bom") / "tiny", tiny_tokenizer())


def _score(capsys, tiny_dir, path):
    import json

    code, out, err = run_cli(capsys, "score", "-m", tiny_dir, "--file", path, "--json", "--top-k", "0")
    assert code == 0, err
    return json.loads(out)


def test_score_bom_file_scores_as_without(capsys, tmp_path, tiny_dir):
    """The issue's fault: a Notepad file (UTF-8 with a mark) was scored with the mark as text."""
    plain, bom, u16 = tmp_path / "plain.txt", tmp_path / "bom.txt", tmp_path / "u16.txt"
    text = "The class statement defines a new type."
    plain.write_bytes(text.encode())
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    u16.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    a, b, c = (_score(capsys, tiny_dir, p) for p in (plain, bom, u16))
    keys = ("n_tokens", "n_bytes", "total_logprob")
    got = [{k: d[k] for k in keys if k in d} for d in (a, b, c)]
    assert got[0] and got[0] == got[1] == got[2]


def test_score_file_dash_is_stdin(capsys, monkeypatch, tmp_path, tiny_dir):
    text = "The class statement defines a new type."
    (tmp_path / "plain.txt").write_bytes(text.encode())
    ref = _score(capsys, tiny_dir, tmp_path / "plain.txt")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert _score(capsys, tiny_dir, "-") == ref


def test_lens_file_undecodable_one_line(capsys, tmp_path, tiny_dir):
    p = tmp_path / "prompts.txt"
    p.write_bytes(b"hello\nw\xf0rld\n")
    code, out, err = run_cli(capsys, "lens", "-m", tiny_dir, "--file", p)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "prompts.txt" in err and "byte offset 7" in err
