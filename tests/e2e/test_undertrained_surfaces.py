"""Under-trained tokens where users meet them: the report's section, the explorer's token panel
(API and Chromium), ``trim --drop-undertrained`` and ``expand``'s indicator of each new row.

The model: the tiny untied llama of ``test_undertrained`` trained here on a corpus that never uses
``UNUSED`` (verification confirms them: measured there, recall >= 10/12 and precision 1)."""

from __future__ import annotations

import json

import pytest
import torch

from test_undertrained import N_UNUSED, UNUSED, USED, _trained
from tiny_dirs import run_cli

from browser import CHROMIUM, require_browser


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The trained untied tiny llama on disk, loaded by vocablens, and its `undertrained --json`."""
    import vocablens

    m, tok, _ = _trained(tied=False, seed=1)
    d = tmp_path_factory.mktemp("ut") / "m"
    m.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d, vocablens.load(str(d))


@pytest.fixture(scope="module")
def verified_json(saved, tmp_path_factory):
    """``vocablens undertrained -m DIR -n 12 --json``, saved to a file (what --undertrained reads)."""
    import contextlib
    import io

    from vocablens.cli.common import run_app

    d, _ = saved
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run_app(["undertrained", "-m", str(d), "-n", str(N_UNUSED), "--json"])
    assert code == 0
    path = tmp_path_factory.mktemp("utj") / "ut.json"
    path.write_text(buf.getvalue())
    return path, json.loads(buf.getvalue())


# --------------------------------------------------------------------------------------- report
def test_report_section_verification_stops_at_its_budget(saved, monkeypatch):
    """With no time left the section verifies its first batch only, says how many of the paper's
    candidates that is, and names the command that verifies them all."""
    import vocablens.report.sections as S
    from dataclasses import replace

    from vocablens.report.plan import SectionRun, plan_report

    d, lm = saved
    monkeypatch.setattr(S, "REPORT_BATCH", 2)
    plan = replace(next(p for p in plan_report(str(d), 150) if p.key == "undertrained"), budget_s=0.0)
    run = SectionRun(plan)
    S.RUNNERS["undertrained"]({"lm": lm}, plan, run)
    assert int(run.result.candidates.numel()) == 2 and run.extra["paper_candidates"] == 5
    assert run.cut_short.startswith("verified the lowest 2 of the paper's 5 candidates")
    assert f"`vocablens undertrained --model {d} -n 5`" in run.cut_short


def test_report_section_on_a_trained_model(saved):
    from vocablens.render.html import Section
    from vocablens.render.report import report_sections, report_to_dict
    from vocablens.report.runner import run_report

    d, lm = saved
    run = run_report(lm, model=str(d), only=("undertrained",))
    res = run.result("undertrained")
    # 252 testable tokens: the paper's 2% is 5 candidates, all verified within the share (not cut short)
    assert run.cut_short == {} and int(res.candidates.numel()) == 5
    assert set(res.verified.tolist()) <= set(UNUSED) and res.verified.numel() >= 4
    assert sum(res.counts().values()) == lm.borders.vocab_size
    (sec,) = report_sections(run, lm, str(d))
    assert isinstance(sec, Section) and sec.id == "undertrained"
    assert 'data-figure="undertrained-scatter"' in sec.html and "verified under-trained" in sec.html
    # the time it took is named as such, never a bare "N s" a reader could take for the section's budget
    assert f"prompting them took {res.verification.seconds:.1f} s" in sec.html
    for t in res.verified.tolist():  # the verified list names every verified token
        assert f"<td>{t}</td>" in sec.html
    j = report_to_dict(run, lm, d / "r.html", [sec], {})
    assert j["undertrained"]["verified_ids"] == res.verified.tolist()
    assert json.loads(json.dumps(j))["undertrained"]["counts"] == res.counts()


# ------------------------------------------------------------------------------------- explorer
def test_api_undertrained_field(saved, verified_json):
    from serve_tiny import client
    from vocablens.serve import ServerState, create_app

    d, lm = saved
    _, full = verified_json
    state = ServerState(lm, model_spec=str(d), argmax=False, undertrained=full)
    with client(create_app(state)) as c:
        ver = full["verified_ids"][0]
        row = next(t for t in full["tokens"] if t["id"] == ver)
        r = c.post("/api/undertrained", json={"token": ver}).json()
        assert r["id"] == ver and r["class"] == "normal" and r["verdict"] == "under-trained"
        assert r["indicator"]["name"] == full["indicator"]["name"] == "embedding_norm"
        assert abs(r["indicator"]["value"] - row["indicator"]) <= 1e-6 and r["indicator"]["candidate"]
        assert r["indicator"]["rank"] < N_UNUSED and r["verification"]["max_prob"] == row["max_prob"] < 0.01
        used = c.post("/api/undertrained", json={"token": USED[0]}).json()
        assert used["verdict"] == "not tested" and used["verification"] is None
        assert not used["indicator"]["candidate"] and used["indicator"]["rank"] >= N_UNUSED
        # the indicator is the input row's norm, as the command computes it
        assert abs(used["indicator"]["value"] - float(lm.borders.W_E[USED[0]].float().norm())) <= 1e-5
        unreach = c.post("/api/undertrained", json={"token": len(lm.tokenizer) - 1}).json()
        assert unreach["class"] == "unreachable" and not unreach["testable"] and unreach["indicator"]["rank"] is None
        assert sum(unreach["counts"].values()) == lm.borders.vocab_size
        bad = c.post("/api/undertrained", json={"token": 10 ** 6})
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]


def test_api_undertrained_without_a_verification(saved):
    from serve_tiny import client
    from vocablens.errors import BadInput
    from vocablens.serve import ServerState, create_app

    d, lm = saved
    state = ServerState(lm, model_spec=str(d), argmax=False)
    with client(create_app(state)) as c:
        r = c.post("/api/undertrained", json={"token": UNUSED[0]}).json()
        assert r["verdict"] == "not tested" and r["verification"] is None and not r["verified_run"]
        assert r["indicator"]["candidate"]  # a never-used token is among the lowest 2% by its norm
    with pytest.raises(BadInput, match="rows"):
        ServerState(lm, argmax=False, undertrained={"tokens": [], "vocab_size": 7, "verification": {"ran": True}})


@pytest.mark.browser
def test_token_panel_shows_undertraining_in_chromium(saved, verified_json):
    sync_playwright = require_browser().sync_playwright

    from test_serve import start_server

    d, _ = saved
    path, full = verified_json
    proc, url = start_server("-m", str(d), "--no-argmax", "--undertrained", str(path), timeout=300)
    try:
        ver = full["verified_ids"][0]
        row = next(t for t in full["tokens"] if t["id"] == ver)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
            page = b.new_page(viewport={"width": 1000, "height": 1400})
            page.set_default_timeout(120_000)
            problems = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            for tid, word in ((ver, "under-trained"), (USED[0], "not a candidate")):
                page.goto(f"{url}/?token={tid}")
                page.wait_for_function("(t) => window.vl.last.undertrained && window.vl.last.undertrained.id === t",
                                       arg=tid)
                assert page.text_content("#ut-verdict") == word
                assert "embedding norm" in page.text_content("#ut-indicator")
            page.goto(f"{url}/?token={ver}")
            page.wait_for_function("(t) => window.vl.last.undertrained && window.vl.last.undertrained.id === t", arg=ver)
            assert f"{row['max_prob']:.2e}".replace("e-0", "e-") in page.text_content("#ut-prob")
            assert page.is_visible("#tok-undertrained")
            b.close()
        assert problems == []
    finally:
        proc.kill()
        proc.wait()


# -------------------------------------------------------------------------------------- surgery
def test_trim_drop_undertrained(tmp_path, capsys):
    """A tiny random model: the verified tokens are taken out of the corpus's ids; what the trim keeps
    all the same (bytes, merge parts) is reported, the rest is gone, and the documents that hold a
    dropped token are left out of the check, which still passes."""
    from tiny_dirs import save_tiny, tiny_tokenizer

    tok = tiny_tokenizer()
    model = save_tiny(tmp_path / "m", tok)
    from test_surgery import _corpus

    corpus = tmp_path / "corpus"  # a directory: one document per file
    corpus.mkdir()
    for i, t in enumerate(_corpus()[:12]):
        (corpus / f"{i:02d}.txt").write_text(t[:200])
    code, out, err = run_cli(capsys, "trim", "-m", model, "--corpus", corpus, "--out", tmp_path / "a", "--json")
    assert code == 0, err
    plain = json.loads(out)
    assert plain["undertrained"] is None
    code, out, err = run_cli(capsys, "trim", "-m", model, "--corpus", corpus, "--out", tmp_path / "b", "--json",
                             "--drop-undertrained", "--undertrained-candidates", "4")
    assert code == 0, err
    j = json.loads(out)
    u = j["undertrained"]
    assert u["candidates"] == 4 and u["n_verified"] == len(u["verified_ids"]) >= 1
    kept = json.loads((tmp_path / "b" / "vocab_map.json").read_text())["kept_old_ids"]
    assert set(u["dropped_ids"]).isdisjoint(kept) and set(u["kept_anyway_ids"]) <= set(kept)
    assert sorted(u["dropped_ids"] + u["kept_anyway_ids"]) == sorted(u["verified_ids"])
    # rows dropped for that reason: the plain trim's rows less this one's
    assert u["rows_dropped"] == plain["trim"]["rows_after"] - j["trim"]["rows_after"] >= len(u["dropped_ids"])
    assert j["verification"]["tokenization_identical"]
    docs = plain["verification"]["corpus_documents_checked"]
    assert j["verification"]["corpus_documents_checked"] == docs - u["documents_respelled"]
    code, out, err = run_cli(capsys, "trim", "-m", model, "--corpus", corpus, "--out", tmp_path / "c",
                             "--drop-undertrained", "--undertrained-candidates", "4")
    assert code == 0 and "dropped for that reason" in out
    # a random model verifies nearly every candidate: with 40, each document holds a dropped token
    code, out, err = run_cli(capsys, "trim", "-m", model, "--corpus", corpus, "--out", tmp_path / "d",
                             "--drop-undertrained", "--undertrained-candidates", "40")
    assert code == 2 and "nothing is left to check the trim on" in err and not (tmp_path / "d").exists()


@pytest.mark.parametrize("tied", [True, False])
def test_new_row_indicators_mean_vs_zero(tied):
    """Rows copied from old tokens get those tokens' own indicator values; an all-zero row looks
    under-trained whichever indicator is used."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_dirs import tiny_tokenizer
    from vocablens.models import Borders
    from vocablens.undertrained import undertrained
    from vocablens.undertrained.newrows import new_row_indicators

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)).eval()
    b = Borders.from_model(m, tok)
    base = undertrained(b, tok, verify=False)
    ids = [40, 41, 42]
    E, U = b.W_E[ids], (None if tied else b.unembedding.weight[ids])
    ind = new_row_indicators(b, tok, E, U, base=base)
    assert torch.allclose(ind.values, base.indicators.values[ids], atol=1e-5)
    zero = new_row_indicators(b, tok, torch.zeros(1, b.d_model), None if tied else torch.zeros(1, b.d_model), base=base)
    assert bool(zero.looks_undertrained[0])  # at its initialisation by construction
    if tied:
        assert float(zero.values[0]) == 1.0  # no direction: the cosine distance cannot place it
    else:
        assert float(zero.values[0]) == 0.0 and float(zero.percentile[0]) == 0.0



@pytest.mark.browser
def test_report_section_draws_in_chromium(saved, tmp_path):
    """The section's page (plotly inlined): the scatter draws, nothing overlaps or is clipped."""
    sync_playwright = require_browser().sync_playwright

    from test_figures import BOXES_JS, layout_problems
    from vocablens.render.report import render_report, report_sections
    from vocablens.report.runner import run_report

    d, lm = saved
    run = run_report(lm, model=str(d), only=("undertrained",))
    page_file = tmp_path / "r.html"
    page_file.write_text(render_report("t", [], report_sections(run, lm, str(d))), encoding="utf-8")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = b.new_page(viewport={"width": 1300, "height": 900})
        problems = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_function("() => document.querySelectorAll('.figure .main-svg').length > 0")
        fig = page.query_selector('div.figure[data-figure="undertrained-scatter"]')
        box = fig.bounding_box()
        assert box["width"] > 300 and box["height"] > 150
        div = fig.query_selector(".plotly-graph-div").get_attribute("id")
        assert layout_problems(page.evaluate(BOXES_JS, div)) == []
        n = page.evaluate(f"() => document.getElementById('{div}').data.map(t => t.x.length)")
        assert sum(n) == int(run.result("undertrained").candidates.numel())  # every verified candidate drawn
        b.close()
    assert problems == []


def test_expand_json_reports_each_new_rows_indicator(tmp_path, capsys):
    from tiny_dirs import save_tiny, tiny_tokenizer

    model = save_tiny(tmp_path / "m", tiny_tokenizer())
    got = {}
    for init in ("subtoken-mean", "zeros"):
        code, out, err = run_cli(capsys, "expand", "-m", model, "--add", " objectstatement", "--add", " zyx",
                                 "--init", init, "--out", tmp_path / init, "--eval-text", "The value of x. " * 4,
                                 "--json")
        assert code == 0, err
        ind = json.loads(out)["indicator"]
        assert set(ind) == {"name", "why", "threshold", "old_median", "new_tokens"}
        rows = ind["new_tokens"]
        assert [r["token"] for r in rows] == [" objectstatement", " zyx"]
        for r in rows:
            assert 0.0 <= r["percentile"] <= 1.0 and set(r) == {"id", "token", "value", "percentile", "looks_undertrained"}
        got[init] = rows
    assert all(r["looks_undertrained"] for r in got["zeros"])
    code, out, err = run_cli(capsys, "expand", "-m", model, "--add", " objectstatement", "--out", tmp_path / "t",
                             "--eval-text", "The value of x. " * 4)
    assert code == 0 and "new rows on the under-training indicator" in out
