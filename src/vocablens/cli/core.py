"""Foundation commands: lens (logit lens), and (added by later modules) anatomy, neighbors, report."""

from __future__ import annotations

from typing import Annotated

import typer
from vocablens.handle import checks
from vocablens.cli.common import (
    parse_int_list,
    DefaultCommandGroup, JsonOpt, ModelOpt, DeviceOpt, MaxMemOpt, TpOpt, TrustOpt, app, show, err, load_model,
)
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL



class LensGroup(DefaultCommandGroup):
    """``vocablens lens``: ``lens PROMPT [OPTIONS]`` runs ``lens show``; ``--help`` shows its options
    and then the subcommands (train, eval)."""

    def format_help(self, ctx, formatter):
        import click

        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        show = self.get_command(ctx, "show")
        show.format_help(click.Context(show, info_name=ctx.info_name, parent=ctx.parent), formatter)
        rows = Table.grid(padding=(0, 2))
        for name in self.list_commands(ctx):
            if name != "show":
                help_ = (self.get_command(ctx, name).help or "").strip().splitlines()[0]
                rows.add_row(Text(name, style="bold cyan"), Text(help_))
        Console(highlight=False, markup=False).print(
            Panel(rows, title="Commands (`vocablens lens COMMAND --help`)", title_align="left", border_style="dim"))


lens_app = typer.Typer(cls=LensGroup, no_args_is_help=True, add_completion=False,
                       help="Train (`lens train`) and evaluate (`lens eval`) a tuned lens.")
app.add_typer(lens_app, name="lens")


@lens_app.command("show")
def lens_show(
    prompt: Annotated[str, typer.Argument(help="Text to read (or --file).")] = "",
    file: Annotated[str, typer.Option("--file", help="Read a batch of prompts, one per line (a newline inside a prompt written as \\n); one forward for the batch.")] = "",
    model: ModelOpt = DEFAULT_MODEL,
    k: Annotated[int, typer.Option("-k", "--top-k", help="Top tokens per layer.")] = 5,
    positions: Annotated[str, typer.Option("--positions", help="last, all, or comma-separated positions (negative from the end), as `positions=` of Model.lens takes them.")] = "last",
    layers: Annotated[str, typer.Option("--layers", help="Comma-separated stream layers 0..L (0 = embedding output, L = last block's output; default all).")] = "",
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the chat template (user turn).")] = False,
    prefix: Annotated[str, typer.Option("--prefix", help="Text that starts the assistant turn (with --chat) or follows the prompt.")] = "",
    kind: Annotated[str, typer.Option("--kind", help="logit, tuned, jacobian, both (= logit,tuned) or a comma list (the shipped or --lens lenses).")] = "logit",
    lens_path: Annotated[str, typer.Option("--lens", help="For tuned/jacobian: a lens folder or file (ours, tuned-lens's params.pt, a published Jacobian lens.pt) or a hub id from the local cache (default: the lenses shipped for the model).")] = "",
    image: Annotated[list[str] | None, typer.Option("--image", help="An image read with the prompt by a vision-language model's own processor (repeat for several); image positions are read and labelled <image k/n>.")] = None,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    max_memory: MaxMemOpt = "",
    tp: TpOpt = False,
) -> None:
    """Read the residual stream through the LM head: `vocablens lens PROMPT`. Top tokens, entropy and KL
    to the final distribution at every stream layer 0..L (logit lens, tuned lens, or both). Under
    torchrun with --tp the model is split over the ranks (the top-k merged across them) and rank 0 prints."""

    if prompt and file:
        raise BadInput("give a PROMPT or --file F, not both")
    if image and (file or chat or prefix):
        raise BadInput("--image is read with one PROMPT (not with --file, --chat or --prefix)")
    if image:
        from vocablens.models.vision import read_image

        for x in image:
            read_image(x)  # a file that is no image, or too large: one line before the model loads
    texts = _read_prompts(file) if file else [prompt]
    if not file:
        checks.prompt_text(prompt)
    from vocablens.lens.positions import parse_positions

    pos = parse_positions(positions, "--positions")
    lay = _parse_ints(layers, "--layers") if layers else None
    checks.at_least("k", k)
    from vocablens.cli.lenses import find_lenses, lens_caption, load_lenses, parse_kinds

    kinds = parse_kinds(kind)
    found = find_lenses(kinds, model, lens_path)  # before the model loads
    rank = _tp_rank(tp, device)
    m = load_model(model, mode="streaming" if max_memory else "full", max_memory=max_memory or None,
                   trust_remote_code=trust_remote_code, device=device, quiet=json_ or rank != 0, tp=tp)
    lenses = load_lenses(found, m)
    if "jacobian" in lenses:
        m.add_lens("jacobian", lenses["jacobian"])
        jl = lenses["jacobian"]
        if lay is None and len(jl.layers) < m.borders.n_layers:
            lay = list(jl.layers) + [m.borders.n_layers]  # a published lens fits no matrix for stream layer 0
    if not json_ and rank == 0:
        for kd, ln in lenses.items():
            err.print(lens_caption(kd, ln), style="dim", soft_wrap=True)
    from vocablens.cli.progress import stage_progress

    cb, close = stage_progress("lens", "prompts", quiet=json_ or not file or rank != 0)   # --file: many prompts
    try:  # one forward per batch of prompts for every kind
        res = m.lens(texts if file else prompt, kind=kinds if kinds != ["logit", "tuned"] else "both", k=k,
                     positions=pos, layers=lay, chat=chat, prefix=prefix, lens_dir=found.get("tuned"),
                     progress=lambda d, n: cb("forward passes", d, n), images=image or None)
    finally:
        close()
    if rank == 0:
        show(res, json_)


def _tp_rank(tp: bool, device: str) -> int:
    """With ``--tp``: join torchrun's process group (every rank runs the lens) and return this rank; else 0."""
    if not tp:
        return 0
    from vocablens.cli.torchrun import group_device
    from vocablens.parallel.processes import init_from_env

    return init_from_env(group_device(tp, device))[0]


def _read_prompts(path: str) -> list[str]:
    """The non-blank lines of ``path`` (:func:`vocablens.files.read_text`; ``-`` = standard input),
    ``\\n`` read as a newline.

    Raises:
        BadInput: no such file, unreadable or not UTF-8, no prompt in it.
    """
    from vocablens.files import read_text

    lines = read_text(path, "--file").splitlines()
    texts = [line.replace("\\n", "\n") for line in lines if line.strip()]
    if not texts:
        raise BadInput(f"--file: {path} holds no prompts (one per line)")
    return texts


def _parse_ints(s: str, what: str) -> list[int]:
    """:func:`~vocablens.cli.common.parse_int_list`, refusing an empty list."""
    vals = parse_int_list(s, what)
    if not vals:
        raise BadInput(f"{what} takes comma-separated integers; got {s!r}")
    return vals
