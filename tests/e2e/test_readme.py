"""README's and the documentation site's commands run as written: every shown `$ vocablens ...` line
(README.md and every page under docs/) parses with the options it names, and the quick ones print the
numbers the page shows."""

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands() -> list[list[str]]:
    """The argv of every `$ vocablens ...` line in the code blocks of README and the docs pages
    (trailing comments dropped; a command shown on several pages once)."""
    cmds = []
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\$ vocablens (.*)$", line)
            if m and shlex.split(m.group(1), comments=True) not in cmds:
                cmds.append(shlex.split(m.group(1), comments=True))
    return cmds


def shown_blocks(command: str) -> list[str]:
    """The output under ``$ vocablens COMMAND`` up to the end of its code block, on every page that
    shows it (at least one)."""
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        start = 0
        while (i := text.find("$ vocablens " + command, start)) >= 0:
            block = text[i:]
            blocks.append(block[: block.index("```")])
            start = i + 1
    assert blocks, f"no page shows `vocablens {command}`"
    return blocks


def test_readme_shows_commands():
    cmds = readme_commands()
    assert len(cmds) >= 12
    assert ["report"] in cmds
    assert "$ vocablens " in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv, capsys):
    """Every option a README command uses exists (click parses all options before --help acts).
    In-process: a subprocess per command cost ~4 s of imports each (the console script's own exit
    codes are tested in test_cli_core)."""
    from vocablens.cli.common import run_app

    code = run_app([*argv, "--help"])
    out = capsys.readouterr()
    assert code == 0, out.err.strip().splitlines()[-1:]
    assert "Usage:" in out.out


def test_readme_command_check_catches_an_unknown_option(capsys):
    """The check above fails for an option a command does not have."""
    from vocablens.cli.common import run_app

    argv = next(a for a in readme_commands() if a[:1] == ["lens"])
    assert run_app([*argv, "--no-such-option", "--help"]) == 2
    assert "--no-such-option" in capsys.readouterr().err


def test_readme_anatomy_numbers(capsys, monkeypatch):
    """The anatomy example (config only: no weights) prints the numbers README shows."""
    from vocablens.cli.common import run_app

    # the side-by-side table (docs/guide/borders.md); other pages show anatomy's errors
    argv = next(a for a in readme_commands() if a[:2] == ["anatomy", "smollm2"])
    monkeypatch.setenv("COLUMNS", "200")               # the page's block: a terminal wide enough for 3 models
    code = run_app(argv)
    r = capsys.readouterr()
    assert code == 0, r.err
    for block in shown_blocks(shlex.join(argv)):
        _check_anatomy_block(block, r.out)


def _check_anatomy_block(block: str, out: str) -> None:
    shown = re.findall(r"\d{1,3}(?:,\d{3})+", block)            # every integer with thousands separators
    assert len(shown) >= 8
    for number in shown:
        assert number in out, number
    # the rows README shows are rows the command prints, with the same labels and cells
    label = re.compile(r"^│ (.+?) +│", re.M)
    printed = {m.group(1): line for m, line in ((label.match(ln), ln) for ln in out.splitlines()) if m}
    rows = [ln for ln in block.splitlines() if ln.startswith("│")]
    assert len(rows) >= 8
    for row in rows:
        name = label.match(row).group(1)
        assert name in printed, name
        cells = [c.strip() for c in row.split("│")[2:-1]]
        assert cells == [c.strip() for c in printed[name].split("│")[2:-1]], name


def _shown_lens_rows(block: str) -> dict[int, tuple[float, float, int, list[str]]]:
    """A page's table under ``$ vocablens lens ...``: layer -> (entropy, KL, rank of final, top tokens)."""
    rows = {}
    for m in re.finditer(r"^│\s+(\d+) │ (.*?)│\s+([\d.]+) │\s+([\d.]+) │\s+(\d+) │$", block, re.M):
        rows[int(m.group(1))] = (float(m.group(3)), float(m.group(4)), int(m.group(5)),
                                 re.findall(r"'(.*?)' \d", m.group(2)))
    return rows


@pytest.mark.parametrize("command", ['lens "The capital of France is" -k 3 --layers 0,10,20,25,28,29,30',
                                     'lens "The capital of France is" --kind tuned -k 3 --layers 0,20,25,29,30'])
def test_readme_lens_output_is_what_lens_prints(cli, command):
    """The lens tables README shows are what `vocablens lens` prints: the same top tokens and ranks,
    entropy and KL to the last digit shown (within 0.002, or 1e-4 of the value: float32 sums differ
    in the last places between CPUs and thread counts; KL 106.839 on one install, 106.843 on another)."""
    argv = shlex.split(command)
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    got = {ly["layer"]: ly["positions"][0] for ly in json.loads(out)["layers"]}
    for block in shown_blocks(command):
        _check_lens_block(block, argv, got)


def _check_lens_block(block: str, argv: list[str], got: dict) -> None:
    rows = _shown_lens_rows(block)
    assert sorted(rows) == [int(x) for x in argv[argv.index("--layers") + 1].split(",")]
    for layer, (entropy, kl, rank, tokens) in rows.items():
        assert got[layer]["top_tokens"] == tokens, layer
        assert got[layer]["final_top1_rank"] == rank, layer
        for key, shown in (("entropy", entropy), ("kl_to_final", kl)):
            assert got[layer][key] == pytest.approx(shown, abs=0.002, rel=1e-4), (layer, key)


def test_readme_is_an_entry_page():
    """README stays short (at most 200 lines) and keeps measurements where they belong: no load
    averages, no internal issue numbers (docs/performance.md carries the figures with their loads)."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert not re.search(r"load average|\bissue \d+|\bissues? #\d+", text, re.I)


def test_readme_links_resolve():
    """Every relative link of README names a file in the repository (and a heading, when it has an
    anchor: the slug GitHub and mkdocs both give a plain-words heading)."""
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(#[^)]*)?\)", text)
    assert len(links) >= 10
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), path
        if anchor:
            slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", target.read_text(encoding="utf-8"), re.M)}
            assert anchor[1:] in slugs, (path, anchor)
