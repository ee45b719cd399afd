"""Interrupted work and full or read-only disks.

Kill -9: the child is ``python -c CHILD`` that wraps ``os.replace``/``os.rename`` (or safetensors'
``save_file``) so that the process SIGKILLs itself at a chosen rename (after the temporary file or
directory is fully written) or right after a file was half written, then runs the CLI. Production
code has no test hooks. Afterwards the destination holds nothing or its complete old content, the
GGUF cache is not used half-written, and ``lens train --resume`` continues from the last complete
checkpoint.

Disk full: ``RLIMIT_FSIZE`` lowered for the call with ``SIGXFSZ`` ignored (writes fail with EFBIG,
as a full disk fails them with ENOSPC). Read-only: ``mkstemp``/``mkdtemp`` fail with EROFS (we run as
root, so permissions would not stop a write).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tiny_dirs import run_cli as _run
from tiny_dirs import save_tiny, save_tiny_gguf, tiny_tokenizer

CHILD = r"""
import os, signal, sys
mode, nth, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
count = [0]

def die():
    sys.stdout.flush(); sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "rename":  # die at the nth rename of one of our temporary paths (names start with '.'),
    # counting only those into KILL_UNDER when set (the load's own small records, such as the readout
    # check or a file's content hash, are renamed into the cache first)
    under = os.environ.get("KILL_UNDER")
    for name in ("replace", "rename"):
        def wrapped(src, dst, *a, _real=getattr(os, name), **k):
            if under and not os.path.abspath(str(dst)).startswith(under):
                return _real(src, dst, *a, **k)
            if os.path.basename(str(src)).startswith(".") or os.path.basename(str(dst)).startswith("."):
                count[0] += 1
                if count[0] == nth:
                    die()
            return _real(src, dst, *a, **k)
        setattr(os, name, wrapped)
else:  # "write": the nth safetensors file is left half written, then die
    import safetensors.torch as st
    def save_file(tensors, filename, *a, _real=st.save_file, **k):
        _real(tensors, filename, *a, **k)
        count[0] += 1
        if count[0] == nth:
            with open(filename, "r+b") as f:
                f.truncate(os.path.getsize(filename) // 2)
            die()
    st.save_file = save_file
from vocablens.cli.common import run_app
sys.exit(run_app(argv))
"""

SRC = str(Path(__file__).parents[2] / "src")
WORDS = [" one", " two", " three", " four", " five", " six", " dog", " cat"]  # the report's PCA
TEXT = "The class statement defines a new type. An object is an instance of that type.\n" * 12


def _child(mode: str, nth: int, *argv, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
         **(env or {})}
    return subprocess.run([sys.executable, "-c", CHILD, mode, str(nth), *map(str, argv)], env=e,
                          capture_output=True, text=True, timeout=300)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _visible(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if not p.name.startswith("."))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupt")
    tok = tiny_tokenizer(words=WORDS)
    save_tiny(root / "model", tok)
    (root / "notes.txt").write_text(TEXT)
    save_tiny_gguf(root / "tiny.gguf", tiny_tokenizer())
    return root


# ------------------------------------------------------------------------------------ kill -9
def test_expand_killed_before_replacing_keeps_the_old_output(tiny, tmp_path, capsys):
    out = tmp_path / "expanded"
    args = ["expand", "-m", tiny / "model", "--add", " zzq", "--out", out, "--eval-text", TEXT[:200], "--json"]
    assert _run(capsys, *args)[0] == 0
    old = _digest(out)
    p = _child("rename", 1, *args[:-1], "--add", " qqz", "--force")  # the new directory is complete
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert _digest(out) == old  # the complete old output, byte for byte
    assert _run(capsys, "score", "hello", "-m", out)[0] == 0


def test_trim_killed_mid_write_leaves_nothing(tiny, tmp_path):
    out = tmp_path / "trimmed"
    p = _child("write", 1, "trim", "-m", tiny / "model", "--corpus", tiny / "notes.txt", "--out", out)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert not out.exists() and _visible(tmp_path) == []  # only a hidden temporary may be left


def test_report_killed_before_the_rename_keeps_the_old_file(tiny, tmp_path):
    out = tmp_path / "report.html"
    out.write_text("<p>the earlier report</p>")
    p = _child("rename", 1, "report", "-m", tiny / "model", "--out", out, "--budget", "1")
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert out.read_text() == "<p>the earlier report</p>"


def test_lens_train_killed_between_checkpoint_files_resumes_exactly(tiny, tmp_path, capsys):
    from safetensors.torch import load_file

    args = ["lens", "train", "-m", tiny / "model", "--corpus", tiny / "notes.txt", "--steps", "3",
            "--seq-len", "16", "--tokens-per-step", "32", "--checkpoint-every", "1", "--val-fraction", "0"]
    # renames: step s writes checkpoint.safetensors (2s-1) then checkpoint.json (2s); die at the 4th:
    # step 2's tensors are in place, its JSON is not (the old step-1 file is)
    killed = tmp_path / "killed"
    p = _child("rename", 4, *args, "--out", killed, env={"KILL_UNDER": str(killed)})
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert json.loads((killed / "checkpoint" / "checkpoint.json").read_text())["step"] == 1
    code, out, err = _run(capsys, *args, "--out", killed, "--resume", "--json")
    assert code == 0, err
    assert json.loads(out)["resumed_from"] == 2  # the last complete checkpoint, not the stale JSON
    whole = tmp_path / "whole"
    assert _run(capsys, *args, "--out", whole)[0] == 0
    a, b = load_file(str(killed / "lens.safetensors")), load_file(str(whole / "lens.safetensors"))
    assert torch.equal(a["weight"], b["weight"]) and torch.equal(a["bias"], b["bias"])


def test_gguf_cache_killed_while_writing_is_not_used(tiny, tmp_path, monkeypatch, capsys):
    from vocablens.models import load
    from vocablens.models.files.gguf_cache import CACHE_MARK, cache_dir

    cache = tmp_path / "cache"
    gguf = tiny / "tiny.gguf"
    p = _child("rename", 1, "score", "hello world", "-m", gguf, "--json",
               env={"VOCABLENS_CACHE": str(cache), "KILL_UNDER": str(cache / "gguf")})
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    monkeypatch.setenv("VOCABLENS_CACHE", str(cache))
    cdir = cache_dir(gguf)
    assert not cdir.exists()  # the killed writer's directory is a hidden temporary, never read
    left = [d for d in cdir.parent.iterdir() if d.name.startswith(".")]
    assert left and (left[0] / CACHE_MARK).is_file()
    # the next run gives the right answer (the one computed without any cache) and writes the entry
    code, out, _ = _run(capsys, "score", "hello world", "-m", gguf, "--json")
    monkeypatch.setenv("VOCABLENS_CACHE", "off")
    ref = _run(capsys, "score", "hello world", "-m", gguf, "--json")
    assert code == 0 and json.loads(out)["total_logprob"] == json.loads(ref[1])["total_logprob"]
    assert (cdir / CACHE_MARK).is_file()
    # leftovers of killed writers are swept once they are an hour old
    os.utime(left[0], (0, 0))
    monkeypatch.setenv("VOCABLENS_CACHE", str(cache))
    import shutil

    shutil.rmtree(cdir)
    load(str(gguf))
    assert not left[0].exists() and (cdir / CACHE_MARK).is_file()


# ------------------------------------------------------------------------- disk full, read-only
@contextlib.contextmanager
def _file_size_limit(limit: int = 16 * 1024):
    """Files may not grow past ``limit`` bytes inside the block (EFBIG, as ENOSPC on a full disk).

    Only around the command itself: the limit is per process, so held across the test it would also
    stop pytest writing its own report once that passes 16 KiB (a log file, CI's output), and the run
    would end in INTERNALERROR at this test (it did, on CI)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


@pytest.fixture
def disk_full():
    """The command runs under a 16 KiB file-size limit (see :func:`_file_size_limit`)."""
    return _file_size_limit


@pytest.fixture
def read_only(monkeypatch):
    def refuse(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)


WRITERS = {
    "expand": lambda t, out: ["expand", "-m", t / "model", "--add", " zzq", "--out", out, "--eval-text", TEXT[:200]],
    "trim": lambda t, out: ["trim", "-m", t / "model", "--corpus", t / "notes.txt", "--out", out],
    "report": lambda t, out: ["report", "-m", t / "model", "--out", out, "--budget", "1"],
    "lens-train": lambda t, out: ["lens", "train", "-m", t / "model", "--corpus", t / "notes.txt", "--out", out,
                                  "--steps", "1", "--seq-len", "16", "--tokens-per-step", "32", "--val-fraction", "0"],
}


@pytest.mark.parametrize("fault, why", [("disk_full", "file-size limit"), ("read_only", "read-only")])
@pytest.mark.parametrize("command", list(WRITERS))
def test_full_or_read_only_destination(tiny, tmp_path, capsys, request, command, fault, why):
    out = tmp_path / ("r.html" if command == "report" else "out")
    argv = WRITERS[command](tiny, out)
    limit = request.getfixturevalue(fault) or contextlib.nullcontext
    with limit():
        code, stdout, err = _run(capsys, *argv)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "cannot write" in lines[0] and why in lines[0] and "nothing was written" in lines[0], lines[0]
    # no temporary file or directory is left, and the destination holds no partial file
    left = [p for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert left == [], left
    assert not out.exists() or not any(p.is_file() and p.suffix == ".safetensors" for p in out.rglob("*"))


def test_disk_full_case_leaves_pytest_its_own_output(tmp_path):
    """Regression (CI ended in INTERNALERROR at the disk-full cases): with pytest's output going to a
    file already past the 16 KiB limit, the disk-full case still passes and pytest writes its summary."""
    log = tmp_path / "ci.log"
    log.write_bytes(b"x" * 100_000 + b"\n")
    with log.open("ab") as f:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                             f"{__file__}::test_full_or_read_only_destination[report-disk_full-file-size limit]"],
                            stdout=f, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2], timeout=600).returncode
    tail = log.read_text(errors="replace")[100_001:]
    assert rc == 0 and "1 passed" in tail and "INTERNALERROR" not in tail, tail[-2000:]
