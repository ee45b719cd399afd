"""Results display themselves in Jupyter/IPython (vocablens.render.notebook): each result's HTML holds
its key figures, written as the CLI writes them, and ``import vocablens`` inside IPython registers the
formatters by itself. A tiny random model with a real tokenizer; the real model in docs/tour.ipynb."""

from __future__ import annotations

import html
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vocablens
from tiny_dirs import save_tiny, tiny_tokenizer
from vocablens.models.tokens import token_str
from vocablens.render import notebook
from vocablens.render.anatomy import fmt_count
from vocablens.render.tokens import visible

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    d = save_tiny(tmp_path_factory.mktemp("nb") / "tiny", tiny_tokenizer())
    return vocablens.load(str(d))


@pytest.fixture(scope="module")
def ids(lm):
    return torch.tensor(lm.tokenizer("The class statement defines", add_special_tokens=False).input_ids)


def page(result, lm) -> str:
    """The HTML of one result as a reader sees it in the cell: tags dropped, entities decoded."""
    import re

    h = notebook.to_html(result, lm.tokenizer)
    assert h.startswith("<pre") and h.endswith("</pre>") and "<script" not in h
    return html.unescape(re.sub(r"<[^>]+>", "", h))


def flat(h: str) -> str:
    """Whitespace collapsed: a title rich wraps over two lines reads as one."""
    import re

    return re.sub(r"\s+", " ", h)


def shown(lm, i) -> str:
    return f"'{token_str(lm.tokenizer, int(i))}'"


def test_anatomy(lm):
    from vocablens.accounting.anatomy import anatomy  # (the root's name is shadowed once the module is imported)

    a = anatomy(lm.borders, name="tiny")
    h = page(a, lm)
    assert "anatomy of the vocabulary borders" in h and "tiny" in h
    assert fmt_count(a.params_embedding) in h and fmt_count(a.params_total) in h


def test_logit_lens(lm, ids):
    res = vocablens.logit_lens(lm.borders, ids, k=3)
    h = page(res, lm)
    top = res.layers[-1]
    assert shown(lm, top.top_ids[0, 0]) in h and f"{float(top.top_probs[0, 0]):.3f}" in h
    assert f"{float(res.layers[0].entropy[0]):.3f}" in h and f"{float(res.layers[0].kl_to_final[0]):.3f}" in h
    assert f"max |Δp| = {res.model_max_abs_diff:.2e}" in h
    assert len(res.layers) == lm.borders.n_layers + 1 and all(f"\n│ {i} " in h or f"│ {i:>5} │" in h
                                                             for i in range(len(res.layers)))


def test_neighbours(lm):
    res = vocablens.nearest_neighbors(lm.borders, lm.tokenizer, ["class", " the"], k=4)
    h = page(res, lm)
    for q in res.results:
        for lst in q.lists:
            assert shown(lm, lst.ids[0]) in h and f"{float(lst.cosines[0]):.3f}" in h
    assert f"cosine over {res.candidates:,} real tokens" in h


def test_argmax_results(lm):
    ma = vocablens.argmax_for_borders(lm.borders, norm=False)
    h = page(ma, lm)
    for verdict, n in ma.result.counts().items():
        assert verdict in h
    h2 = page(ma.result, lm)
    for verdict, n in ma.result.counts().items():
        assert f"{verdict}" in h2 and f"{n:,}" in h2
    assert f"argmax verdicts over {ma.result.verdict.numel():,} rows" in h2


def test_undertrained(lm):
    from vocablens.undertrained import undertrained

    res = undertrained(lm.borders, lm.tokenizer, candidates=5, verify=False)
    h = page(res, lm)
    assert f"tokenizer classes ({lm.borders.vocab_size:,} rows)" in flat(h)
    for i in res.candidates[:5].tolist():  # the candidates table: id, token, indicator
        assert f"│ {i} " in h or f" {i} │" in h
        assert f"{float(res.indicators.values[i]):.4f}" in h


def test_explain_and_project(lm, ids):
    e = vocablens.explain(lm.borders, ids[None] if ids.dim() == 1 else ids)
    h = page(e, lm)
    assert f"sum of contributions {e.logit_diff_sum:.4f}" in h and f"{e.logit_diff_model:.4f}" in h
    vp = vocablens.project_vectors(lm.borders, [0, 1], [3, 5], k=4)
    h = page(vp, lm)
    assert shown(lm, vp.top_ids[0, 0]).replace("'", "") in h.replace("'", "")


def test_score(lm, ids):
    res = vocablens.score_ids(lm.borders, ids, top_k=2)
    h = page(res, lm)
    assert f"total log-prob {res.total_logprob:.3f} nats" in h and f"perplexity {res.perplexity:.2f}" in h
    assert f"{float(res.logprobs[0]):.3f}" in h and shown(lm, ids[1]) in h


def test_tokens_with_brackets_stay_text(lm):
    """A token such as '[/bold]' is text in the page, never a style (rich markup is off)."""
    tok = lm.tokenizer
    res = vocablens.score_ids(lm.borders, torch.tensor(tok("[/bold] [red]x", add_special_tokens=False).input_ids))
    h = page(res, lm)
    for i in tok("[/bold] [red]x", add_special_tokens=False).input_ids[1:]:
        assert visible(token_str(tok, i)) in h or token_str(tok, i) in h


def test_registered_formatters_in_an_ipython_shell(lm, ids):
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert notebook.register(tokenizer=lm.tokenizer, shell=shell)
        res = vocablens.score_ids(lm.borders, ids)
        data, _ = shell.display_formatter.format(res)
        assert data["text/html"] == notebook.to_html(res, lm.tokenizer)
        assert "per-token log-probabilities (nats)" in data["text/plain"] and "tensor(" not in data["text/plain"]
    finally:
        InteractiveShell.clear_instance()
    assert IPython is not None


def test_import_inside_ipython_registers_by_itself(lm):
    pytest.importorskip("IPython")
    code = f"""
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
import vocablens, torch
lm = vocablens.load({str(lm.tokenizer.name_or_path)!r})
a = vocablens.score_ids(lm.borders, torch.tensor(lm.tokenizer("The class", add_special_tokens=False).input_ids))
data, _ = shell.display_formatter.format(a)
from vocablens.render import notebook
print(sorted(data))
# the tokenizer vocablens.load loaded shows the tokens (without it they would be <id N>)
print(data["text/html"] == notebook.to_html(a, lm.tokenizer) and "<id " not in data["text/plain"])
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split("\n")[:2] == ["['text/html', 'text/plain']", "True"]


def test_outside_ipython_nothing_is_registered():
    p = subprocess.run([sys.executable, "-c", "import sys, vocablens; print('vocablens.render.notebook' in sys.modules)"],
                       capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert p.stdout.strip() == "False"


def test_a_foreign_object_is_refused():
    with pytest.raises(TypeError, match="no display"):
        notebook.to_html(object())
