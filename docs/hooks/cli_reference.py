"""mkdocs hook: the CLI reference page (``cli.md``), written at build time from the typer app.

Every command of ``vocablens.cli.app`` (and its sub-commands) becomes a section: its help text, its
usage line, and one bullet per argument and option with type, default and help, read from the click
objects typer builds. Nothing is fetched; the page cannot drift from ``vocablens COMMAND --help``.
Registered in ``mkdocs.yml`` under ``hooks:``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")   # this checkout's vocablens, also when not installed

PAGE = "cli.md"

_CODE = re.compile(r"(`[^`]*`)")


def _text(s: str) -> str:
    """Help text as markdown: code spans kept, ``<`` and ``*`` outside them escaped (``<unusedN>``
    would otherwise be read as an HTML tag, ``*`` as emphasis)."""
    parts = _CODE.split(s or "")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "".join(parts)


def _param(p, ctx) -> str:
    """One bullet: the option's names and type, then its help with the default, as ``--help`` shows them."""
    record = p.get_help_record(ctx)
    if record is None:
        return ""
    names, help_ = record
    return f"- `{names}`: {_text(help_)}".rstrip(": ")


def _section(cmd, path: list[str], ctx, level: int) -> list[str]:
    """The markdown of ``cmd`` (a click command or group built by typer) and of its sub-commands."""
    shown = cmd
    if getattr(cmd, "default_command", None) in getattr(cmd, "commands", {}):
        shown = cmd.commands[cmd.default_command]       # `lens PROMPT` runs `lens show PROMPT`
    sub = shown.context_class(shown, info_name=path[-1], parent=ctx)
    lines = [f"{'#' * level} `{' '.join(path)}`", ""]
    help_ = (shown.help or cmd.help or "").strip()
    if help_:
        lines += [_text(help_), ""]
    usage = " ".join([*path, *shown.collect_usage_pieces(sub)])
    lines += ["```", usage, "```", ""]
    params = [b for b in (_param(p, sub) for p in shown.params) if b]
    lines += params + ([""] if params else [])
    if hasattr(cmd, "commands"):
        for name in cmd.list_commands(sub):
            if name != getattr(cmd, "default_command", None):
                lines += _section(cmd.commands[name], [*path, name], sub, level + 1)
    return lines


def cli_reference() -> str:
    """The whole page: the root options, then every command in the order ``--help`` lists them."""
    if SRC not in sys.path:
        sys.path.insert(0, SRC)
    import typer.main

    import vocablens.cli

    root = typer.main.get_command(vocablens.cli.app)
    ctx = root.context_class(root, info_name="vocablens")
    lines = ["# CLI reference", "",
             "Generated from the command line itself when this site is built: the same text as "
             "`vocablens COMMAND --help`. Every command that loads a model takes `--model` (default `smollm2`; "
             "a model directory, a `.gguf` file or a cached hub id) and `--json`. Bad input is one line on "
             "stderr and exit code 2.", "",
             "Options of `vocablens` itself:", ""]
    lines += [b for b in (_param(p, ctx) for p in root.params) if b] + [""]
    for name in root.list_commands(ctx):
        lines += _section(root.commands[name], ["vocablens", name], ctx, 2)
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """Add the generated page to the site's files (mkdocs >= 1.6: ``File.generated``)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=cli_reference()))
    return files
