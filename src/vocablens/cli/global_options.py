"""The options before any command: ``--version``, ``--stats`` (the wall time and the peak memory
(RSS) of a command, on stderr) and ``--dtype`` (the dtype the weights run in), the last two taken
anywhere on the command line."""

from __future__ import annotations

import os
import sys

import typer
from rich.text import Text

from vocablens.cli.console import err


def show_version(value: bool) -> None:
    """``--version``: print ``vocablens X.Y.Z`` on stdout and exit 0."""
    if value:
        from vocablens.version import __version__

        sys.stdout.write(f"vocablens {__version__}\n")
        raise typer.Exit()


def peak_rss_bytes() -> int:
    """This process's peak resident set so far, bytes (``getrusage``: KiB on Linux, bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def take_stats(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--stats`` (anywhere before a ``--``), and whether it was there."""
    cut = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:cut] if a != "--stats"] + args[cut:]
    return kept, len(kept) != len(args)


#: commands with a ``--dtype`` of their own (anatomy's logits dtype): the weights' ``--dtype`` goes
#: before the command's name there (``vocablens --dtype float16 anatomy --load``)
OWN_DTYPE = frozenset({"anatomy"})


def take_dtype(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without the weights' ``--dtype X`` / ``--dtype=X`` (anywhere before a ``--``; before
    the command's name for the commands of :data:`OWN_DTYPE`), and X (None when not given).

    Raises:
        BadInput: ``--dtype`` without a value, or a name that is not a dtype or ``auto``.
    """
    from vocablens.errors import BadInput
    from vocablens.models.files.dtypes import canonical_dtype

    kept, value, i, command = [], None, 0, None
    while i < len(args):
        a = args[i]
        if a == "--":
            kept += args[i:]
            break
        own = command in OWN_DTYPE
        if not own and (a == "--dtype" or a.startswith("--dtype=")):
            if a == "--dtype":
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    raise BadInput("--dtype needs a value: float32, bfloat16, float16 or auto")
                value, i = args[i + 1], i + 2
            else:
                value, i = a.split("=", 1)[1], i + 1
            if value.strip().lower() != "auto":
                canonical_dtype(value, "--dtype")
            continue
        if command is None and not a.startswith("-"):
            command = a
        kept.append(a)
        i += 1
    return kept, value


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere): the wall time a user
    measures with ``time vocablens ...``, Python's start-up and imports included."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def print_stats(t0: float, whole_process: bool = False) -> None:
    """The ``--stats`` line on stderr: wall time of the command (since ``t0``, ``time.perf_counter``),
    of the whole process where it runs the command alone (the console script), and peak RSS."""
    import time

    wall = time.perf_counter() - t0
    age = process_age_s() if whole_process else None
    total = f"{age:.2f} s wall since the process started, {wall:.2f} s in the command" if age else f"{wall:.2f} s wall"
    err.print(Text(f"stats: {total}, peak RSS {peak_rss_bytes() / 2**20:,.1f} MiB", style="dim"),
              soft_wrap=True, highlight=False)
