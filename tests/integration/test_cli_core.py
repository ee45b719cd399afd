"""CLI end to end (in-process): lens, errors, exit codes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vocablens.models.tokens import token_str


def test_lens_json(cli):
    code, out, err = cli("lens", "The capital of France is", "--json", "-k", "3")
    assert code == 0, err
    d = json.loads(out)  # nothing but JSON on stdout
    assert d["layers"][-1]["positions"][0]["top_tokens"][0] == " Paris"
    assert len(d["layers"]) == 31 and len(d["layers"][0]["positions"][0]["top_probs"]) == 3
    assert d["model"]["quantization"] == "Q4_1 GGUF"


def test_lens_table_and_positions(cli):
    code, out, err = cli("lens", "The capital of France is", "--positions", "all", "--layers", "0,30")
    assert code == 0, err
    assert "position 0" in out and "position 4" in out and "Paris" in out


def test_lens_chat_template(cli, smollm2):
    code, out, err = cli("lens", "What is the capital of France?", "--chat", "--prefix", "The capital of France is",
                         "--json", "--layers", "30")
    assert code == 0, err
    d = json.loads(out)
    assert "<|im_start|>" in "".join(d["tokens"])
    assert d["layers"][0]["positions"][0]["top_tokens"][0] == " Paris"


def test_errors_are_one_line_exit_2(cli, tmp_path):
    cases = [
        ("lens", ""),
        ("lens", "x", "-k", "0"),
        ("lens", "x", "--layers", "31"),
        ("lens", "x", "--layers", "a"),
        ("lens", "x", "--model", str(tmp_path / "nope")),
        ("lens", "x", "--positions", "99"),
        ("lens", "x" * 3, "--model", "nobody-here/not-a-model-xyz"),
        ("report", "--prompt", " "),
        ("report", "--out", str(tmp_path / "no" / "dir" / "r.html")),
    ]
    for args in cases:
        code, out, err = cli(*args)
        assert code == 2, (args, code, err)
        lines = err.strip().splitlines()
        assert lines[-1].startswith("error:") and "Traceback" not in err, (args, err)
        assert sum(ln.startswith("error:") for ln in lines) == 1
        assert out == ""


def test_prompt_longer_than_context(cli):
    code, out, err = cli("lens", "hello " * 9000)
    assert code == 2 and "context" in err


#: a child Python that imports this checkout's vocablens (not an installed copy)
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                      os.environ.get("PYTHONPATH", "")])}


def test_console_script_usage_error_exit_2():
    p = subprocess.run([sys.executable, "-m", "vocablens", "lens", "show"], capture_output=True, text=True, env=_ENV)
    assert p.returncode == 2
    p = subprocess.run([sys.executable, "-m", "vocablens", "--help"], capture_output=True, text=True, env=_ENV)
    assert p.returncode == 0 and "lens" in p.stdout and "report" in p.stdout


def test_token_str_readable(smollm2):
    tok = smollm2.tokenizer
    nl = tok("\n", add_special_tokens=False).input_ids
    assert token_str(tok, nl[0]) == "\\n"
    sp = tok(" king", add_special_tokens=False).input_ids
    assert token_str(tok, sp[0]) == " king"


def _python_example(page: str) -> str:
    """The first ``python`` code block of README's "From Python" section (or of a docs page)."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / page).read_text(encoding="utf-8")
    if page == "README.md":
        text = text[text.index("## From Python"):]
    start = text.index("```python") + len("```python")
    return text[start:text.index("```\n", start)]


def test_readme_python_example_runs(smollm2, monkeypatch, capsys):
    """README's Python example runs as written on the handle and prints what the model predicts:
    ' Paris' on top at the last layer, a score whose bits per byte are its nats over the 28 bytes of
    " capital of France is Paris." (the first token is not scored: no BOS), and ' queen' among the
    king's neighbours. Getting started's example is README's plus more lines, run after it in the
    same namespace (the shared part runs once)."""
    import math

    import vocablens

    monkeypatch.setattr(vocablens, "load", lambda spec="smollm2", **kw: smollm2)
    monkeypatch.setenv("COLUMNS", "120")
    readme, started = _python_example("README.md"), _python_example("docs/getting-started.md")
    namespace: dict = {}
    exec(compile(readme, "README.md", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("' Paris']")
    nats, bpb = (float(x) for x in re.match(r"^(-[\d.]+) nats, ([\d.]+) bits per byte$", lines[1]).groups())
    assert bpb == pytest.approx(-nats / (28 * math.log(2)), abs=2e-4)
    assert any("' queen'" in ln for ln in lines[2:])

    assert started.startswith(readme.rstrip("\n")), "Getting started's example begins with README's"
    exec(compile(started[len(readme.rstrip("\n")):], "docs/getting-started.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "Paris" in out and "block" in out.lower()


def test_import_vocablens_is_lazy_and_exposes_entry_points():
    """`import vocablens` loads no torch; every name in __all__ resolves to its entry point."""
    code = ("import sys, vocablens; assert 'torch' not in sys.modules, 'torch imported'; "
            "names = [n for n in vocablens.__all__ if n != '__version__']; "
            "[getattr(vocablens, n) for n in names]; print(len(names))")
    src = str(Path(__file__).parents[2] / "src")
    p = subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, env=_ENV)
    assert p.returncode == 0, p.stderr
    import vocablens

    assert int(p.stdout) == len(vocablens.__all__) - 1
    for name in ("load", "logit_lens", "TunedLens", "nearest_neighbors", "find_unargmaxable", "token_logprobs",
                 "linear_cross_entropy", "expand_vocab", "explain", "Unembedding"):
        assert name in vocablens.__all__ and callable(getattr(vocablens, name))


def test_under_torchrun_only_rank_0_speaks(monkeypatch, capsys):
    """Under torchrun a command that does not split over processes runs on rank 0 alone (with a note),
    and an error is printed once, by rank 0. Failed before: `torchrun --nproc-per-node 2 -m vocablens
    neighbors ' king'` printed every table twice, and a bad argument printed its error line twice."""
    from vocablens.cli.common import run_app

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run_app(["anatomy", "smollm2", "--json"]) == 0  # rank 1: nothing run, nothing printed
    assert capsys.readouterr() == ("", "")
    assert run_app(["score", "   "]) == 2  # a command that splits: same exit code on every rank ...
    assert capsys.readouterr() == ("", "")  # ... but only rank 0 prints the line
    monkeypatch.setenv("RANK", "0")
    assert run_app(["anatomy", "smollm2", "--json"]) == 0
    o, e = capsys.readouterr()
    assert json.loads(o)["models"][0]["vocab_size"] == 49152 and "does not split over processes; rank 0 runs it alone" in e
    assert run_app(["score", "   "]) == 2
    assert capsys.readouterr().err.count("error:") == 1


def test_the_cli_tears_down_the_process_group_it_ran_in(tmp_path, capsys):
    """`torchrun ... vocablens lens train` (and every command that splits over ranks) exited with its
    gloo group still up; a rank then aborted at interpreter shutdown now and then ("terminate called
    without an active exception", SIGABRT) and torchrun reported a command that had succeeded as failed.
    The console entry point (whole_process) now ends the group after the command, ok or not."""
    import torch.distributed as dist

    from vocablens.cli.common import run_app

    for argv, want in ((["anatomy", "smollm2", "--json"], 0), (["score", "   "], 2)):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / argv[0]}", rank=0, world_size=1)
        assert run_app(argv, whole_process=True) == want
        assert not dist.is_initialized()
    assert json.loads(capsys.readouterr().out)["models"][0]["vocab_size"] == 49152
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'lib'}", rank=0, world_size=1)
    try:  # called as a library function (not the whole process), the caller's group is left alone
        assert run_app(["score", "   "]) == 2
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_empty_device_is_an_error(capsys):
    from vocablens.cli.common import run_app

    assert run_app(["score", "hi", "--device", ""]) == 2
    assert capsys.readouterr().err.strip() == "error: --device is empty; use cpu, cuda, cuda:N or mps"


def test_max_memory_is_refused_under_torchrun_before_loading(monkeypatch, capsys):
    """`torchrun ... score --max-memory 200MB` failed after loading with 'the vocab-parallel model needs
    the whole model (it was loaded with its borders only)'; now one line before anything loads."""
    import vocablens.parallel.processes as D
    from vocablens.cli.common import run_app

    monkeypatch.setattr(D, "init_from_env", lambda device="cpu": (0, 2))
    assert run_app(["score", "hi", "--max-memory", "200MB", "--model", "/nonexistent/model"]) == 2
    e = capsys.readouterr().err
    assert e.count("\n") == 1 and "--max-memory does not run under torchrun" in e


def test_help_paragraphs_are_not_cut_mid_sentence(capsys, monkeypatch):
    # typer kept the docstring's line breaks in every paragraph but the first: `score -h` printed
    # "bits per byte" at the end of one line and "divide by ..." alone on the next
    from vocablens.cli import run_app

    monkeypatch.setenv("COLUMNS", "300")
    assert run_app(["score", "--help"]) == 0
    out = capsys.readouterr().out
    assert "bits per byte divide by the bytes of exactly the scored tokens. Under torchrun" in out


def test_trim_heap_gives_freed_heap_pages_back(tmp_path):
    """`neighbors` kept the loaders' freed scratch resident (467 MiB peak; 435 after the trim)."""
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from vocablens.cli.heap import trim_heap\n"
        "def rss():\n"
        "    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
        "a = rss(); xs = [bytearray(4000) for _ in range(20000)]; b = rss()\n"   # ~80 MB of small blocks
        "keep = xs[::4]; del xs; c = rss(); ok = trim_heap(); d = rss()\n"   # 12 kB holes: freed, still resident
        "print(ok, b - a, c - d)\n")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[2] / "src")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True" and int(out[1]) > 60_000         # KiB: the blocks were resident
    assert int(out[2]) > 25_000                                # the trim returned the holes' whole pages
