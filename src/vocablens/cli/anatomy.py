"""``vocablens anatomy [MODEL ...]``: parameters, bytes and FLOPs of the embedding and LM head."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, TrustOpt, app, load_model, show, status
from vocablens.models.files.spec import DEFAULT_MODEL


@app.command("anatomy")
def anatomy_cmd(
    models: Annotated[Optional[list[str]], typer.Argument(
        help="Models to compare side by side: catalogue ids or aliases (qwen3-0.6b, Qwen/Qwen3-8B, gpt2 ...), "
             f"{DEFAULT_MODEL}, config.json files, model directories, .gguf files. Default: --model.")] = None,
    model: ModelOpt = DEFAULT_MODEL,
    batch: Annotated[int, typer.Option("--batch", help="Batch size B of the logits tensor.")] = 1,
    context: Annotated[int, typer.Option("--context", help="Context length T: logits tensor and attention FLOPs.")] = 4096,
    dtype: Annotated[str, typer.Option("--dtype", help="dtype of the logits tensor: float32, bfloat16, float16.")] = "float32",
    load: Annotated[bool, typer.Option("--load", help="Load the weights and count them (shared storage once) "
                                                      "instead of building the model from its config.")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
) -> None:
    """Parameters (total, embedding, LM head, non-embedding), bytes, FLOPs/token and logits size.

    No weights are read unless --load: the model is built from its config on the meta device.
    With --json: {"models": [...]}, one object per model (also for one).
    """
    from vocablens.accounting.anatomy import anatomy_of, logits_memory
    from vocablens.models.files.catalogue import catalogue_entry
    from vocablens.handle.results import Anatomy as AnatomyResult

    logits_memory(1, batch, context, dtype)  # validates --batch/--context/--dtype before any loading
    specs = list(models) if models else [model]
    results = []
    for spec in specs:
        if load:
            entry = catalogue_entry(spec)  # an alias loads its hub id (from the local cache)
            lm = load_model(entry.hub_id if entry else spec, mode="full", trust_remote_code=trust_remote_code, quiet=json_)
            results.append(lm.anatomy(batch=batch, context=context, dtype=dtype, name=spec).value)
        else:
            with status(f"reading the config of {spec} ...", quiet=json_):
                results.append(anatomy_of(spec, batch=batch, context=context, logits_dtype=dtype,
                                          trust_remote_code=trust_remote_code))
    show(AnatomyResult(tuple(results), None, None), json_)
