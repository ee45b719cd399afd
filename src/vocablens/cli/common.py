"""Shared CLI machinery: the app, common options, model loading with progress, JSON output, errors."""

from __future__ import annotations

import dataclasses
import os
import sys
from contextlib import contextmanager
from typing import Annotated, Any, Callable, Optional, Sequence

# transformers' GGUF dequantization bar (plain tqdm) reads this when tqdm is imported; we show our own.
os.environ.setdefault("TQDM_DISABLE", "1")

import typer  # noqa: E402

try:  # recent typer releases carry their own copy of click; its exceptions are those
    from typer._click import exceptions as click_exc  # noqa: E402
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc  # noqa: E402
from rich.text import Text  # noqa: E402
from typer.core import TyperGroup

from vocablens.cli.console import (  # noqa: F401  (re-exported: the commands print through these)
    LiteralConsole, err, literal_markup, out, print_error, print_note,
)
from vocablens.cli.damaged import refuse_nonfinite
from vocablens.cli.torchrun import leave_process_group, splits_over_ranks, torchrun_rank, tp_refusal
from vocablens.cli.heap import trim_heap, tune_heap  # noqa: F401  (re-exported for the commands)
from vocablens.cli.global_options import print_stats, show_version, take_dtype, take_stats
from vocablens.cli import placement
from vocablens.cli.placement import DeviceOpt, resolve_device  # noqa: F401  (re-exported for the commands)
from vocablens.errors import BadInput, VocabLensError
from vocablens.models.files.spec import DEFAULT_MODEL

app = typer.Typer(
    name="vocablens",
    help="The embedding and the unembedding (LM head) of decoder-only language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=show_version,
                                          help="Print the version and exit.")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="After the command, print its wall time and the process's "
                                        "peak memory (RSS, MiB) to stderr; also taken after the command's name "
                                        "(`vocablens report --stats`).")] = False,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="The dtype the weights run in: float32, bfloat16, "
                                                 "float16, or auto (the checkpoint's). Default: the checkpoint's, "
                                                 "except float16 runs in float32 on the CPU. Also taken after "
                                                 "the command's name (anatomy's own --dtype is its logits').")] = None,
    device_map: Annotated[Optional[str], typer.Option("--device-map", help="One model over several devices of "
                          "this machine (accelerate): auto, balanced, sequential or FILE.json ({module: device}; "
                          "devices 0, 1, cpu, disk); taken anywhere, by every command that runs the model. With it "
                          "--max-memory caps each device (0=70GiB,1=70GiB,cpu=200GiB); without it --max-memory "
                          "streams blocks from the checkpoint (one small machine's last resort).")] = None,
    offload_folder: Annotated[Optional[str], typer.Option("--offload-folder", help="With --device-map: where "
                              "weights put on disk are kept (default: a temporary folder).")] = None,
) -> None:
    """The embedding and the unembedding (LM head) of decoder-only language models."""


ModelOpt = Annotated[str, typer.Option("--model", "-m", help=f"{DEFAULT_MODEL} (default), a model directory, a .gguf file or a hub id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout, nothing else on stdout.")]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Allow the model's own Python code (off by default).")]
MaxMemOpt = Annotated[str, typer.Option("--max-memory", help="Keep at most this much of the weights in memory "
                                        "(e.g. 200MB, 2GiB); the other blocks are read from the checkpoint at each "
                                        "forward. With --device-map: each device's cap (0=70GiB,cpu=200GiB).")]
TpOpt = Annotated[bool, typer.Option("--tp", help="Under torchrun: the model split over the ranks by transformers' tensor parallel (tp_plan=auto): 1/N of every block and of the LM head's rows on each. Several machines: torchrun's rendezvous.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Weights dtype: float32 (default for GGUF), bfloat16, float16, auto.")]


class DefaultCommandGroup(TyperGroup):
    """A group whose first argument, when it names no subcommand, goes to the ``show`` command.

    ``vocablens lens PROMPT`` runs ``lens show PROMPT`` while ``vocablens lens train`` runs ``train``.
    """

    default_command = "show"

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def parse_int_list(text: str | None, option: str) -> list[int]:
    """``"0,10, 20"`` -> ``[0, 10, 20]`` (None or blank -> ``[]``): the CLI's one parser of integer lists.

    Raises:
        BadInput: an item that is not an integer (the message names ``option``, e.g. ``--layers``).
    """
    try:
        return [int(x) for x in str(text or "").split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"{option} takes comma-separated integers; got {text!r}") from None


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (NaN/inf become null): :func:`vocablens.render.json.dumps`."""
    from vocablens.render.json import dumps

    sys.stdout.write(dumps(obj))
    sys.stdout.flush()


def show(result, json_: bool, *, options: dict | None = None, plot: str = "", printed: Callable[[], Any] | None = None,
         notes: Sequence[str] = (), note_style: str | None = "dim") -> None:
    """How every command ends: ``result`` on stdout as its ``--json`` (:func:`vocablens.render.shown.to_json`)
    or the table it prints (:func:`vocablens.render.shown.print_result`; ``printed()`` instead where given:
    ``generate``'s streamed tail), then, after a table, ``notes`` on stderr in ``note_style``. ``options`` are
    merged into the result's first (``settle``: its ``--plot`` path); ``plot``: a path the result's figure
    is written to before anything is printed (one HTML page, atomically)."""
    import dataclasses

    from vocablens.files import atomic_path
    from vocablens.render.shown import figure, print_result, to_json

    result = dataclasses.replace(result, options={**result.options, **options}) if options else result
    if plot:
        with atomic_path(plot) as tmp:
            figure(result).write_html(str(tmp), include_plotlyjs=True)
    if json_:
        return emit_json(to_json(result))
    printed() if printed is not None else print_result(result, out)
    for line in notes:
        err.print(line, style=note_style)


@contextmanager
def status(msg: str, quiet: bool = False):
    """A spinner on stderr while a step runs; on a stderr that is not a terminal, the message and then
    a line every 10 s with the time so far (:class:`~vocablens.cli.progress.PlainStatus`)."""
    if quiet:
        yield
        return
    if not err.is_terminal:
        from vocablens.cli.progress import plain_status

        beat = plain_status(msg)
        try:
            yield
        finally:
            beat.close()
        return
    with err.status(Text(msg)):
        yield


#: the global ``--dtype`` of the command running now (:func:`run_app` sets it, then clears it)
_WEIGHTS_DTYPE: str | None = None


def load_model(spec: str, mode: str = "full", *, quiet: bool = False, device: str = "cpu", **options):
    """Load a model for a command, with progress on stderr; returns a :class:`vocablens.Model`.

    The command names the mode of the one loader (:func:`vocablens.models.files.loader.load_mode`:
    ``full``, ``borders``, ``head``, ``matrices`` or ``streaming``); ``options`` are that function's
    (``dtype``, ``trust_remote_code``, ``max_memory``, ``blocks``, ``value_vectors``). ``device``: where
    the weights go (:func:`resolve_device`; the loader places them); analyses then compute there.
    The global ``--dtype`` is the ``dtype`` unless the command gives one; the provenance's notes
    (a float16 checkpoint run in float32 ...) are printed as notes.
    """
    import time

    from vocablens.models.files.loader import load_mode

    device = resolve_device(device)
    mode, options = placement.placed(mode, device, options)  # --device-map: the whole model, placed
    if mode == "streaming":  # a bad size or device is one line (in the CLI's words), before anything loads
        from vocablens.models.files.streaming import parse_bytes

        parse_bytes(options.get("max_memory"))
        if device != "cpu":
            raise BadInput("--max-memory streams blocks through CPU memory; run it without --device")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantization bar; we show our own
    _quiet_libraries()
    t0 = time.perf_counter()
    what = f"loading {spec}{_load_source(spec)} ..."
    if _WEIGHTS_DTYPE is not None:
        options.setdefault("dtype", _WEIGHTS_DTYPE)
    with status(what, quiet=quiet):
        lm = load_mode(spec, mode, device=device, **options)
    from vocablens.handle import Model

    lm = Model.of(lm, spec=str(spec))  # the handle: the commands call its workflows
    lm.provenance = cli_provenance(lm.provenance)
    refuse_nonfinite(lm)  # the one check every command passes through
    trim_heap()  # the loaders' freed scratch (tokenizer and config parsing) leaves the resident set
    if not quiet:
        err.print(f"loaded {lm.provenance.describe()} in {time.perf_counter() - t0:.1f} s", style="dim")
        for note in lm.provenance.notes:
            print_note(note)
        streamed = getattr(lm.model, "vocablens_streamers", None)
        if mode == "streaming" and streamed is not None:
            n = len(lm.borders.blocks)
            err.print(f"--max-memory {options['max_memory']}: {n - len(streamed)} of {n} blocks resident, "
                      f"{len(streamed)} read from the checkpoint at each forward", style="dim")
    return lm


def _load_source(spec: str) -> str:
    """What loading ``spec`` reads, for the loading line: ``" (first load of F.gguf: dequantizing ...)"``
    when a GGUF file has no cache entry yet, ``" (F.gguf, from its float32 cache)"`` when it has one,
    else ``""`` (a model directory or a hub id: the name says it)."""
    from vocablens.models.files.gguf_cache import CACHE_MARK, FIRST_LOAD_S_PER_MIB, cache_dir, first_load_seconds
    from vocablens.models.files.source import resolve_source

    try:
        source = resolve_source(spec)
        kind, path = source.kind, source.path
        cdir = cache_dir(path) if kind == "gguf" else None
    except (VocabLensError, OSError):
        return ""  # the load itself says what is wrong
    if kind != "gguf":
        return ""
    if cdir is not None and (cdir / CACHE_MARK).is_file():
        return f" ({path.name}, from its float32 cache)"
    est = first_load_seconds(path)
    return (f" (first load of {path.name}: dequantizing it to a float32 cache, once; about {max(1, round(est))} s "
            f"for its {path.stat().st_size / 2**20:.0f} MiB at the {FIRST_LOAD_S_PER_MIB} s per MiB measured on 2 CPU "
            "cores; later loads read the cache)" if cdir is not None else
            f" ({path.name}: dequantizing it to float32; the cache is off, VOCABLENS_CACHE=off)")


def _quiet_libraries() -> None:
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:  # pragma: no cover
        pass
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover
        pass


def fail(message: str) -> None:
    """Raise a usage error the CLI prints as one line with exit code 2."""
    raise VocabLensError(message)


def _command_options(argv: list[str]) -> dict[str, list[str]]:
    """Python parameter name -> its options (``max_memory`` -> ``["--max-memory"]``) of the command
    ``argv`` names (subcommands followed as the app resolves them)."""
    cmd = typer.main.get_command(app)  # typer's own click: groups are told by their ``commands``
    for word in argv:
        if word.startswith("-") or not hasattr(cmd, "commands"):
            break
        sub = cmd.commands.get(word)
        if sub is None and isinstance(cmd, DefaultCommandGroup):
            sub = cmd.commands.get(cmd.default_command)
        if sub is None:
            break
        cmd = sub
    return _options_of(cmd)


def _options_of(cmd) -> dict[str, list[str]]:
    """Python parameter name -> its options, of one click command."""
    return {p.name: list(p.opts) for p in cmd.params
            if getattr(p, "param_type_name", "") == "option" and p.name and p.opts}


#: library argument -> the command parameter that passes it, where the two names differ
ARGUMENT_OPTIONS = {"per_block": ("sample",), "budget_s": ("budget",), "out": ("out_dir",),
                    "path": ("lens_path", "tuned_path", "lens"), "neurons": ("neuron",), "images": ("image",),
                    "lens": ("early_exit",), "test": ("exit_test",)}
#: options the CLI names by their short form in messages (``-k``, not ``--top-k``), where a command has it
SHORT_NAMED = {"k": "-k"}


def in_cli_words(message: str, argv: list[str]) -> str:
    """A library message in the CLI's words: the library names a function argument as `` `name` ``
    (e.g. "`max_memory` takes a size ..."); where the command takes it as an option, the option
    (``--max-memory``, or the short form :data:`SHORT_NAMED` gives: ``-k``) stands in its place; an
    option every command takes (``--dtype``, ``--device-map``) where the command has none of that name.
    Other names keep their backticks."""
    import re

    if "`" not in message:
        return message
    try:
        opts = {**_options_of(typer.main.get_command(app)), **_command_options(argv)}
    except Exception:  # pragma: no cover  (the message as it is, rather than no message)
        return message
    def option(m: re.Match) -> str:
        name = m.group(1)
        found = [opts[p] for p in (name, *ARGUMENT_OPTIONS.get(name, ())) if p in opts]
        if not found:
            return m.group(0)
        return SHORT_NAMED[name] if SHORT_NAMED.get(name) in found[0] else max(found[0], key=len)

    return re.sub(r"`([a-z_][a-z0-9_]*)`", option, message)


def cli_provenance(prov):
    """``prov`` with its notes in the running command's words (:func:`in_command_words`): what the command
    prints and its ``--json`` holds (a float16 checkpoint's "`dtype` float16 keeps it" -> "--dtype ...")."""
    notes = tuple(in_command_words(n) for n in prov.notes)
    return prov if notes == tuple(prov.notes) else dataclasses.replace(prov, notes=notes)


def in_command_words(message: str) -> str:
    """:func:`in_cli_words` for the command now running (the app's click context): a library note
    told to a command names its options."""
    try:  # the click the app runs on (recent typer releases carry their own copy, with its own context stack)
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover
        from click import get_current_context

    ctx = get_current_context(silent=True)
    return message if ctx is None else in_cli_words(message, ctx.command_path.split()[1:])


def run_app(argv: list[str] | None = None, whole_process: bool = False) -> int:
    """Run the typer app; VocabLensError -> one line on stderr, exit code 2, no traceback.
    ``whole_process``: the process runs this command alone (``--stats`` then reports its age too)."""
    import time
    import warnings

    from vocablens.errors import VocabLensNote

    t0 = time.perf_counter()
    argv, stats = take_stats(list(sys.argv[1:] if argv is None else argv))

    def show_note(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, VocabLensNote):  # the library's note, in the command's words
            print_note(in_cli_words(str(message), argv))
        else:
            previous(message, category, filename, lineno, file, line)

    previous, warnings.showwarning = warnings.showwarning, show_note
    rank = torchrun_rank()
    words = [a for a in argv if not a.startswith("-")][:2]
    refused = tp_refusal(words, argv)  # --tp on a command that cannot run split: one line (rank 0), exit 2
    if refused:
        return 2 if rank else print_error(in_cli_words(refused, argv)) or 2
    if rank is not None and words and not splits_over_ranks(words) and "--tp" not in argv:
        if rank != 0:
            return 0  # a command that does not split over processes: rank 0 runs it alone
        print_note(f"`vocablens {words[0]}` does not split over processes; rank 0 runs it alone")
    was_quiet = err.quiet
    if rank:  # under torchrun only rank 0 speaks: every rank raises the same error
        err.quiet = True
    global _WEIGHTS_DTYPE
    code = 1
    try:
        argv, _WEIGHTS_DTYPE = take_dtype(argv)  # --dtype: every load_model of this command takes it
        argv = placement.take_placement(argv)  # --device-map (and its --max-memory): every whole-model load
        code = app(args=argv, prog_name="vocablens", standalone_mode=False)
        code = code if isinstance(code, int) else 0
        return code
    except click_exc.NoArgsIsHelpError as exc:
        exc.show()  # `vocablens` alone: the help, exit 2 as click does
        return exc.exit_code
    except click_exc.UsageError as exc:  # an unknown option, a value of the wrong type ...
        where = exc.ctx.command_path if exc.ctx is not None else "vocablens"
        msg = " ".join(exc.format_message().split())
        print_error(f"{msg} (see {where} -h)")
        return exc.exit_code
    except click_exc.ClickException as exc:
        print_error(" ".join(exc.format_message().split()))
        return exc.exit_code
    except typer.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        err.print("interrupted")
        return 130
    except VocabLensError as exc:
        print_error(in_cli_words(str(exc), argv))
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # `vocablens ... | head`: the reader left; not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        _WEIGHTS_DTYPE = placement.PLACEMENT = None
        if whole_process:
            leave_process_group(code == 0)
        if stats:
            print_stats(t0, whole_process)
        warnings.showwarning = previous
        err.quiet = was_quiet
