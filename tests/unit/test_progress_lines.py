"""Progress in the stretches that were silent (issue 25): `bottleneck` after loading, `steer` after
"measuring N vectors", `trim` while it tokenizes the corpus. On a stderr that is not a terminal (pytest's
capture, a log file, CI) each step prints plain lines: the stage when it starts, how far it is
(done/total units), and when it is done. A tiny random model; the real one only changes the sizes."""

from __future__ import annotations

import re

import pytest

from tiny_dirs import _corpus, run_cli, save_tiny, tiny_tokenizer

ANSI = "\x1b["


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("progress") / "tiny", tiny_tokenizer())


def stages(err: str, name: str) -> dict[str, tuple[int, str]]:
    """stage -> (total, its done line) from the plain progress lines of one command."""
    started = dict((m.group(1), int(m.group(2).replace(",", "")))
                   for m in re.finditer(rf"^{name}: stage (.+?) started \(([\d,]+) ", err, re.M))
    done = {m.group(1): m.group(0) for m in re.finditer(rf"^{name}: stage (.+?) done \(([\d,]+) .* s\)$", err, re.M)}
    return {s: (t, done.get(s, "")) for s, t in started.items()}


def test_bottleneck_shows_its_forward_pass_and_both_grams(tiny, capsys):
    code, out, err = run_cli(capsys, "bottleneck", "-m", tiny, "--contexts", "80", "--seq-len", "16")
    assert code == 0, err
    st = stages(err, "bottleneck")
    assert set(st) == {"forward", "Gram of W", "spectrum of W", "log-normaliser over V", "Gram of the log-probabilities",
                       "spectrum of the log-probabilities"}, err
    assert st["spectrum of W"][0] == 64 and st["spectrum of the log-probabilities"][0] == 80  # d, N
    assert st["forward"][0] == 5  # 80 contexts in rows of 16 tokens
    assert st["Gram of W"][0] == 300 and st["log-normaliser over V"][0] == 300  # the V rows of W
    assert all(line for _, line in st.values()), err  # every stage ends with its done line
    assert ANSI not in err and "rank" in out


def test_steer_shows_each_forward_pass_unsteered_and_steered(tiny, capsys):
    code, out, err = run_cli(capsys, "steer", "-m", tiny, "--promote", " the", "--top-n", "2",
                             "--prompt", "The class statement", "--new-tokens", "3")
    assert code == 0, err
    st = stages(err, "steer")
    # one unit per probe text and set (1), per held-out text (4), and the continuation (1)
    assert st == {"unsteered": (6, st["unsteered"][1]), "steered": (6, st["steered"][1])}, err
    assert st["unsteered"][1] and st["steered"][1]
    assert err.index("stage unsteered started") > err.index("measuring 2 vectors")
    assert ANSI not in err


def test_trim_counts_the_documents_it_tokenizes_and_compares(tiny, tmp_path, capsys):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    texts = _corpus()
    for i in range(70):  # 70 documents: two batches of 64
        (corpus / f"{i:02d}.txt").write_text(f"{i} {texts[i % len(texts)][:200]}")
    code, out, err = run_cli(capsys, "trim", "-m", tiny, "--corpus", corpus, "--out", tmp_path / "trimmed")
    assert code == 0, err
    st = stages(err, "trim")
    assert st["tokenizing the corpus"][0] == 70 and st["comparing tokenizations"][0] == 70, err
    assert "trim: stage tokenizing the corpus done (70 documents in" in err
    assert "trim: stage comparing tokenizations done (70 documents in" in err
    assert ANSI not in err


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _script(args: list[str], timeout: int) -> "subprocess.CompletedProcess":
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)  # stderr is a pipe: not a terminal


@pytest.mark.browser
def test_screenshots_script_shows_its_steps(tmp_path):
    from browser import require_browser

    require_browser()
    page = tmp_path / "r.html"  # what the script waits for: a drawn figure, and sections under <main>
    page.write_text("<html><body><div class='figure'><svg class='main-svg' width='10' height='10'></svg></div><main>"
                    + "".join(f"<section id='s{i}'><h2>section {i}</h2></section>" for i in range(3)) + "</main></body></html>")
    p = _script(["docs/screenshots.py", str(page), str(tmp_path / "png")], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == [str(tmp_path / "png" / f"report-s{i}.png") for i in range(3)]
    assert "screenshots: stage start chromium, draw the figures started (3 steps)" in p.stderr
    assert "screenshots: stage section screenshots started (3 steps)" in p.stderr
    assert "screenshots: stage section screenshots done (3 steps in" in p.stderr and ANSI not in p.stderr
