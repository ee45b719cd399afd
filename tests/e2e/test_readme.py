"""README's commands run as written: every shown `$ vocablens ...` line parses with the options it
names, and the quick ones print the numbers README shows."""

import json
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[list[str]]:
    """The argv of every `$ vocablens ...` line in README's code blocks (trailing comments dropped)."""
    cmds = []
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\$ vocablens (.*)$", line)
        if m:
            cmds.append(shlex.split(m.group(1), comments=True))
    return cmds


def test_readme_shows_commands():
    cmds = readme_commands()
    assert len(cmds) >= 12
    assert ["report"] in cmds


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

    argv = next(a for a in readme_commands() if a[:1] == ["anatomy"])
    monkeypatch.setenv("COLUMNS", "200")               # README's block: a terminal wide enough for 3 models
    code = run_app(argv)
    r = capsys.readouterr()
    assert code == 0, r.err
    text = README.read_text(encoding="utf-8")
    block = text[text.index("$ vocablens anatomy"):]
    block = block[: block.index("```")]
    shown = re.findall(r"\d{1,3}(?:,\d{3})+", block)            # every integer with thousands separators
    assert len(shown) >= 8
    for number in shown:
        assert number in r.out, number
    # the rows README shows are rows the command prints, with the same labels and cells
    label = re.compile(r"^│ (.+?) +│", re.M)
    printed = {m.group(1): line for m, line in ((label.match(ln), ln) for ln in r.out.splitlines()) if m}
    rows = [ln for ln in block.splitlines() if ln.startswith("│")]
    assert len(rows) >= 8
    for row in rows:
        name = label.match(row).group(1)
        assert name in printed, name
        cells = [c.strip() for c in row.split("│")[2:-1]]
        assert cells == [c.strip() for c in printed[name].split("│")[2:-1]], name


def _shown_lens_rows(command: str) -> dict[int, tuple[float, float, int, list[str]]]:
    """README's table under ``$ vocablens lens ...``: layer -> (entropy, KL, rank of final, top tokens)."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index("$ vocablens " + command):]
    block = block[: block.index("```")]
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
    rows = _shown_lens_rows(command)
    assert sorted(rows) == [int(x) for x in argv[argv.index("--layers") + 1].split(",")]
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    got = {ly["layer"]: ly["positions"][0] for ly in json.loads(out)["layers"]}
    for layer, (entropy, kl, rank, tokens) in rows.items():
        assert got[layer]["top_tokens"] == tokens, layer
        assert got[layer]["final_top1_rank"] == rank, layer
        for key, shown in (("entropy", entropy), ("kl_to_final", kl)):
            assert got[layer][key] == pytest.approx(shown, abs=0.002, rel=1e-4), (layer, key)
