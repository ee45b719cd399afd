"""argmax's memory: the head-only load (no transformers modeling code), the page release of a
file-mapped W, and Q set aside during the stages. Every path must give the same numbers."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
import torch

from test_argmax import planted
from test_lazy import _write_tokenizer
from tiny_models import make_tiny
from vocablens.argmax import find_unargmaxable
from vocablens.models.files.pages import PageRelease, file_pages_only
from vocablens.errors import BadInput
from vocablens.models.files.partial import load_borders_only
from vocablens.models.files.matrices_only import MatricesOnly
from vocablens.models.files.partial import load_head_only


def _save_tiny(family: str, d):
    """A tiny model of ``family`` saved as safetensors with a word-level tokenizer in d; the model."""
    model = make_tiny(family)
    model.save_pretrained(d, safe_serialization=True)
    _write_tokenizer(d, model.config.vocab_size)
    return model


@pytest.fixture(scope="module", params=["llama", "llama_tied", "qwen3", "phi3", "gpt2", "gemma3_text"])
def saved(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    _save_tiny(request.param, d)
    return request.param, d


def _mapped(t: torch.Tensor) -> bool:
    return file_pages_only(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())


def test_head_only_equals_borders_only(saved):
    family, d = saved
    lm, ref = load_head_only(str(d)), load_borders_only(str(d))
    assert isinstance(lm.model, MatricesOnly)             # every family: its own norm class, no fallback
    U, R = lm.borders.unembedding, ref.borders.unembedding
    assert torch.equal(U.weight, R.weight) and U.weight.dtype == R.weight.dtype
    assert (U.bias is None) == (R.bias is None) and (U.bias is None or torch.equal(U.bias, R.bias))
    assert torch.equal(U.real_mask, R.real_mask)
    assert (U.logit_scale, U.softcap, U.project_out) == (R.logit_scale, R.softcap, R.project_out)
    x = torch.randn(5, U.weight.shape[1], generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(U.final_norm(x), R.final_norm(x))
    assert _mapped(U.weight) and _mapped(R.weight)         # the file's pages (copy-on-write), not a copy
    if family == "llama":                                 # the scan and the bounds: once is enough
        from vocablens.argmax.model import argmax_for_borders

        a, b = argmax_for_borders(lm.borders, norm_tokens=6), argmax_for_borders(ref.borders, norm_tokens=6)
        assert torch.equal(a.result.verdict, b.result.verdict)
        assert torch.equal(a.result.margin.nan_to_num(), b.result.margin.nan_to_num())
        assert torch.equal(a.reach.p_lower, b.reach.p_lower) and torch.equal(a.reach.p_upper, b.reach.p_upper)
        assert a.norm_note == b.norm_note
    with pytest.raises(BadInput, match="not read"):
        lm.borders.blocks[0](x)


def test_head_only_falls_back_where_it_cannot_read_exactly(tmp_path):
    model = _save_tiny("llama", tmp_path)
    lm = load_head_only(str(tmp_path), dtype="float64")    # converted: an in-memory copy, same values
    assert isinstance(lm.model, MatricesOnly) and not _mapped(lm.borders.unembedding.weight)
    assert torch.equal(lm.borders.unembedding.weight, model.lm_head.weight.double())
    phi = tmp_path / "phi"                                 # a head bias: the borders-only load
    _save_tiny("phi", phi)
    assert not isinstance(load_head_only(str(phi)).model, MatricesOnly)


# ----------------------------------------------------------------------------------- page release
def _save_rows(path, W: torch.Tensor):
    from safetensors.torch import save_file

    save_file({"w": W.contiguous()}, str(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as h:        # the file's copy-on-write mapping
        return h.get_tensor("w")


def _resident_kib(t: torch.Tensor) -> int:
    """Resident KiB of the mapping holding t (from /proc/self/smaps)."""
    a = t.data_ptr()
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                s, e = (int(x, 16) for x in head.split("-"))
                inside = s <= a < e
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    return -1


def test_page_release_drops_pages_of_an_unwritten_file_mapping_only(tmp_path):
    W = torch.randn(2048, 64, generator=torch.Generator().manual_seed(0))
    M = _save_rows(tmp_path / "w.safetensors", W)
    assert M is not None and torch.equal(M, W) and _mapped(M)
    pr = PageRelease(M.numpy())
    assert pr.active
    float(M.sum())                                          # every page resident
    before = _resident_kib(M)
    pr.release_all()
    after = _resident_kib(M)
    assert before >= 480 and after <= before - 480          # the 512 KiB of rows went back
    assert torch.equal(M, W)                                 # read again from the file: the same bits
    pr.release(100, 900)
    assert torch.equal(M[100:900], W[100:900])
    # anonymous memory (and a writable mapping) is never touched: a no-op, the data stays
    A = W.clone()
    pa = PageRelease(A.numpy())
    assert not pa.active
    pa.release_all()
    assert torch.equal(A, W) and pa.calls == 0
    np.save(tmp_path / "w.npy", W.numpy())
    cow = np.load(tmp_path / "w.npy", mmap_mode="c")        # private, writable: written pages would be lost
    cow[0, 0] = 7.0
    assert not PageRelease(cow).active
    M[1000, 5] = 7.0                                         # a written page of the safetensors mapping
    assert not PageRelease(M.numpy()).active
    assert float(M[1000, 5]) == 7.0 and torch.equal(M[:900], W[:900])
    assert not PageRelease(np.zeros((4, mmap.PAGESIZE))).active


def test_scan_on_a_read_only_mapping_gives_the_in_memory_results(tmp_path, monkeypatch):
    """Whitening, the shared ball, the proofs' gathers and the float64 re-check release pages as
    they go; every number of the result is the in-memory run's."""
    import vocablens.models.files.pages as pages

    W, pl = planted(V=1500, d=24, n_planted=6, seed=2)
    M = _save_rows(tmp_path / "w.safetensors", W)
    calls = []
    inner = pages.PageRelease.release
    monkeypatch.setattr(pages.PageRelease, "release", lambda self, s, e: (calls.append((s, e)), inner(self, s, e)))
    a = find_unargmaxable(M, verify="all")
    assert len(calls) > 10
    monkeypatch.undo()
    b = find_unargmaxable(W.clone(), verify="all")
    assert a.ids("unargmaxable").tolist() == pl
    for f in ("verdict", "stage", "margin", "residual", "quant", "whiten", "center", "scale"):
        x, y = getattr(a, f), getattr(b, f)
        assert torch.equal(x.nan_to_num(), y.nan_to_num()) if x.is_floating_point() else torch.equal(x, y), f
    assert a.combos.keys() == b.combos.keys()
    assert all(torch.equal(a.combos[t][1], b.combos[t][1]) for t in a.combos)
    from vocablens.argmax.norm import NormModel, norm_reachability

    nm = NormModel(gain=torch.linspace(0.5, 1.5, 24, dtype=torch.float64), shift=torch.zeros(24, dtype=torch.float64),
                   radius=24 ** 0.5, centred=False, kind="rmsnorm", max_error=0.0)
    ra, rb = norm_reachability(M, pl[:3], nm, iters=40), norm_reachability(W, pl[:3], nm, iters=40)
    assert torch.equal(ra.p_lower, rb.p_lower) and torch.equal(ra.p_upper, rb.p_upper)


def test_q_made_again_from_z_has_the_stored_bits():
    """The int8 grid rows made again from Z by blocks (``q_from_z``) are the stored grid's bits, and
    the scan without Z (stage verify's) reads the same rows (``q_rows``, ``q_rows_at``)."""
    from test_argmax_fast_paths import _prepared
    from vocablens.argmax.scan import q_from_z

    W, _ = planted(V=1200, d=16, n_planted=5, seed=4, offset=1.0)
    st = _prepared(W)
    assert torch.equal(q_from_z(st.Z, st.white.grid_step), st.Q)
    lean = st.without_z()
    assert lean.Z is None and st.Z is not None                  # a new scan: the first keeps its Z
    pos = np.array([5, 0, 1199 - 7, 17])
    assert torch.equal(lean.q_rows(0, lean.n), st.Q)
    assert torch.equal(lean.q_rows_at(pos), st.Q[torch.from_numpy(pos)])


def test_cli_argmax_on_a_saved_model_reads_the_tokenizer_again(tmp_path, capsys):
    """The command loads the head alone, frees the tokenizer for the scan and reads it again."""
    from vocablens.argmax.model import argmax_for_borders
    from vocablens.cli.common import run_app

    d = tmp_path
    _save_tiny("llama", d)
    assert run_app(["argmax", "--model", str(d), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    ref = argmax_for_borders(load_borders_only(str(d)).borders)
    assert j["counts"] == ref.result.counts()
    assert j["norm"]["kind"] == "rmsnorm"
