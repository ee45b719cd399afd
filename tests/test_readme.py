"""README's commands run as written: every shown `$ vocablens ...` line parses with the options it
names, and the quick ones print the numbers README shows."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SRC = str(Path(__file__).resolve().parent.parent / "src")


def readme_commands() -> list[list[str]]:
    """The argv of every `$ vocablens ...` line in README's code blocks (trailing comments dropped)."""
    cmds = []
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\$ vocablens (.*)$", line)
        if m:
            cmds.append(shlex.split(m.group(1), comments=True))
    return cmds


def _run(argv, timeout=600):
    import os

    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-m", "vocablens", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_readme_shows_commands():
    cmds = readme_commands()
    assert len(cmds) >= 12
    assert ["report"] in cmds


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv):
    """Every option a README command uses exists (click parses all options before --help acts)."""
    r = _run([*argv, "--help"], timeout=120)
    assert r.returncode == 0, r.stderr.strip().splitlines()[-1:]


def test_readme_anatomy_numbers():
    """The anatomy example (config only: no weights) prints the numbers README shows."""
    argv = next(a for a in readme_commands() if a[:1] == ["anatomy"])
    r = _run(argv)
    assert r.returncode == 0, r.stderr
    text = README.read_text(encoding="utf-8")
    block = text[text.index("$ vocablens anatomy"):]
    block = block[: block.index("```")]
    shown = re.findall(r"\d{1,3}(?:,\d{3})+", block)            # every integer with thousands separators
    assert len(shown) >= 8
    for number in shown:
        assert number in r.stdout, number
