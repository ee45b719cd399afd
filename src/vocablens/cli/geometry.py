"""``vocablens neighbors TOKEN...``: cosine nearest neighbours in the embedding (and an untied head)."""

from __future__ import annotations

from typing import Annotated

import typer

from vocablens.handle import checks
from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, show, load_model
from vocablens.models.files.spec import DEFAULT_MODEL


@app.command("neighbors")
def neighbors_cmd(
    tokens: Annotated[list[str], typer.Argument(help="Token strings, e.g. ' king' (a leading space is part "
                                                     "of a word-initial token; '4' is the text \"4\"; id:N names id N).")],
    k: Annotated[int, typer.Option("-k", "--top-k", help="Neighbours per token.")] = 10,
    mean: Annotated[bool, typer.Option("--mean", help="A string of several tokens: use the mean of their rows "
                                                      "(default: its first token).")] = False,
    model: ModelOpt = DEFAULT_MODEL,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Cosine nearest neighbours over the real vocabulary (padding and never-trained rows excluded)."""

    checks.at_least("k", k)
    checks.token_strings(tokens)
    lm = load_model(model, mode="matrices", trust_remote_code=trust_remote_code, quiet=json_, device=device)
    res = lm.neighbors(tokens, k=k, mean=mean)
    show(res, json_)
