"""Small CLI items (issues 24, 25): --version, the top-level help of `lens`, --stats, counts and sizes
as a reader sees them, and sampling at the smallest temperatures through `generate`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.cli.global_options import take_stats
from vocablens.units import fmt_bytes, noun, plural

SRC = str(Path(__file__).resolve().parents[2] / "src")
STATS = re.compile(r"^stats: .*?([\d.]+) s (?:wall|in the command).*peak RSS ([\d,.]+) MiB$", re.M)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("small") / "tiny", tiny_tokenizer())


def test_version(capsys):
    from vocablens import __version__

    code, out, err = run_cli(capsys, "--version")
    assert code == 0 and out == f"vocablens {__version__}\n" and err == ""


def test_top_level_help_names_the_logit_lens(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    line = next(ln for ln in out.splitlines() if re.search(r"│ lens\s", ln))
    assert "logit lens" in line and "vocablens lens PROMPT" in line, line


def test_stats_on_stderr_with_json_on_stdout(tiny, capsys):
    code, out, err = run_cli(capsys, "score", "The class statement", "-m", tiny, "--json", "--stats")
    from transformers import AutoTokenizer

    # the tokenizer's own count (BOS <s> first); every token after the first is scored
    ids = AutoTokenizer.from_pretrained(str(tiny))("The class statement").input_ids
    d = json.loads(out)
    assert code == 0 and (d["n_tokens"], d["n_scored"]) == (len(ids), len(ids) - 1)
    assert [t["id"] for t in d["tokens"]] == ids[1:]
    m = STATS.search(err)
    assert m, err
    rss = float(m.group(2).replace(",", ""))
    assert 50 < rss < 64 * 1024  # MiB: a Python process with torch, below the machine
    code, _, err = run_cli(capsys, "--stats", "anatomy", str(tiny / "nope"))
    assert code == 2 and STATS.search(err) and err.count("error:") == 1, err  # also after an error


def test_stats_as_its_own_process_counts_start_up():
    env = dict(os.environ, PYTHONPATH=SRC)
    r = subprocess.run([sys.executable, "-m", "vocablens", "--version", "--stats"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("vocablens ")
    m = re.search(r"stats: ([\d.]+) s wall since the process started, ([\d.]+) s in the command", r.stderr)
    assert m and float(m.group(1)) >= float(m.group(2)), r.stderr


def test_take_stats_leaves_text_after_double_dash():
    assert take_stats(["lens", "x", "--stats"]) == (["lens", "x"], True)
    assert take_stats(["lens", "--", "--stats"]) == (["lens", "--", "--stats"], False)
    assert take_stats(["lens", "x"]) == (["lens", "x"], False)


def test_counts_and_sizes():
    assert [plural(n, "token") for n in (0, 1, 2, 1234)] == ["0 tokens", "1 token", "2 tokens", "1,234 tokens"]
    assert plural(1, "matrix") == "1 matrix" and plural(2, "matrix") == "2 matrices"
    assert plural(2, "entry") == "2 entries" and plural(2, "day") == "2 days" and noun(1, "is") == "is"
    assert noun(3, "is") == "are" and plural(1.0, "row") == "1 row"
    assert fmt_bytes(805_306_368) == "768.00 MiB" and fmt_bytes(2_489_319_424) == "2.32 GiB"
    assert fmt_bytes(196_608) == "192.00 KiB" and fmt_bytes(512) == "512 B"


def test_no_decimal_units_in_anatomy(capsys):
    code, out, _ = run_cli(capsys, "anatomy", "qwen3-0.6b")
    assert code == 0 and "2.32 GiB" in out
    assert not re.search(r"\d (GB|MB|KB)\b", out), out


def test_one_token_reads_singular(tiny, capsys):
    code, _, err = run_cli(capsys, "generate", "The class", "-m", tiny, "-n", "1")
    assert code == 0 and "1 new token in" in err and "1 new tokens" not in err, err


@pytest.mark.parametrize("t", ["1e-40", "1e-45", "5e-324"])
def test_generate_at_tiny_temperatures_is_greedy(t, tiny, capsys):
    # temperature 1e-40 ended in "RuntimeError: probability tensor contains inf/nan" (exit 1)
    code, greedy, err = run_cli(capsys, "generate", "The class", "-m", tiny, "-n", "8", "--json")
    assert code == 0, err
    code, cold, err = run_cli(capsys, "generate", "The class", "-m", tiny, "-n", "8", "--json", "--temperature", t,
                              "--top-p", "0.9", "--seed", "3")
    assert code == 0 and "Traceback" not in err, err
    a, b = json.loads(greedy), json.loads(cold)
    assert [x["id"] for x in a["tokens"]] == [x["id"] for x in b["tokens"]] and len(a["tokens"]) == 8
    assert a["text"] == b["text"]


# ------------------------------------------------------------------ invisible characters in tokens (issue 25)
INVISIBLE = [
    (" \u200b\u200b", " \\u200b\\u200b", "␣\\u200b\\u200b"),   # space + two zero-width spaces (the lens table's blank)
    ("\ufeff", "\\ufeff", "\\ufeff"),                          # BOM (Cf)
    ("\u00ad", "\\u00ad", "\\u00ad"),                          # soft hyphen (Cf)
    ("a\u2028b", "a\\u2028b", "a\\u2028b"),                    # line separator (Zl)
    ("\u2029", "\\u2029", "\\u2029"),                          # paragraph separator (Zp)
    ("\u2003x", "\\u2003x", "\\u2003x"),                       # em space (Zs other than " ")
    ("\u00a0", "\\u00a0", "⍽"),                                # no-break space: its own marker
    ("\u0301", "\\u0301", "\\u0301"),                          # a combining acute with nothing to sit on
    (" \u0301", " \\u0301", "␣\\u0301"),                       # ... or only a space
    ("e\u0301", "e\u0301", "e\u0301"),                         # on a base: an é, shown as it is
    ("\x1b[0m", "\\x1b[0m", "\\x1b[0m"),                       # ESC (Cc)
    ("\x85", "\\u0085", "\\u0085"),                            # NEL, a C1 control
    ("x\U000e0041", "x\\U000e0041", "x\\U000e0041"),           # a tag character beyond the BMP (Cf)
    ("\\u200b", "\\\\u200b", "\\\\u200b"),                     # a backslash and text: not an escape
    ("\n\t", "\\n\\t", "⏎⇥"),
]


@pytest.mark.parametrize("raw, as_json, in_tables", INVISIBLE, ids=[repr(r) for r, _, _ in INVISIBLE])
def test_invisible_characters_are_shown(raw, as_json, in_tables):
    from vocablens.models.tokens import show_bytes, shown_to_bytes
    from vocablens.render.tokens import visible

    s = show_bytes(raw.encode())
    assert s == as_json and shown_to_bytes(s) == raw.encode()
    assert visible(s) == in_tables


def test_a_zero_width_token_in_a_table_and_in_json():
    import io

    from rich.table import Table

    from vocablens.cli.console import LiteralConsole
    from vocablens.models.tokens import token_str
    from vocablens.render.tokens import display_token

    tok = tiny_tokenizer(words=[" \u200b\u200b", "\u2060"])
    ids = [tok.convert_tokens_to_ids(w) for w in (" \u200b\u200b", "\u2060")]
    assert [token_str(tok, i) for i in ids] == [" \\u200b\\u200b", "\\u2060"]
    t = Table()
    t.add_column("token")
    for i in ids:
        t.add_row(display_token(tok, i))
    buf = io.StringIO()
    LiteralConsole(file=buf, width=80, color_system=None).print(t)
    assert "␣\\u200b\\u200b" in buf.getvalue() and "\\u2060" in buf.getvalue()
    assert "\u200b" not in buf.getvalue() and "\u2060" not in buf.getvalue()


def test_piped_stdout_width_is_decided_at_print_time_not_at_import(monkeypatch):
    """The failing order: the console made while a test had COLUMNS set, a later test printing
    without it got rich's 80-column fallback and explain's header wrapped (test_naming's table test
    failed under pytest-xdist). Now: COLUMNS when set, else 120 when piped, read at each print."""
    from vocablens.cli.console import PIPED_WIDTH, _StdoutConsole

    monkeypatch.setenv("COLUMNS", "90")
    c = _StdoutConsole(highlight=False, soft_wrap=False)   # made while COLUMNS is set, as stdout's
    assert c.width == 90
    monkeypatch.delenv("COLUMNS")
    assert c.width == PIPED_WIDTH == 120            # its file is pytest's capture: not a terminal
    monkeypatch.setenv("COLUMNS", "300")
    assert c.width == 300
    c.width = 50                                    # an explicit width still wins
    assert c.width == 50
