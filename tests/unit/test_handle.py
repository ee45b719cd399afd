"""``vocablens.Model`` on a tiny random model: the one place text becomes ids, lens kinds (a missing
translator refused, a new kind added), results that show themselves, and a load that leaves
transformers' logging settings as it found them."""

from __future__ import annotations

import pytest
import torch

from tiny_dirs import save_tiny, tiny_tokenizer
from vocablens.errors import BadInput


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("handle") / "m", tiny_tokenizer())
    return vocablens.load(str(d))


def test_load_returns_a_model_that_unpacks_to_the_four_parts(m):
    from vocablens.handle import Model

    model, tok, borders, prov = m
    assert isinstance(m, Model) and model is m.model and tok is m.tokenizer and borders is m.borders
    assert prov.name == "m" and Model.of(m) is m


def test_a_batch_is_right_padded_with_a_mask_and_each_row_is_its_own_encoding(m):
    texts = ["the cat sat", "a", "hello world the end"]
    ids, mask = m.encode_batch(texts)
    assert ids.shape[0] == 3 and ids.dtype == torch.int64 and mask.shape == ids.shape
    for i, t in enumerate(texts):
        own = m.encode(t)[0]
        n = int(mask[i].sum())
        assert n == own.numel() and torch.equal(ids[i, :n], own) and not mask[i, n:].any()
    with pytest.raises(BadInput, match="prompt 2"):
        m.encode_batch(["fine", "   "])


def test_lens_holds_a_batch_and_its_json_follows_the_lens_file_schema(m):
    from vocablens.lens.logit import logit_lens
    from vocablens.render.lens import lens_batch_json, lens_json

    one = m.lens("the cat sat", k=3)
    assert one.prompts == ["the cat sat"] and len(one) == 1 and one.kinds == ["logit"]
    ref = logit_lens(m.borders, m.encode("the cat sat"), k=3)  # the analysis called directly
    assert one.to_json() == lens_json([ref], m.tokenizer, m.provenance)
    many = m.lens(["the cat sat", "a b"], k=3, positions="all")
    assert many.to_json() == lens_batch_json(many.value, m.tokenizer, m.provenance)
    assert [len(r.positions) for r in (many[0], many[1])] == [m.encode(t).shape[1] for t in ("the cat sat", "a b")]
    ids = m.lens(m.encode("the cat sat")[0], k=3)           # ids in: the same reading
    assert torch.equal(ids[0].layers[-1].top_ids, one[0].layers[-1].top_ids)


def test_a_lens_kind_without_a_translator_is_refused_not_relabelled(m):
    """A known kind with no translator available (none loaded, none shipped for this model) is refused
    in one line that says how to get one; an unknown kind is refused naming the known ones. Neither is
    read as another lens (no result, no translator registered under that kind)."""
    with pytest.raises(BadInput, match="no tuned lens") as e:
        m.lens("the cat", kind="tuned")
    assert "\n" not in str(e.value)
    with pytest.raises(BadInput, match=r"no Jacobian lens shipped for .*give `path` .*lens fit-jacobian") as e:
        m.lens("the cat", kind="jacobian")
    assert "\n" not in str(e.value) and "jacobian" not in m.translators
    with pytest.raises(BadInput, match="`kind` must be one of logit, tuned, jacobian, both;") as e:
        m.lens("the cat", kind="no-such-lens")  # jacobian is taken too (it was left out of the list)
    assert "\n" not in str(e.value) and "no-such-lens" not in m.translators


def test_a_new_translator_kind_reads_through_its_translator(m):
    class Doubling:  # h -> 2h: through the final norm this is the logit lens (RMSNorm is scale-free)
        def translate(self, layer, h):
            return 2 * h

    m.add_lens("doubled", Doubling())
    try:
        res = m.lens("the cat sat", kind=["logit", "doubled"], k=3)
        assert res.kinds == ["logit", "doubled"]
        for a, b in zip(res[0, "logit"].layers, res[0, "doubled"].layers):
            assert torch.equal(a.top_ids, b.top_ids)
    finally:
        m.translators.pop("doubled")


def test_results_show_themselves_through_the_cli_renderers(m):
    from rich.console import Console

    from vocablens.render.score import print_score

    s = m.score("the cat sat on the mat", top_k=2)
    rec = Console(record=True, width=120, file=open("/dev/null", "w"))
    print_score(s.value, m.tokenizer, rec, m.provenance)
    shown = Console(record=True, width=120, file=open("/dev/null", "w"))
    shown.print(s.table())
    assert shown.export_text() == rec.export_text()              # .table() is what `score` prints
    assert "per-token log-probabilities (nats)" in s._repr_html_()
    assert s.total_logprob == pytest.approx(float(s.logprobs.sum()))  # fields read through
    frame = s.to_pandas()
    assert list(frame["token"]) == m.tokens(s.input_ids[1:])
    assert frame["logprob"].sum() == pytest.approx(s.total_logprob, rel=1e-6)
    with pytest.raises(BadInput, match="no figure"):
        s.figure()


def test_to_pandas_names_the_extra_when_pandas_is_missing(m, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas -> ImportError
    with pytest.raises(BadInput, match=r"pip install 'vocablens\[pandas\]'"):
        m.neighbors(["the"], k=3).to_pandas()


def test_loading_leaves_transformers_logging_as_it_found_it(tmp_path):
    import os

    from transformers.utils import logging as hf_logging

    import vocablens

    d = save_tiny(tmp_path / "m", tiny_tokenizer())
    before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), os.environ.get("TQDM_DISABLE"))
    hf_logging.set_verbosity_info()
    hf_logging.enable_progress_bar()
    try:
        vocablens.load(str(d))
        assert hf_logging.get_verbosity() == hf_logging.INFO and hf_logging.is_progress_bar_enabled()
        assert os.environ.get("TQDM_DISABLE") == before[2]
    finally:
        hf_logging.set_verbosity(before[0])
        (hf_logging.enable_progress_bar if before[1] else hf_logging.disable_progress_bar)()


def test_expand_returns_a_new_verified_model_and_save_writes_it(m, tmp_path):
    new = m.expand([" zebra"], eval_text="the cat sat on the mat and the dog ran far away " * 4)
    assert new is not m and new.borders.vocab_size >= m.borders.vocab_size + 1
    tid = new.token_id(" zebra")                                   # one token, else TokenNotInVocabulary
    assert tid >= m.borders.real_vocab_size                        # a new one
    rec = new.surgery.to_json()
    assert rec["out"] is None and [t["token"] for t in rec["indicator"]["new_tokens"]] == [" zebra"]
    (row,) = new.surgery.to_pandas().to_dict("records")  # a row per added token
    assert (row["token"], row["id"], row["init"]) == (" zebra", tid, new.surgery.value.new_tokens[0].init)
    assert row["indicator"] == rec["indicator"]["new_tokens"][0]["value"]
    out = new.save(tmp_path / "out")
    assert (out / "vocablens_surgery.json").is_file() and new.surgery.to_json()["out"] == str(out)


def test_the_other_workflows_return_results_that_render(m, tmp_path):
    """tie_check, pca, train_lens (then a tuned lens read through it) and report, each one call."""
    from vocablens.lens.train import TrainSettings

    tie = m.tie_check()
    assert tie.to_json() == tie.value.to_dict() and tie.tied is False and tie.saved_params == 0  # untied
    words = sorted(w for w in m.tokenizer.get_vocab() if w.isascii() and w.isalpha() and len(w) > 1)[:8]
    pca = m.pca(words, prefix="")  # whole vocabulary entries: each one token
    got = pca.to_json()
    assert got["words"] == list(pca.words) and len(got["coords"]) == len(pca.words) >= 4
    assert len(pca.figure().data) >= 1
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat and the dog ran far away. " * 200, encoding="utf-8")
    res = m.train_lens(str(text), out=tmp_path / "lens", settings=TrainSettings(steps=2, tokens_per_step=64, seq_len=32))
    try:
        assert (tmp_path / "lens" / "lens.safetensors").is_file() and m.translators["tuned"] is res.lens
        lens = m.lens("the cat sat", kind="both", k=2)
        assert lens.kinds == ["logit", "tuned"] and len(lens.to_json()["tuned"]["layers"]) == m.borders.n_layers + 1
    finally:
        m.translators.pop("tuned", None)
    run = m.report(out=tmp_path / "r.html", only=("anatomy",), budget_s=60)
    assert run.get("anatomy").result.vocab_size == m.borders.vocab_size
    assert "anatomy" in (tmp_path / "r.html").read_text(encoding="utf-8").lower()


def test_trim_takes_documents_without_a_corpus(m):
    """``m.trim(documents=[...])`` keeps the tokens those texts use (it was refused: 'give --corpus F')."""
    text = "the cat sat on the mat and the dog ran far away"
    new = m.trim(documents=[text * 3], verify_texts=1, verify_tokens=32)
    assert new.borders.real_vocab_size < m.borders.real_vocab_size
    assert new.tokenizer.decode(new.encode(text)[0]).endswith(text)  # every token of the text kept
    with pytest.raises(BadInput, match="give corpus, documents or token_list"):
        m.trim()


def test_a_result_repr_names_only_the_methods_that_work(m):
    """The repr offered ``.figure()`` on results that draw none (it raised BadInput)."""
    for res, draws in ((m.neighbors("the", k=3), False), (m.lens("the cat sat", k=2), True)):
        assert (".figure()" in repr(res)) is draws and ".to_pandas()" in repr(res)
        if draws:
            assert len(res.figure().data) >= 1
        else:
            with pytest.raises(BadInput, match="no figure"):
                res.figure()


def test_save_prints_no_progress_bar(m, tmp_path, capfd):
    """``m.save`` printed transformers' 'Writing model shards' bar into the notebook."""
    out = m.save(tmp_path / "saved")
    assert (out / "config.json").is_file()
    assert "Writing model shards" not in capfd.readouterr().err


def test_the_package_root_lists_its_entry_points_not_its_own_imports():
    """``dir(vocablens)`` (tab completion) offered ``annotations``, ``importlib`` and ``sys``."""
    import vocablens

    names = set(dir(vocablens))
    assert set(vocablens.__all__) <= names and {"load", "Model"} <= names
    assert not names & {"annotations", "importlib", "sys"}


def test_score_takes_ids_as_well_as_text(m):
    text = "the cat sat on the mat"
    ids = m.encode(text)[0]
    by_text = m.score(text, top_k=2).to_json()
    assert m.score(ids, top_k=2).to_json() == by_text                  # a [T] tensor
    assert m.score(ids.tolist(), top_k=2).to_json() == by_text         # a list of ints
    with pytest.raises(BadInput, match="empty text"):
        m.score("   ")
