"""User text printed by the CLI is text, never console markup (issue 24): prompts, paths, model names
and tokens holding ``[``, ``]``, ``[/...]`` or ``\\`` print as they are, and no MarkupError escapes."""

from __future__ import annotations

import io
import shutil

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.cli.common import LiteralConsole, literal_markup, print_error

NASTY = ["[/x]", "[/bold]", "[x]", "a[b]c", "[", "]", "\\", "C:\\dir\\", "x\\[y]", "[/]", ":smile:"]
#: lines the error and note channels print whole as text (whatever tags they hold)
OURS = ["[dim]", "x\\[dim]y", "[bold]b[/bold]", "[dim]a[/dim]"]


def _render(*objs) -> str:
    buf = io.StringIO()
    c = LiteralConsole(file=buf, width=200, highlight=False, emoji=False, color_system=None)
    c.print(*objs)
    return buf.getvalue().rstrip("\n")


@pytest.mark.parametrize("s", NASTY)
def test_user_text_inside_our_styles_prints_literally(s):
    # (one of our own tags inside a styled line may pair with ours: such lines go through print_error /
    # print_note, which print the whole message as text; see OURS)
    assert _render(s) == s
    assert _render(f"[dim]loading {s} ...[/dim]") == f"loading {s} ..."
    assert _render(f"[bold]vocablens[/bold] — {s}") == f"vocablens — {s}"


def test_table_cells_and_titles_are_text():
    from rich.table import Table

    t = Table(title="[/t]")
    t.add_column("[/x]")
    for s in ("[/INST]", "[bold]b", "\\[x]"):
        t.add_row(s)
    got = _render(t)
    for s in ("[/t]", "[/x]", "[/INST]", "[bold]b", "\\[x]"):
        assert s in got, got


def test_literal_markup_keeps_only_our_balanced_tags():
    assert literal_markup("[dim]a[/dim]") == "[dim]a[/dim]"
    assert literal_markup("[yellow]n:[/yellow] [/]") == "[yellow]n:[/yellow] \\[/]"
    assert literal_markup("[dim]a [/bold] b[/dim]") == "[dim]a \\[/bold] b[/dim]"


@pytest.mark.parametrize("s", NASTY + OURS)
def test_the_error_line_is_literal_whatever_it_holds(s, capsys):
    print_error(f"no such file {s!s} here")
    assert capsys.readouterr().err.strip() == f"error: no such file {s} here"


@pytest.mark.parametrize("spec", ["[/x]", "a[/bold]\\b[x]", "[bold]m[/bold]"])
def test_anatomy_of_a_bracketed_name_is_one_literal_line(spec, capsys):
    code, out, err = run_cli(capsys, "anatomy", spec)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and out == "", err
    assert repr(spec) in lines[0] or spec in lines[0], lines[0]


def test_a_model_dir_with_brackets_in_its_path(tmp_path, capsys):
    d = tmp_path / "m[/bold]\\[x]"
    save_tiny(d, tiny_tokenizer())
    code, out, err = run_cli(capsys, "lens", "The class", "-m", d, "-k", "1")
    assert code == 0 and "Traceback" not in err, err
    assert str(d) in out + err  # the provenance line names the path as it is
    code, out, err = run_cli(capsys, "lens", "x", "-m", d, "--kind", "tuned", "--lens", tmp_path / "no[/bold]lens")
    assert code == 2 and "Traceback" not in err and "[/bold]" in err, err
    shutil.rmtree(d)


# ------------------------------------------------- our own style tags inside user text (issue 24)
#: tokens (added to a tiny tokenizer) and prompt pieces that hold vocablens's own style tags
OWN = ["[bold]", "[/]", "[red]x[/red]", "[dim]q[/dim]", "[/bold]", "\\["]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """A tiny model whose vocabulary holds OWN as single tokens, in a directory whose name holds our tags."""
    d = tmp_path_factory.mktemp("own") / "m[bold]x[/bold]"
    save_tiny(d, tiny_tokenizer(words=OWN))
    return d


def _ok(code, out, err):
    assert code == 0 and "Traceback" not in err and "MarkupError" not in err, err
    return out + err


def test_score_prints_tokens_holding_our_tags_as_they_are(tagged, capsys):
    text = "[bold][red]x[/red][/][dim]q[/dim][/bold]"
    got = _ok(*run_cli(capsys, "score", text, "-m", tagged, "-k", "1"))
    for tok in ("'[bold]'", "'[red]x[/red]'", "'[/]'", "'[dim]q[/dim]'", "'[/bold]'"):
        assert tok in got, got
    assert str(tagged) in got  # the provenance line names the path with its tags


def test_lens_names_the_position_and_the_path_as_they_are(tagged, capsys):
    got = _ok(*run_cli(capsys, "lens", "The [red]x[/red][dim]q[/dim]", "-m", tagged, "-k", "2"))
    assert "(after '[dim]q[/dim]')" in got and str(tagged) in got, got


def test_neighbors_heads_each_query_with_its_token_as_it_is(tagged, capsys):
    got = _ok(*run_cli(capsys, "neighbors", "[red]x[/red]", "[bold]", "-m", tagged, "-k", "2"))
    assert "neighbours of '[red]x[/red]'" in got and "neighbours of '[bold]'" in got, got


def test_anatomy_names_a_directory_holding_our_tags_as_it_is(tagged, capsys):
    got = _ok(*run_cli(capsys, "anatomy", tagged))
    assert "m[bold]x[/bold]" in got, got
    code, out, err = run_cli(capsys, "anatomy", "[red]x[/red]")
    assert code == 2 and "Traceback" not in err and "[red]x[/red]" in err, err


def test_no_style_tag_in_a_string_of_the_cli_or_render():
    """Our styles are style= arguments and Text spans: a tag inside a string would be the only way for
    user text interpolated beside it to act as markup (the consoles read none)."""
    import ast
    import re
    from pathlib import Path

    from vocablens.cli.console import STYLES

    tag = re.compile(r"\[(/?(" + "|".join(sorted(STYLES, key=len, reverse=True)) + r")|/)\]")
    import vocablens

    src = Path(vocablens.__file__).parent
    found = []
    for p in sorted([*src.glob("cli/*.py"), *src.rglob("render/**/*.py")]):
        if p.name == "console.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and tag.search(node.value):
                found.append(f"{p.name}:{node.lineno}: {node.value[:60]!r}")
    assert found == [], found


def test_the_cli_consoles_print_every_string_as_it_is(capsys):
    from vocablens.cli.console import err, out

    for s in OWN + NASTY + OURS:
        out.print(s, soft_wrap=True)
        err.print(f"note: {s}", style="dim")
        o = capsys.readouterr()
        assert (o.out.rstrip("\n"), o.err.rstrip("\n")) == (s, f"note: {s}"), s
