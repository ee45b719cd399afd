"""``vocablens score``: per-token log-probabilities of a text, through the chunked LM-head path."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vocablens.cli.common import (
    JsonOpt, ModelOpt, DeviceOpt, MaxMemOpt, TrustOpt, app, emit_json, load_model, out, status,
)
from vocablens.errors import BadInput


@app.command("score")
def score(
    text: Annotated[Optional[str], typer.Argument(help="Text to score (or use --file).")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the text from this file (UTF-8, or UTF-16/32 with a byte-order mark; - = standard input).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Alternatives per position (0 = none).")] = 3,
    special_text: Annotated[str, typer.Option("--special-text", help="parse: special-token strings in the text "
                                              "(<|im_end|>) become those tokens (a note says so); plain: "
                                              "read them as ordinary text.")] = "parse",
    model: ModelOpt = "smollm2",
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    max_memory: MaxMemOpt = "",
) -> None:
    """Per-token log-probabilities of a text: total, per byte, and the top-k alternatives per position.

    The first token is scored only when the tokenizer adds BOS (it then has a prefix); bits per byte
    divide by the bytes of exactly the scored tokens. Under torchrun (WORLD_SIZE > 1) the embedding
    and LM head rows are split over the ranks and rank 0 prints."""
    from vocablens.models.tokens import context_length, encode_prompt, token_bytes
    from vocablens.render.ops import print_score, score_to_dict
    from vocablens.generate.score import score_ids

    if (text is None) == (file is None):
        raise BadInput("give either TEXT or --file F (exactly one)")
    if file is not None:
        from vocablens.files import read_text

        text = read_text(file, "--file")
    if top_k < 0:
        raise BadInput(f"--top-k must be >= 0; got {top_k}")
    if not text or not text.strip():
        raise BadInput("empty text: nothing to score")
    from vocablens.parallel.processes import VocabParallelModel, init_from_env

    rank, world = init_from_env()
    if world > 1 and max_memory:
        raise BadInput("--max-memory does not run under torchrun (the ranks split the LM head of a whole "
                       "model); run it in one process")
    lm = load_model(model, mode="streaming" if max_memory else "full", max_memory=max_memory or None,
                    trust_remote_code=trust_remote_code, device=device, quiet=json_ or rank != 0)
    ids = encode_prompt(lm.tokenizer, text, context_length(lm.model.config), special_text=special_text,
                        rows=lm.borders.vocab_size)[0]
    # bits per byte over one span: the bytes of exactly the tokens whose log-probability is summed
    # (ids[1:]; special tokens count with their text)
    n_bytes = sum(len(token_bytes(lm.tokenizer, int(i)) or b"") for i in ids[1:])
    with status(f"scoring {len(ids):,} tokens ...", quiet=json_ or rank != 0):
        if world > 1:  # each rank keeps V/world rows of the embedding and head
            res = VocabParallelModel(lm.borders).score(ids, top_k=top_k, n_bytes=n_bytes)
        else:
            res = score_ids(lm.borders, ids, top_k=top_k, n_bytes=n_bytes)
    if rank != 0:
        return
    if json_:
        d = score_to_dict(res, lm.tokenizer)
        d["model"] = lm.provenance.to_dict()
        emit_json(d)
    else:
        print_score(res, lm.tokenizer, out, lm.provenance)
