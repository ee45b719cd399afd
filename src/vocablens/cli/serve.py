"""``vocablens serve``: the interactive explorer in the browser (a local web server)."""

from __future__ import annotations

import socket
from typing import Annotated

import typer
from rich.text import Text

from vocablens.cli.common import ModelOpt, DeviceOpt, TrustOpt, app, err, load_model, status
from vocablens.cli.progress import stage_progress
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


def _read_json(path: str, flag: str, command: str) -> dict:
    import json
    from pathlib import Path

    from vocablens.files import STDIN, read_text

    p = Path(path)
    if path != STDIN and not p.exists():
        raise BadInput(f"{flag} {path}: no such file (save one with `{command} > {p.name}`)")
    try:
        d = json.loads(read_text(path, flag))
    except json.JSONDecodeError as e:
        raise BadInput(f"{flag} {path}: not JSON ({e.__class__.__name__})") from None
    if not isinstance(d, dict):
        raise BadInput(f"{flag} {path}: not the JSON of `{command}`")
    return d


@app.command("serve")
def serve_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    host: Annotated[str, typer.Option("--host", help=(
        "Address to bind; anything but 127.0.0.1/localhost lets others on the network use the model. "
        "Requests must name the server in their Host header (a guard against DNS rebinding): 127.0.0.1, "
        "localhost or [::1], any port; --host NAME also answers NAME (e.g. --host myhost.lan), and "
        "--host 0.0.0.0 also this machine's host name and any IP address. Others get 421."))] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8765,
    lens: Annotated[str, typer.Option("--lens", help=(
        "A lens folder holding a tuned lens, a Jacobian lens or both (or a published Jacobian lens.pt): each kind "
        "it holds is served from it, the others are the ones shipped for the model (default: those)."))] = "",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help=(
        "Longest prompt read, in tokens (and 32 characters per token); request bodies are capped to "
        "match (413 beyond)."))] = 128,
    no_argmax: Annotated[bool, typer.Option("--no-argmax", help="Skip the background argmax scan.")] = False,
    undertrained: Annotated[str, typer.Option("--undertrained", help=(
        "A saved `vocablens undertrained --json` of the same model: the token panel also shows each "
        "verified token's repeat probability (class and indicator are shown without it)."))] = "",
    image: Annotated[list[str] | None, typer.Option("--image", help=(
        "An image read with every prompt by a vision-language model's own processor (repeat for several): "
        "the map reads the image positions too, labelled <image k/n>."))] = None,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Serve the explorer page and its JSON API (schema at /openapi.json); Ctrl-C stops it."""
    from vocablens.serve import LOCAL_HOSTS, ServerState, serve
    from vocablens.cli.heap import tune_heap

    tune_heap(scan=True)  # the argmax scan runs in this process (cli/heap.py)

    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be 0..65535; got {port}")
    if max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1; got {max_tokens}")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError as exc:
            raise BadInput(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port") from None
    if host not in LOCAL_HOSTS:
        err.print(Text.assemble(("warning:", "bold yellow"), f" listening on {host}: anyone who can reach this machine "
                            "can use the model; use --host 127.0.0.1 to keep it local"))
    if image:
        from vocablens.models.vision import read_image

        for x in image:
            read_image(x)  # a file that is no image, or too large: one line before the model loads
    verified = _read_json(undertrained, "--undertrained", "vocablens undertrained --json") if undertrained else None
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device)
    # the background argmax scan speaks on stderr: its stages (stored verdicts reused, or the scan's
    # own) as lines or bars, and one line when it ends; the bar starts with the scan's first report
    # (a terminal has one live display at a time: not while the tuned lens loads under its spinner)
    sink: dict = {}

    def report(stage: str, done: int, total: int) -> None:
        if not sink:
            sink["cb"], sink["close"] = stage_progress("argmax scan (background)", "rows",
                                                       units={"final-norm reach": "iterations"})
        sink["cb"](stage, done, total)

    def close() -> None:
        if sink:
            sink["close"]()

    def ended(message: str) -> None:
        close()
        err.print(message, style="dim", soft_wrap=True)

    with status("loading the lenses ..."):
        state = ServerState(lm, model_spec=model, lens_path=lens, max_tokens=max_tokens, argmax=not no_argmax,
                            undertrained=verified, argmax_report=report, argmax_end=ended, images=image or None)
    shown = f"[{host}]" if ":" in host else host
    print(f"vocablens serve: http://{shown}:{port}/  (Ctrl-C stops)", flush=True)
    try:
        serve(state, host=host, port=port)
    finally:
        close()
    err.print("stopped", style="dim")
