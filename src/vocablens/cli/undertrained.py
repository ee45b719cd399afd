"""``vocablens undertrained``: tokens training never reached (Land & Bartolo 2024, "Fishing for Magikarp")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vocablens.handle import checks
from vocablens.cli.common import (
    DeviceOpt, JsonOpt, ModelOpt, TrustOpt, app, load_model, show,
)
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


def _read_scan(path: str) -> dict:
    from vocablens.files import STDIN, read_text

    p = Path(path)
    if path != STDIN and not p.exists():
        raise BadInput(f"--argmax {path}: no such file (save one with `vocablens argmax --json > {p.name}`)")
    try:
        return json.loads(read_text(path, "--argmax"))
    except json.JSONDecodeError as e:
        raise BadInput(f"--argmax {path}: not JSON ({e.__class__.__name__})") from None


@app.command("undertrained")
def undertrained_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    candidates: Annotated[int, typer.Option("--candidates", "-n", help="Lowest-indicator tokens to verify by "
                                            "prompting; 0: the paper's lowest 2% of the testable tokens.")] = 500,
    indicator: Annotated[str, typer.Option("--indicator", help="auto (input-embedding norm when untied, "
                                           "unembedding cosine distance when tied), unembedding_cosine or "
                                           "embedding_norm.")] = "auto",
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Indicators and candidates only: no prompting.")] = False,
    argmax: Annotated[str, typer.Option("--argmax", help="A saved `vocablens argmax --json` of the same model: "
                                        "each row also shows its argmax verdict.")] = "",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Candidates per forward in verification.")] = 64,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Under-trained tokens: tokenizer classes, an indicator from the matrices, verification by prompting.

    Every token is classed (normal, special, single byte, partial UTF-8, unreachable); the lowest
    candidates of the indicator are prompted to repeat themselves, and those whose highest probability
    stays below 0.01 are verified under-trained (Land & Bartolo 2024). With --argmax, each row also
    shows whether the token can win at all (argmax geometry: a different question)."""

    checks.undertrained_options(candidates, batch_size)
    scan = _read_scan(argmax) if argmax else None
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    from vocablens.cli.progress import stage_progress

    cb, close = stage_progress("undertrained", "prompts", quiet=json_,
                               units={"tokenizer classes": "tokens", "indicators": "tokens"})
    try:
        res = lm.undertrained(candidates=candidates, indicator=indicator, verify=not no_verify,
                              batch_size=batch_size, argmax_verdicts=scan, progress=cb)
    finally:
        close()
    show(res, json_, notes=[f"timings: {', '.join(f'{k} {v:.1f} s' for k, v in res.seconds.items() for v in [round(float(v), 3)])}"])
