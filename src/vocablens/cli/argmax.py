"""Commands: ``vocablens argmax`` (tokens that can never win) and ``vocablens bottleneck``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from vocablens.handle import checks
from vocablens.cli.common import (
    DeviceOpt, JsonOpt, MaxMemOpt, ModelOpt, TrustOpt, app, show, err, load_model,
)
from vocablens.cli.heap import trim_heap, tune_heap, tuned_for_the_scan
from vocablens.cli.progress import PlainProgress, stage_progress  # noqa: F401  (PlainProgress: re-exported)
from vocablens.errors import BadInput
from vocablens.units import noun, plural
from vocablens.models.files.spec import DEFAULT_MODEL


def _progress_bar(quiet: bool):
    """The scan's (callback, close) pair (:func:`vocablens.cli.progress.stage_progress`): also with
    ``--json``, on stderr."""
    return stage_progress("argmax", "rows", units={"final-norm reach": "iterations"})


def _set_aside(tokenizer, trust_remote_code: bool):
    """``(tokenizer or None, reload)``: None when the tokenizer can be read again from the directory
    it came from (``name_or_path``, as :func:`~vocablens.models.files.sources.light_tokenizer` loads it),
    so the caller can free it during the scan; ``reload()`` reads it again (the same class and files)."""
    from vocablens.models.files.tokenizer_files import light_tokenizer

    src = getattr(tokenizer, "name_or_path", None)
    if not isinstance(src, str) or not src or not (Path(src) / "tokenizer_config.json").is_file():
        return tokenizer, lambda: tokenizer
    return None, lambda: light_tokenizer(Path(src), trust_remote_code)


def _rank() -> int:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, NCCL on
    GPU. Returns this process's rank (0 without torchrun)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


@app.command("argmax")
def argmax_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    bias: Annotated[str, typer.Option("--bias", help="auto (use the LM head's bias if any), on, off.")] = "auto",
    include_padding: Annotated[bool, typer.Option("--include-padding", help="Let rows beyond the tokenizer (padding) and never-trained rows compete (excluded by default).")] = False,
    norm: Annotated[bool, typer.Option("--norm/--no-norm", help="Also bound the highest probability flagged and borderline tokens can reach under the final norm.")] = True,
    verify_all: Annotated[bool, typer.Option("--verify-all", help="Re-check every certificate in float64 (V^2 d FLOPs), not only the borderline ones.")] = False,
    budget: Annotated[float, typer.Option("--budget", help="Wall seconds for the analysis (0: no limit); tokens left open are reported undecided (reason: budget).")] = 0.0,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Tokens that can never be the top prediction: exact verdicts with certificates, per stage.

    Runs on several processes with ``torchrun --nproc-per-node N -m vocablens argmax``."""

    from dataclasses import replace

    checks.one_of("bias", bias, ("auto", "on", "off"))
    if not budget >= 0:
        raise BadInput(f"--budget must be a number of seconds >= 0 (0: no limit); got {budget}")
    tune_heap()                     # freed blocks leave the resident set (the scan's own setting: below)
    rank = _rank()                  # torchrun: the rows are split across ranks, rank 0 prints
    quiet = json_ or rank != 0
    # the load speaks also with --json, as the scan's progress does (stderr only: stdout stays JSON)
    lm = load_model(model, mode="head", trust_remote_code=trust_remote_code, device=device, quiet=rank != 0)
    reserved = lm.reserved_tokens()
    tokenizer, reload = _set_aside(lm.tokenizer, trust_remote_code)
    lm = replace(lm, tokenizer=tokenizer)  # None: let go during the scan, read again for the tables after it
    trim_heap()
    cb, close = _progress_bar(quiet) if rank == 0 else ((lambda *_: None), (lambda: None))
    cb = tuned_for_the_scan(cb)
    try:
        res = lm.argmax(bias=bias, include_padding=include_padding, norm=norm, verify_all=verify_all,
                        budget_s=budget or None, stored="readwrite", progress=cb, reserved=reserved)
    finally:
        close()
    if rank != 0:
        return
    res = replace(res, tokenizer=tokenizer if tokenizer is not None else reload())
    ma = res.value
    if ma.result.interrupted:
        err.print("interrupted: unsettled tokens are reported as undecided", style="yellow")
    elif ma.result.cut_short:
        err.print(f"the --budget of {budget:g} s ran out in: {', '.join(ma.result.cut_short)}; "
                  f"{plural(ma.result.counts()['undecided'], 'token')} {noun(ma.result.counts()['undecided'], 'is')} undecided (run without --budget for "
                  "the exact answer)", style="yellow")
    show(res, json_)


@app.command("bottleneck")
def bottleneck_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    corpus: Annotated[str, typer.Option("--corpus", help="Named corpus (pydoc-topics, python-docs ...) or a path.")] = "pydoc-topics",
    contexts: Annotated[int, typer.Option("--contexts", help="N real contexts (positions); must exceed d.")] = 0,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per packed row.")] = 128,
    plot: Annotated[str, typer.Option("--plot", help="Write the two spectra as an HTML plot to this path.")] = "",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --plot file.")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    max_memory: MaxMemOpt = "",
) -> None:
    """Softmax bottleneck: spectra and numerical ranks of W_U and of the log-probabilities over N > d contexts."""
    checks.free_output(plot, force)
    checks.at_least("seq_len", seq_len, 2)
    lm = load_model(model, mode="streaming" if max_memory else "full", max_memory=max_memory or None,
                    trust_remote_code=trust_remote_code, device=device, quiet=json_)
    cb, close = stage_progress("bottleneck", "rows", quiet=json_,
                               units={"spectrum of W": "singular values", "spectrum of the log-probabilities":
                                      "singular values"})
    try:
        res = lm.bottleneck(corpus, contexts=contexts, seq_len=seq_len, progress=cb)
    finally:
        close()
    show(res, json_, plot=plot, notes=[f"wrote {plot}"] if plot else [], note_style=None)
