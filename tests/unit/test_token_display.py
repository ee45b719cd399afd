"""Two tokens never shown as one (issue 44 fault 4): with a SentencePiece byte-fallback tokenizer the
byte row ``<0x65>`` and the piece ``e`` both displayed as 'e' (neighbours, undertrained, JSON), and a
backslash token was escaped twice in the neighbours note. One display rule (``token_str``): byte rows
as ``<0xNN>``, the backslash escaped once everywhere, and tables with the ids."""

from __future__ import annotations

import json

import pytest

from tiny_dirs import run_cli, save_tiny
from vocablens.models.tokens import shown_to_bytes, token_bytes, token_str

PIECES = ("▁", "▁the", "▁cat", "e", "é", "ab", "\\")


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in PIECES:
        vocab[piece] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    return tok, vocab


@pytest.fixture(scope="module")
def sp(tmp_path_factory):
    tok, vocab = _tokenizer()
    d = save_tiny(tmp_path_factory.mktemp("sp") / "m", tok)
    return d, tok, vocab


def test_a_byte_row_and_a_piece_are_two_strings():
    tok, vocab = _tokenizer()
    assert token_str(tok, vocab["<0x65>"]) == "<0x65>" and token_str(tok, vocab["e"]) == "e"
    assert token_bytes(tok, vocab["<0x65>"]) == token_bytes(tok, vocab["e"]) == b"e"  # same text, two rows
    assert token_str(tok, vocab["<0x0A>"]) == "<0x0A>" and token_str(tok, vocab["\\"]) == "\\\\"
    shown = [token_str(tok, i) for i in range(len(tok))]
    assert len(set(shown)) == len(shown)                          # no two ids look alike
    for i in range(len(tok)):
        assert shown_to_bytes(shown[i]) == token_bytes(tok, i)    # still the token's bytes


def test_neighbors_tables_notes_and_json(sp, capsys):
    d, tok, vocab = sp
    bs = vocab["\\"]
    code, out, err = run_cli(capsys, "neighbors", "e", "<0x65>", "\\", "ab\\", "-m", d, "-k", "3")
    assert code == 0, err
    assert f"neighbours of 'e' (id {vocab['e']})" in out
    assert f"neighbours of '<0x65>' (id {vocab['<0x65>']})" in out
    assert f"neighbours of '\\\\' (id {bs})" in out        # the backslash escaped once
    # the note lists the pieces as the tables show them: one escape, with their ids
    sp_, a, b = vocab["▁"], vocab["<0x61>"], vocab["<0x62>"]
    assert f"'ab\\\\' is 4 tokens [' ' ({sp_}), '<0x61>' ({a}), '<0x62>' ({b}), '\\\\' ({bs})]" in out, out
    assert "\\\\\\\\" not in out
    assert "┃  id ┃" in out or "┃ id ┃" in out
    code, out, err = run_cli(capsys, "neighbors", "e", "<0x65>", "-m", d, "-k", "40", "--json")
    assert code == 0, err
    q_e, q_byte = json.loads(out)["queries"]
    assert q_e["tokens"] == ["e"] and q_byte["tokens"] == ["<0x65>"]
    rows = [r for q in (q_e, q_byte) for m in ("input", "output") for r in q[m]]
    assert all(r["token"] == token_str(tok, r["id"]) for r in rows)
    assert any(r["token"].startswith("<0x") for r in rows)
    assert all(r["token"] != "e" or r["id"] == vocab["e"] for r in rows)


def test_undertrained_json_and_score_table_show_byte_rows_and_ids(sp, capsys):
    d, tok, vocab = sp
    code, out, err = run_cli(capsys, "undertrained", "-m", d, "--json")
    assert code == 0, err
    rows = json.loads(out)["tokens"]
    byte_rows = [r for r in rows if tok.convert_ids_to_tokens(r["id"]).startswith("<0x")]
    assert byte_rows and all(r["token"] == tok.convert_ids_to_tokens(r["id"]) for r in byte_rows)
    code, out, err = run_cli(capsys, "score", "the cat e", "-m", d)
    assert code == 0, err
    assert "│  id │" in out or "┃  id ┃" in out or "┃ id ┃" in out
    assert f"│ {vocab['e']} │ 'e'" in out.replace("  ", " ") or f"{vocab['e']} │ 'e'" in out, out
