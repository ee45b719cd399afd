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
