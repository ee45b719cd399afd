"""``vocablens steer``: scale the FFN value vectors that promote / suppress tokens (Geva et al. 2022, §5.1)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from vocablens.handle import checks
from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, show, err, load_model
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


def _stream_layers(s: str, L: int) -> list[int] | None:
    """'A..B' stream layers (1..L: layer l is written by block l-1) -> block indices."""
    if not s:
        return None
    try:
        a, b = (int(x) for x in s.split("..", 1)) if ".." in s else (int(s), int(s))
    except ValueError:
        raise BadInput(f"--layers takes A..B (stream layers 1..{L}); got {s!r}") from None
    if not 1 <= a <= b <= L:
        raise BadInput(f"--layers A..B must satisfy 1 <= A <= B <= {L} (layer l is written by block l-1); got {s!r}")
    return list(range(a - 1, b))


@app.command("steer")
def steer_cmd(
    promote: Annotated[list[str], typer.Option("--promote", help="A token to promote, by its text (id:N names id N; repeat the option).")] = [],  # noqa: B006
    suppress: Annotated[list[str], typer.Option("--suppress", help="A token to suppress, by its text (id:N names id N; repeat the option).")] = [],  # noqa: B006
    top_n: Annotated[int, typer.Option("--top-n", help="Value vectors chosen per token set.")] = 10,
    scale: Annotated[float, typer.Option("--scale", help="Factor on the chosen vectors' activations.")] = 8.0,
    layers: Annotated[str, typer.Option("--layers", help="Only the blocks that write stream layers A..B "
                                                       "(layer l = output of block l-1), e.g. 15..30.")] = "",
    suppress_mode: Annotated[str, typer.Option("--suppress-mode", help="boost: scale up the vectors that push "
                                               "the set down; ablate: switch off those that push it up.")] = "boost",
    prompt: Annotated[str, typer.Option("--prompt", help="Text to measure on and to continue greedily.")] = "",
    corpus: Annotated[str, typer.Option("--corpus", help="Measure on a corpus instead (named or a path).")] = "",
    heldout: Annotated[str, typer.Option("--heldout", help="Corpus for the perplexity (fluency cost).")] = "pydoc-topics",
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Greedy continuation length (0: none).")] = 24,
    save: Annotated[str, typer.Option("--save", help="Write the steered model (factors folded into the "
                                                    "weights) as a Hugging Face directory.")] = "",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --save directory.")] = False,
    model: ModelOpt = DEFAULT_MODEL,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Scale the FFN value vectors that promote / suppress tokens, and measure the effect.

    The vectors are chosen by the tokens' z-score in vocabulary space (Geva et al. 2022, §5.1) and
    scaled with a forward hook (no weight edit); reported before and after: the tokens' probability
    mass, the held-out perplexity and greedy continuations."""

    checks.steer_options(promote, suppress, prompt, corpus, new_tokens)
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    from vocablens.cli.progress import stage_progress

    def note(text: str) -> None:
        if not json_:
            err.print(f"note: {text}", style="dim")

    def started(n_vectors: int, n_probes: int, n_held: int) -> None:
        if not json_:
            err.print(f"measuring {n_vectors} vectors on {n_probes} probe text(s) and "
                      f"{n_held} held-out texts, unsteered and steered ...", style="dim")

    cb, close = stage_progress("steer", "forward passes", quiet=json_)
    try:
        res = lm.steer(promote, suppress, top_n=top_n, scale=scale, blocks=_stream_layers(layers, lm.borders.n_layers),
                       suppress_mode=suppress_mode, prompt=prompt, corpus=corpus, heldout=heldout,
                       new_tokens=new_tokens, progress=cb, notes=note, started=started)
    finally:
        close()
    if save:
        with res.options["steering"].folded():
            saved = str(lm.save(save, force=force))
        res = dataclasses.replace(res, options={**res.options, "saved": saved, "saved_to": save})
    show(res, json_)
