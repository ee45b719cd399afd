"""Layer 0: the one place vocablens writes files, and the one reader of the text files a user gives.

Writing: a temporary path in the destination's directory, — a temporary path in the destination's directory,
the usual permissions, then a rename, so a destination holds either its complete old content or the
complete new one (never a partial file), and a failure leaves nothing behind.

Every writer (the HTML report, figures, JSON, tuned-lens files, checkpoints, edited model
directories, the GGUF cache) goes through :func:`atomic_path` / :func:`atomic_write` /
:func:`atomic_dir`.

Reading: every text file a user hands vocablens (``--file``, ``--corpus``, ``--add-file``, anomaly
inputs ...) goes through :func:`read_text`: a UTF-8 byte-order mark is skipped, UTF-16/UTF-32 are
decoded by their byte-order mark, undecodable bytes are refused with the file's name and the byte
offset (never replaced), and ``-`` is standard input.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import codecs
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from vocablens.errors import BadInput, VocabLensError, WriteFailed

#: byte-order marks, longest first (the UTF-32-LE mark begins with the UTF-16-LE one)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
         (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))

#: the name :func:`read_text` gives standard input in its messages
STDIN = "-"


def decode_text(data: bytes, name: str) -> str:
    """Decode a user's text file: by its byte-order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE; the mark
    is dropped), else as UTF-8. Nothing is replaced.

    Args:
        data: the file's bytes.
        name: how messages name the file (the path the user gave, or ``standard input``).

    Raises:
        BadInput: bytes that do not decode (``NAME: cannot read it as text: byte 0xff at byte
            offset 12 is not UTF-8 ...``),
            with the offset counted in bytes from the start of the file, mark included.
    """
    bom, enc = b"", "utf-8"
    for mark, codec in _BOMS:
        if data.startswith(mark):
            bom, enc = mark, codec
            break
    try:
        return data[len(bom):].decode(enc)
    except UnicodeDecodeError as exc:
        off = len(bom) + exc.start
        label = "UTF-8" if enc == "utf-8" else enc.upper().replace("-LE", " LE").replace("-BE", " BE")
        raise BadInput(f"{name}: cannot read it as text: byte 0x{data[off]:02x} at byte offset {off:,} is not "
                       f"{label} (save the file as UTF-8, or as UTF-16/UTF-32 with a byte-order mark)") from None


def read_text(path: str | os.PathLike, what: str = "") -> str:
    """The text of a file a user gives (see :func:`decode_text`); ``-`` reads standard input.

    Args:
        path: the file, or ``"-"`` for standard input.
        what: the option that named it (``--file``), put before the name in messages.

    Returns:
        The decoded text (str), line endings as in the file.

    Raises:
        BadInput: no such file, a directory, unreadable, or undecodable bytes (name and byte offset).
    """
    pre = f"{what} " if what else ""
    if str(path) == STDIN:
        name = f"{pre}- (standard input)"
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
        return decode_text(data, name)
    name = f"{pre}{path}"
    p = Path(path).expanduser()
    if p.is_dir():
        raise BadInput(f"{name}: cannot read it: it is a directory, not a text file")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"{name}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{name}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    return decode_text(data, name)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def publish_mode(path: str | os.PathLike, directory: bool = False) -> None:
    """Give a temporary file (0666) or directory (0777) the usual permissions minus the umask:
    ``mkstemp``/``mkdtemp`` make them 0600/0700, and the rename would carry that onto the user's path."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def _explain(err: OSError, path: Path) -> WriteFailed:
    why = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
           errno.EACCES: "permission denied", errno.EPERM: "permission denied",
           errno.ENOENT: "its directory does not exist", errno.EDQUOT: "the disk quota is exceeded",
           errno.EFBIG: "the file is larger than the file system or the file-size limit (ulimit -f) allows",
           }.get(err.errno, err.strerror or type(err).__name__)
    return WriteFailed(f"cannot write {path}: {why}; nothing was written (choose another path or free space)")


def _os_error(exc: BaseException) -> OSError | None:
    """The OS error behind a writer's exception: the exception itself, its cause, or the errno that
    libraries written in Rust or C++ only put in their message (safetensors: ``(os error 28)``)."""
    if isinstance(exc, VocabLensError) or not isinstance(exc, Exception):
        return None  # our own errors (OutputExists ...), KeyboardInterrupt: as they are
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__
    m = re.search(r"os error (\d+)", str(exc))
    if m:
        n = int(m.group(1))
        return OSError(n, os.strerror(n))
    return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary file path next to ``path``; on a clean exit it is renamed onto ``path``
    with the usual permissions, on any exception it is removed and ``path`` is untouched.

    Args:
        path: the destination file.
        suffix: the temporary file's suffix (default: the destination's, so writers that choose a
            format by suffix — plotly HTML vs matplotlib PNG — still see it).

    Raises:
        WriteFailed: the directory is missing, read-only or full (an ``OSError`` of the writer too).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix if suffix is None else suffix,
                                   dir=directory)
    except OSError as e:
        raise _explain(e, path) from None
    os.close(fd)
    try:
        yield Path(tmp)
        publish_mode(tmp)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _explain(e, path) from None
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        oe = _os_error(e)
        if oe is None:
            raise
        raise _explain(oe, path) from None


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically (see :func:`atomic_path`).

    Raises:
        WriteFailed: as :func:`atomic_path`.
    """
    path = Path(path)
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on a clean exit it replaces ``path`` (an existing
    one is moved aside first and removed after the swap), with the usual permissions on the directory
    and its files. On an exception the temporary directory is removed and ``path`` is untouched.

    Checking whether ``path`` may be replaced (``--force``) is the caller's job.

    Raises:
        WriteFailed: the parent is missing, read-only or full.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as e:
        raise _explain(e, path) from None
    try:
        yield tmp
        publish_mode(tmp, directory=True)
        for f in tmp.rglob("*"):
            publish_mode(f, directory=f.is_dir())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.rmdir(old)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _explain(e, path) from None
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        oe = _os_error(e)
        if oe is None:
            raise
        raise _explain(oe, path) from None


__all__ = ["STDIN", "WriteFailed", "atomic_dir", "atomic_path", "atomic_write", "decode_text", "publish_mode",
           "read_text"]
