"""Jacobian-lens and backward-lens commands: ``vocablens lens fit-jacobian`` and ``vocablens lens backward``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from vocablens.handle import checks
from vocablens.cli.common import DeviceOpt, JsonOpt, ModelOpt, TrustOpt, show, err, load_model, status
from vocablens.cli.core import lens_app
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


@lens_app.command("fit-jacobian")
def lens_fit_jacobian(
    model: ModelOpt = DEFAULT_MODEL,
    corpus: Annotated[str, typer.Option("--corpus", help="A named corpus (pydoc-topics, cpython-stdlib, python-docs, debian-handbook) or a path (text, jsonl, HTML, directory).")] = "pydoc-topics",
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the lens (jacobian.safetensors + jacobian.json) and its checkpoint.")] = Path("jacobian-lens"),
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Fit on at most this many tokens (prompts of --seq-len tokens).")] = 1024,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per prompt (the reference: 128).")] = 128,
    skip_first: Annotated[int, typer.Option("--skip-first", help="Leading positions left out of the average (attention sinks; the reference: 16).")] = 16,
    dim_batch: Annotated[int, typer.Option("--dim-batch", help="Output directions per backward pass (memory grows with it, FLOPs do not).")] = 8,
    prompt_batch: Annotated[int, typer.Option("--prompt-batch", help="Prompts per forward.")] = 1,
    layers: Annotated[str, typer.Option("--layers", help="Comma-separated stream layers to fit (default all 0..L-1).")] = "",
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Documents held out (not fitted on) for `lens eval`.")] = 0.1,
    seed: Annotated[int, typer.Option("--seed", help="Order of the training documents.")] = 0,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Checkpoint every N batches of prompts (0 = at the end).")] = 1,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint in --out.")] = False,
    save_dtype: Annotated[str, typer.Option("--save-dtype", help="float16 (default, as the reference; float32 for a --shard, so that the merge is exact), bfloat16 or float32 storage.")] = "",
    shard: Annotated[str, typer.Option("--shard", help="I/N: fit only the I-th of N disjoint slices of the prompts; merge the N lenses with `vocablens lens merge`.")] = "",
    quality_tokens: Annotated[int, typer.Option("--quality-tokens", help="Held-out tokens (validation split) on which the lens's per-layer KL and top-1 are measured and stored (0 = none).")] = 2048,
    threads: Annotated[int, typer.Option("--threads", help="torch threads (0 = torch's default).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace a Jacobian lens already in --out.")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="Show progress on stderr even with --json.")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Fit a Jacobian lens (Gurnee et al. 2026): the exact average Jacobian of the last layer's stream
    with respect to each layer's, by batched vector-Jacobian products; checkpoints go to --out."""
    from vocablens.cli.common import parse_int_list
    from vocablens.cli.lenses import set_threads
    from vocablens.corpus import load_documents
    from vocablens.handle.lenses.training import check_fit_options
    from vocablens.lens.jacobian_fit import JacobianFitSettings
    from vocablens.lens.jacobian_merge import parse_shard
    from vocablens.parallel.processes import init_from_env

    shard_in = parse_shard(shard) if shard else None
    save_dtype = save_dtype or ("float32" if shard_in else "float16")
    if quality_tokens < 0:
        raise BadInput(f"--quality-tokens must be >= 0; got {quality_tokens}")
    check_fit_options(out_dir, save_dtype, seq_len, skip_first, max_tokens, force, resume)
    settings = JacobianFitSettings(skip_first=skip_first, dim_batch=dim_batch, prompt_batch=prompt_batch,
                                   layers=tuple(parse_int_list(layers, "--layers")) if layers else None)
    set_threads(threads)
    docs = load_documents(corpus)  # a missing or empty corpus fails before the model loads
    rank, _ = init_from_env(device)  # under torchrun: each rank fits its share of the prompts, rank 0 prints
    quiet = (json_ and not progress) or rank != 0
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)

    def started(prompts: int, tokens: int, data: dict) -> None:
        if not quiet:
            err.print(f"fitting on {tokens} tokens: {prompts} prompts of {seq_len} from {data['documents']} "
                      f"documents of {corpus}; per prompt 1 forward + {-(-lm.borders.d_model // dim_batch)} backward "
                      f"passes of {dim_batch} directions", style="dim", soft_wrap=True)

    res = lm.fit_jacobian_lens(corpus, max_tokens, seq_len, settings, out=out_dir, val_fraction=val_fraction, seed=seed,
                               checkpoint_every=checkpoint_every, resume=resume, save_dtype=save_dtype, force=True,
                               docs=docs, command="vocablens lens fit-jacobian " + " ".join(_argv_tail()),
                               status=lambda msg: status(msg, quiet=quiet), started=started,
                               on_progress=None if quiet else _FitProgress(), shard=shard_in,
                               quality_tokens=quality_tokens)
    if rank == 0:
        show(res, json_)


@lens_app.command("merge")
def lens_merge(
    shards: Annotated[list[Path], typer.Argument(help="The shards' folders (`lens fit-jacobian --shard I/N --out DIR`).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the merged lens.")] = Path("jacobian-lens"),
    save_dtype: Annotated[str, typer.Option("--save-dtype", help="float16 (default, as the reference), bfloat16 or float32 storage.")] = "float16",
    force: Annotated[bool, typer.Option("--force", help="Replace a Jacobian lens already in --out.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Merge the shards of a Jacobian-lens fit, weighted by their prompt counts (exact: the lens of all
    their prompts); shards of different fits (model, dtype, layers, estimator, skip_first, corpus
    manifest) are refused. The merged lens's quality is measured on its first use (cached)."""
    from vocablens.handle.lenses.sources import merge_shards
    from vocablens.handle.results import LensMerge
    from vocablens.render.lens_merge import merged_line

    rec = merge_shards(shards, out_dir, save_dtype, force)  # its line on stderr: stdout stays for --json
    show(LensMerge(rec, None, None), json_, printed=lambda: err.print(merged_line(rec), soft_wrap=True))


@lens_app.command("decompose")
def lens_decompose(
    prompt: Annotated[str, typer.Argument(help="Text to read.")],
    layer: Annotated[int, typer.Option("--layer", "-l", help="Stream layer (0..L-1) the Jacobian lens has a matrix for.")],
    model: ModelOpt = DEFAULT_MODEL,
    position: Annotated[int, typer.Option("--position", "-p", help="Position read (default the last; negative from the end).")] = -1,
    k: Annotated[int, typer.Option("-k", help="Token directions at most.")] = 10,
    lens_path: Annotated[str, typer.Option("--lens", help="A Jacobian lens (folder, lens.pt, hub id); default: the one shipped for the model.")] = "",
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """A stream vector as a few nonnegative Jacobian-lens token directions (nonnegative OMP + NNLS, as
    TransformerLens 4's decompose), with the residual and the fraction of its squared norm explained."""
    checks.prompt_text(prompt)
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    show(lm.decompose(prompt, layer, position=position, k=k, lens=lens_path or None), json_)


class _FitProgress:
    """``on_progress`` of the fit: a line on stderr at most every 10 s (and at each prompt's last pass)
    with the prompt, the backward pass and an ETA."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, p) -> None:
        now = time.perf_counter()
        if now - self.last < 10 and p.pass_done != p.passes:
            return
        self.last = now
        frac = (p.prompts_done + p.pass_done / p.passes) / p.prompts
        eta = f", ETA {p.seconds / frac * (1 - frac):.0f} s" if frac > 0 else ""
        err.print(f"fit-jacobian: prompt {min(p.prompts_done + 1, p.prompts)}/{p.prompts}, backward pass "
                  f"{p.pass_done}/{p.passes}, {p.seconds:.0f} s{eta}", style="dim", soft_wrap=True)


def _argv_tail() -> list[str]:
    from vocablens.cli import tuned

    import sys

    saved = list(sys.argv)
    try:
        if "fit-jacobian" in sys.argv:
            sys.argv = [sys.argv[0], "train"] + sys.argv[sys.argv.index("fit-jacobian") + 1:]
        return tuned._argv_tail()
    finally:
        sys.argv = saved


@lens_app.command("backward")
def lens_backward(
    prompt: Annotated[str, typer.Argument(help="Text to read.")],
    target: Annotated[Optional[str], typer.Option("--target", help="The token whose loss is differentiated, by its text (with its leading space; '4' is the text \"4\"); id:N names id N.")] = None,
    target_id: Annotated[Optional[int], typer.Option("--target-id", help="The token whose loss is differentiated, by its id (instead of --target).")] = None,
    model: ModelOpt = DEFAULT_MODEL,
    position: Annotated[int, typer.Option("--position", help="Position predicting the target (default the last; negative from the end).")] = -1,
    k: Annotated[int, typer.Option("-k", "--top-k", help="Top tokens per layer.")] = 5,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the chat template (user turn).")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """The backward lens (Katz et al. 2024): the gradient of -log p(TARGET) at every stream layer,
    projected through the LM head: the tokens a gradient step on each layer's stream would promote."""

    if (target is None) == (target_id is None):
        raise BadInput("give the target as --target TEXT or --target-id N (one of them)")
    checks.prompt_text(prompt)
    checks.at_least("k", k)
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    tid = lm.token_id(target, "--target") if target_id is None else lm.token_id(target_id, "--target-id")
    res = lm.backward_lens(prompt, tid, position=position, k=k, chat=chat)
    show(res, json_)


__all__ = ["lens_backward", "lens_decompose", "lens_fit_jacobian", "lens_merge"]
