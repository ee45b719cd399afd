"""A tokenizer longer than the matrices (tokens added after the checkpoint was saved; issue 44 fault 3):
every command that turns text into ids says "token id N ('piece') has no row in the matrices" in one
line, exit 2, from the one check :func:`vocablens.models.tokens.check_ids_fit` (``expand`` used to
fail with "ref (256, 300) and z (256, 304) must have the same [T, C]", ``generate`` with an
``IndexError`` traceback)."""

from __future__ import annotations

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.errors import BadInput, TokenNotInVocabulary
from vocablens.models.tokens import check_ids_fit, encode_prompt, single_token_id

ADDED = ["zqxa", "zqxb", "zqxc", "zqxd"]


@pytest.fixture(scope="module")
def long_tok(tmp_path_factory):
    """(model dir, rows): a tiny llama saved with its tokenizer, then 4 tokens added to the tokenizer only."""
    d = tmp_path_factory.mktemp("longtok") / "m"
    tok = tiny_tokenizer()
    rows = len(tok)
    save_tiny(d, tok)
    tok.add_tokens(ADDED)
    tok.save_pretrained(d)
    (d.parent / "notes.txt").write_text("The class zqxd statement defines a new type.\n" * 40)
    return d, rows


def test_check_ids_fit_names_the_first_id_without_a_row():
    check_ids_fit([0, 5, 9], 10)
    check_ids_fit(torch.zeros(0, dtype=torch.int64), 10)
    check_ids_fit(torch.tensor([[0, 9]]), 10)
    with pytest.raises(TokenNotInVocabulary, match=r"^token id 12 has no row in the matrices \(10 rows\)$"):
        check_ids_fit([3, 12, 11], 10)
    with pytest.raises(TokenNotInVocabulary, match=r"token id 49,155 has no row .*49,152 rows"):
        check_ids_fit(torch.tensor([[1, 49_155]]), 49_152)
    with pytest.raises(BadInput, match="token id -1 has no row"):
        check_ids_fit(torch.tensor([-1]), 10)


def test_every_encode_path_checks_the_rows():
    tok = tiny_tokenizer(words=ADDED)
    rows = len(tok) - len(ADDED)
    want = rf"token id {rows + 3} \('zqxd'\) has no row in the matrices \({rows} rows; the tokenizer has {rows + 4} tokens\)"
    with pytest.raises(TokenNotInVocabulary, match=want):
        encode_prompt(tok, "The class zqxd", rows=rows)
    with pytest.raises(TokenNotInVocabulary, match=want):
        single_token_id(tok, "zqxd", rows)   # an added token found in the vocabulary table
    assert encode_prompt(tok, "The class", rows=rows).max() < rows


def _one_line(code, out, err):
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in out + err, err
    assert code == 2 and len(errors) == 1, (code, out, err)
    return errors[0]


@pytest.mark.parametrize("argv", [
    ["score", "The class zqxd"],
    ["lens", "The class zqxd"],
    ["generate", "The class zqxd", "-n", "3"],
    ["explain", "The class zqxd"],
    ["neighbors", "zqxd"],
    ["steer", "--promote", " the", "--prompt", "The class zqxd", "--new-tokens", "0"],
], ids=lambda a: a[0])
def test_text_with_a_token_beyond_the_rows_is_one_line(argv, long_tok, capsys):
    d, rows = long_tok
    line = _one_line(*run_cli(capsys, *argv, "-m", d))
    assert line == (f"error: token id {rows + 3} ('zqxd') has no row in the matrices "
                    f"({rows} rows; the tokenizer has {rows + 4} tokens)"), line


def test_expand_refuses_a_tokenizer_longer_than_the_rows(long_tok, capsys, tmp_path):
    d, rows = long_tok
    line = _one_line(*run_cli(capsys, "expand", "-m", d, "--add", " vocablens", "--out", tmp_path / "out"))
    assert f"token id {rows} ('zqxa') has no row in the matrices ({rows} rows" in line, line
    assert not (tmp_path / "out").exists()


def test_a_corpus_token_beyond_the_rows_stops_the_forward(long_tok, capsys):
    """Corpus text is encoded below the models layer; every forward checks the ids itself."""
    d, rows = long_tok
    line = _one_line(*run_cli(capsys, "settle", "-m", d, "--corpus", d.parent / "notes.txt"))
    assert f"token id {rows + 3} has no row in the matrices ({rows} rows)" in line, line
