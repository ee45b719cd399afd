"""``print(result.table())`` prints the tables, not ``<rich.console.Group object at ...>`` (issue 48, item
14): ``.table()`` is still the rich Group the command prints (a rich console draws it in colour), and its
``str()`` is the same text a rich console prints at the notebook width, for every kind of result."""

from __future__ import annotations

import pytest

from tiny_dirs import save_tiny, tiny_tokenizer

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("tables") / "m", tiny_tokenizer())
    return vocablens.load(str(d))


def _results(m) -> dict:
    """One result of each kind a few seconds of a tiny model can make."""
    words = sorted(w for w in m.tokenizer.get_vocab() if w.isascii() and w.isalpha() and len(w) > 1)[:8]
    return {"anatomy": m.anatomy(), "tie_check": m.tie_check(), "neighbors": m.neighbors(words[0], k=3),
            "pca": m.pca(words, prefix=""), "lens": m.lens(PROMPT, k=2), "score": m.score(PROMPT),
            "explain": m.explain(PROMPT, k=3), "project": m.project(words[0], k=3),
            "generate": m.generate("the cat", max_new_tokens=3),
            "trajectory": m.trajectory(PROMPT, kinds=("logit",)),
            "backward": m.backward_lens(PROMPT, target=m.tokenizer.convert_ids_to_tokens(5), k=2)}


def test_print_shows_the_tables_of_every_kind(m, capsys):
    from rich.console import Console, Group

    from vocablens.render.notebook import WIDTH

    results = _results(m)
    assert {r.kind for r in results.values()} == set(results)
    for kind, res in results.items():
        t = res.table()
        assert isinstance(t, Group), kind  # still what rich draws (the CLI's and Console.print's renderable)
        rich_console = Console(record=True, width=WIDTH, file=open("/dev/null", "w"))
        rich_console.print(t)
        capsys.readouterr()
        print(t)
        printed = capsys.readouterr().out
        assert printed == rich_console.export_text().rstrip("\n") + "\n", kind
        assert "rich.console" not in printed and "object at 0x" not in printed and printed.strip(), kind
        assert repr(t) == str(t)  # at a prompt too


def test_no_result_kind_draws_its_table_another_way():
    """Every kind's ``.table()`` is the one above: no result class has a ``table`` of its own, and
    every kind the renderers know has its result class."""
    import vocablens.handle.results as R
    from vocablens.render.shown import RENDERERS

    classes = [c for c in vars(R).values() if isinstance(c, type) and issubclass(c, R.Result) and c is not R.Result]
    assert all("table" not in vars(c) for c in classes)
    assert {c.kind for c in classes} <= set(RENDERERS)
    assert len(classes) >= 23
