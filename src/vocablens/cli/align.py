"""``vocablens align MODEL_A MODEL_B``: match FFN neurons or attention heads through the vocabulary."""

from __future__ import annotations

from typing import Annotated

import typer

from vocablens.handle import checks
from vocablens.cli.common import JsonOpt, DeviceOpt, TrustOpt, app, load_model, show
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


def _blocks(s: str | None, L: int, which: str) -> list[int] | None:
    """'A..B' (inclusive) or 'a,b,c' -> block indices; None -> all."""
    if not s:
        return None
    try:
        if ".." in s:
            a, b = s.split("..", 1)
            return list(range(int(a), int(b) + 1))
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--blocks-{which} must be 'A..B' or a comma list of block indices; got {s!r}") from None


@app.command("align")
def align_cmd(
    model_a: Annotated[str, typer.Argument(help=f"Model A: {DEFAULT_MODEL}, a model directory, a .gguf file or a hub id.")],
    model_b: Annotated[str, typer.Argument(help="Model B (must share A's vocabulary, fully or in part).")],
    what: Annotated[str, typer.Option("--what", help="ffn: FFN value vectors; heads: attention OV circuits.")] = "ffn",
    blocks_a: Annotated[str, typer.Option("--blocks-a", help="Blocks of A to match, 'A..B' or '0,5,7' (default all).")] = "",
    blocks_b: Annotated[str, typer.Option("--blocks-b", help="Blocks of B to search (default all).")] = "",
    top: Annotated[int, typer.Option("--top", help="Best matched pairs to list with their top tokens.")] = 8,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Match two models' FFN neurons or heads through their shared vocabulary (no forward pass).

    Each unit is read in vocabulary space and compared by correlation; each block of A is matched
    one-to-one (Hungarian) to its most similar block of B (Dar et al. 2022, §5)."""
    from vocablens.cli.progress import stage_progress

    checks.align_options(what, top)
    A = load_model(model_a, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    B = A if model_b == model_a else load_model(model_b, mode="full", trust_remote_code=trust_remote_code, device=device,
                                                quiet=json_)
    la = _blocks(blocks_a, A.borders.n_layers, "a")
    lb = _blocks(blocks_b, B.borders.n_layers, "b")
    cb, close = stage_progress("align", "rows", quiet=json_, units={"blocks": "blocks of A"})
    try:
        res = A.align(B, what=what, blocks_a=la, blocks_b=lb, top=top, progress=cb)
    finally:
        close()
    show(res, json_)
