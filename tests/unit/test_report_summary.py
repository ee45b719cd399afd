"""`vocablens report`'s stdout is a summary (issue 48, item 13: it was 116 lines, the whole report again,
with the page's path at the very end): a few lines of figures a reader acts on, each equal to an
independent call, then the page's path last; no table."""

from __future__ import annotations

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("summary") / "tiny", tiny_tokenizer())


def test_the_summary_is_the_figures_then_the_path(tiny, tmp_path, capsys):
    import vocablens

    page = tmp_path / "r.html"
    code, out, err = run_cli(capsys, "report", "-m", tiny, "--prompt", PROMPT, "--out", page, "--budget", "5")
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert 4 <= len(lines) <= 12 and "┏" not in out and "│" not in out, out
    assert lines[-1].startswith(f"wrote {page} (") and page.is_file()
    m = vocablens.load(str(tiny))
    a = m.anatomy().value
    both = a.params_embedding + (0 if a.tied else a.params_unembedding)
    assert f"parameters {a.params_total / 1e3:.1f}K; the embedding and the LM head {both / 1e3:.1f}K" in out
    with torch.no_grad():  # the model's own next token after the prompt
        own = m.model(m.encode(PROMPT)).logits[0, -1].argmax().item()
    assert f"prediction {m.tokenizer.convert_ids_to_tokens(own)!r}: the logit lens reads it first from layer" in out
    assert any(line.startswith("  argmax: ") and f"of {m.borders.vocab_size} tokens can never" in line for line in lines)


def test_leads_from_is_the_first_layer_of_the_last_unbroken_run():
    from vocablens.render.report_summary import _leads_from

    def lens(ranks):
        return {"layers": [{"layer": i, "positions": [{"final_top1_rank": r}]} for i, r in enumerate(ranks)]}

    assert _leads_from(lens([3, 0, 1, 0, 0])) == 3  # top-1 at layer 1, lost at 2, held from 3 on
    assert _leads_from(lens([0, 0, 0])) == 0
    assert _leads_from(lens([2, 1, 1])) is None


def test_an_argmax_count_with_undecided_rows_says_it_is_what_was_proved(tmp_path):
    """The qa pass's input: '0 of 49152 tokens can never be the top prediction ... 49137 undecided' read
    as a finding; with undecided rows the count says it is what the budget proved, the rest not counted."""
    from vocablens.render.report_summary import summary_lines

    d = {"model": {"name": "m"}, "out": str(tmp_path / "r.html"),
         "argmax": {"vocab_size": 49152, "counts": {"unargmaxable": 0, "undecided": 49137}}}
    line = next(ln for ln in summary_lines(d) if ln.startswith("  argmax: "))
    assert "0 of 49152" in line and "proved within the budget; 49137 undecided, not counted" in line
    d["argmax"]["counts"] = {"unargmaxable": 3, "undecided": 0}
    line = next(ln for ln in summary_lines(d) if ln.startswith("  argmax: "))
    assert "undecided" not in line and "3 of 49152 tokens can never be the top prediction" in line
