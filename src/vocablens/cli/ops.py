"""``vocablens score``: per-token log-probabilities of a text, through the chunked LM-head path."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vocablens.handle import checks
from vocablens.cli.common import (
    JsonOpt, ModelOpt, DeviceOpt, MaxMemOpt, TpOpt, TrustOpt, app, show, load_model, status,
)
from vocablens.errors import BadInput
from vocablens.units import plural
from vocablens.models.files.spec import DEFAULT_MODEL


@app.command("score")
def score(
    text: Annotated[Optional[str], typer.Argument(help="Text to score (or use --file).")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the text from this file (UTF-8, or UTF-16/32 with a byte-order mark; - = standard input).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Alternatives per position (0 = none).")] = 3,
    special_text: Annotated[str, typer.Option("--special-text", help="parse: special-token strings in the text "
                                              "(<|im_end|>) become those tokens (a note says so); plain: "
                                              "read them as ordinary text.")] = "parse",
    model: ModelOpt = DEFAULT_MODEL,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    max_memory: MaxMemOpt = "",
    tp: TpOpt = False,
) -> None:
    """Per-token log-probabilities of a text: total, per byte, and the top-k alternatives per position.

    The first token is scored only when the tokenizer adds BOS (it then has a prefix); bits per byte
    divide by the bytes of exactly the scored tokens. Under torchrun (WORLD_SIZE > 1) the embedding
    and LM head rows are split over the ranks and rank 0 prints; with --tp the blocks are split too
    (transformers' tensor parallel) and the head is read from the plan's own split."""

    if (text is None) == (file is None):
        raise BadInput("give either TEXT or --file F (exactly one)")
    if file is not None:
        from vocablens.files import read_text

        text = read_text(file, "--file")
    checks.at_least_ge("top_k", top_k, 0)
    checks.score_text(text)
    from vocablens.cli.torchrun import group_device
    from vocablens.parallel.processes import init_from_env

    rank, world = init_from_env(group_device(tp, device))
    if world > 1 and max_memory:
        raise BadInput("--max-memory does not run under torchrun (the ranks split the LM head of a whole "
                       "model); run it in one process")
    lm = load_model(model, mode="streaming" if max_memory else "full", max_memory=max_memory or None,
                    trust_remote_code=trust_remote_code, device=device, quiet=json_ or rank != 0, tp=tp)
    with status(f"scoring {plural(len(text), 'character')} ...", quiet=json_ or rank != 0):
        res = lm.score(text, top_k=top_k, special_text=special_text, vocab_parallel=world > 1)  # torchrun: V/world rows a rank
    if rank != 0:
        return
    show(res, json_)

