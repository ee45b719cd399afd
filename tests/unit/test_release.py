"""What a borders-only command lets go of before its heavy phase: the tokenizer (a table of its token
strings stays) and the checkpoint pages an analysis has read (models.files.pages)."""

import gc
import sys
import weakref

import pytest
import torch

from tiny_dirs import save_tiny, tiny_tokenizer
from vocablens.models.files import pages
from vocablens.models.token_table import TokenTable
from vocablens.models.tokens import token_bytes, token_str


def _wordlevel_tokenizer():
    """A WordLevel tokenizer with a whitespace decoder: neither byte-level nor SentencePiece."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(40)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", eos_token="w1")
    tok.add_tokens(["<extra>"], special_tokens=True)
    return tok


def _tokenizers():
    from test_tokens import _sentencepiece_tokenizer

    return {"bytelevel": tiny_tokenizer(300, words=["naïve", "Paris"]),
            "sentencepiece": _sentencepiece_tokenizer()[0], "plain": _wordlevel_tokenizer()}


def test_token_table_gives_the_tokenizers_strings():
    for kind, tok in _tokenizers().items():
        table = TokenTable(tok)
        assert table._vocablens_kind == kind and len(table) == len(tok)
        for i in range(-2, len(tok) + 3):  # every id, and ids the tokenizer has not
            assert token_str(table, i) == token_str(tok, i), (kind, i)
            assert token_bytes(table, i) == token_bytes(tok, i), (kind, i)
        assert token_str(table, len(tok) + 2) == f"<id {len(tok) + 2}>"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "m", tiny_tokenizer(300))


def test_without_tokenizer_frees_it_and_keeps_the_strings(tiny_dir):
    from vocablens.models.files.partial import load_borders_only

    lm = load_borders_only(str(tiny_dir))
    ids = list(range(len(lm.tokenizer)))
    want = [token_str(lm.tokenizer, i) for i in ids]
    ref = weakref.ref(lm.tokenizer)
    light = lm.without_tokenizer()
    assert ref() is not None and lm.tokenizer is ref()  # the caller's model keeps its tokenizer
    assert light.borders is lm.borders and light.provenance is lm.provenance and light.model is lm.model
    assert light.without_tokenizer() is light
    del lm
    assert ref() is None  # nothing else held it: freed without a gc pass
    assert [token_str(light.tokenizer, i) for i in ids] == want
    gc.collect()
    assert ref() is None


def _pagemap_present(t: torch.Tensor) -> tuple[int, int]:
    """(present pages, pages) of the whole pages inside t's memory."""
    import numpy as np

    ps = pages._page_size()
    lo = -(-t.data_ptr() // ps) * ps
    hi = (t.data_ptr() + t.numel() * t.element_size()) // ps * ps
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo // ps * 8)
        e = np.frombuffer(f.read((hi - lo) // ps * 8), dtype="<u8")
    return int(((e >> np.uint64(63)) & np.uint64(1)).sum()), len(e)


@pytest.fixture
def mapped(tmp_path, monkeypatch):
    """A [2048, 512] float32 tensor memory-mapped from a safetensors file (as the lazy loader reads)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if not sys.platform.startswith("linux"):
        pytest.skip("page release is Linux only (madvise, /proc/self/pagemap)")
    monkeypatch.setattr(pages, "_ON", False)
    W = torch.randn(2048, 512, generator=torch.Generator().manual_seed(0))
    save_file({"W": W}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as h:
        M = h.get_tensor("W")
    return W, M


def test_release_pages_drops_read_file_pages_only(mapped):
    W, M = mapped
    assert torch.equal(M, W)
    present, n = _pagemap_present(M)
    assert present == n > 0  # read: resident
    assert pages.release_pages(M) == 0 and _pagemap_present(M)[0] == n  # off by default
    pages.release_after_reading()
    block = M[256:1024]
    assert pages.release_pages(block) > 0
    p_all, _ = _pagemap_present(M)
    assert p_all <= n - (768 * 512 * 4) // pages._page_size() + 2  # the block's whole pages went
    assert _pagemap_present(M[:200])[0] == _pagemap_present(M[:200])[1]  # the rest stayed
    assert torch.equal(M, W)  # read again: the file's values
    # a page written in place is the process's own memory now: nothing of that range is dropped
    M[300, 0] = 42.0
    assert pages.release_pages(M[256:1024]) == 0 and float(M[300, 0]) == 42.0
    # ordinary (anonymous) memory is never touched
    A = W.clone()
    assert pages.release_pages(A) == 0 and torch.equal(A, W)
    # a strided view that is not one dense span, and a transposed matrix (one span)
    assert pages.release_pages(M[:, :10]) == 0
    assert pages.release_pages(M[1024:].t()) > 0 and torch.equal(M[1024:], W[1024:])


def test_read_once_scan_keeps_one_chunk(mapped):
    W, M = mapped
    pages.release_after_reading()
    total = sum(float(c.sum()) for c in pages.read_once(M.reshape(-1).split(2**18)))
    assert total == pytest.approx(float(W.sum()), rel=1e-4)
    present, n = _pagemap_present(M)
    assert present <= 2 * 2**18 * 4 // pages._page_size() + 2  # at most the last chunk, about
    assert torch.equal(M, W)


def test_analyses_with_release_on_equal_the_full_load(tiny_dir, monkeypatch):
    """project's analyses on a borders-only load whose read pages go: the full load's results, and
    the head's pages are no longer all resident afterwards."""
    from test_lazy import _same
    from vocablens import vocab_space as vs
    from vocablens.models import load
    from vocablens.models.files.partial import load_borders_only

    if not sys.platform.startswith("linux"):
        pytest.skip("page release is Linux only (madvise, /proc/self/pagemap)")
    full = load(str(tiny_dir)).borders
    want = (vs.search_tokens(full, [5, 9], k=3), vs.project_vectors(full, [0, 1], [2, 7], k=4),
            vs.project_vectors(full, [1], [3], k=4, kind="key"))
    monkeypatch.setattr(pages, "_ON", True)
    lazy = load_borders_only(str(tiny_dir), value_vectors=True).borders
    got = (vs.search_tokens(lazy, [5, 9], k=3), vs.project_vectors(lazy, [0, 1], [2, 7], k=4))
    for a, b in zip(want[0], got[0]):
        _same(a, b)
    _same(want[1], got[1])
    present, n = _pagemap_present(lazy.unembedding.weight)
    assert n > 0 and present < n  # read, then let go
    lazy = load_borders_only(str(tiny_dir), blocks=[1]).borders
    _same(want[2], vs.project_vectors(lazy, [1], [3], k=4, kind="key"))
