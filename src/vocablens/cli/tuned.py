"""Tuned-lens commands: ``vocablens lens train`` and ``vocablens lens eval`` (on the shared ``lens_app``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from vocablens.cli.common import (
    JsonOpt, ModelOpt, DeviceOpt, TpOpt, TrustOpt, show, err, in_command_words, load_model, status,
)
from vocablens.cli.core import lens_app
from vocablens.cli.lenses import check_eval_options, set_threads
from vocablens.models.files.spec import DEFAULT_MODEL

ProgressOpt = Annotated[bool, typer.Option("--progress", help="Show progress on stderr even with --json.")]
CorpusOpt = Annotated[str, typer.Option("--corpus", help="A named corpus (python-docs, debian-handbook, pydoc-topics, cpython-stdlib) or a path (text, jsonl, HTML, directory).")]


def _init_distributed():
    """Join a torchrun process group (gloo) when started by torchrun; returns (rank, world)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


@lens_app.command("train")
def lens_train(
    model: ModelOpt = DEFAULT_MODEL,
    corpus: CorpusOpt = "python-docs",
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the lens (lens.safetensors + config.json) and its checkpoints.")] = Path("tuned-lens"),
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 250,
    tokens_per_step: Annotated[int, typer.Option("--tokens-per-step", help="Tokens per step (all processes).")] = 4096,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per packed chunk.")] = 512,
    lr: Annotated[float, typer.Option("--lr", help="Learning-rate scale (torch lr = lr*(1-momentum), as the reference).")] = 1.0,
    weight_decay: Annotated[float, typer.Option("--weight-decay")] = 1e-3,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Max gradient norm (0 = off).")] = 1.0,
    warmup: Annotated[int, typer.Option("--warmup", help="Linear warmup steps.")] = 0,
    loss: Annotated[str, typer.Option("--loss", help="kl (to the final distribution) or ce (to the next token).")] = "kl",
    seed: Annotated[int, typer.Option("--seed", help="Data order.")] = 0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Use at most this many training tokens (0 = all).")] = 0,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Documents held out for eval.")] = 0.1,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Checkpoint every N steps (0 = at the end).")] = 10,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint in --out.")] = False,
    gemm_dtype: Annotated[str, typer.Option("--gemm-dtype", help="float32 or bfloat16 inputs of the training LM-head GEMMs.")] = "float32",
    chunk_rows: Annotated[int, typer.Option("--chunk-rows", help="(layer, token) rows per LM-head GEMM; memory ~ 3*rows*V*4 bytes.")] = 2048,
    threads: Annotated[int, typer.Option("--threads", help="torch threads (0 = torch's default).")] = 0,
    init: Annotated[str, typer.Option("--init", help="zero (= the logit lens, as the paper) or regression (least-squares start, see regression_init).")] = "zero",
    init_tokens: Annotated[int, typer.Option("--init-tokens", help="Training tokens for --init regression's fit.")] = 8192,
    save_dtype: Annotated[str, typer.Option("--save-dtype", help="float32 or bfloat16 storage of the saved lens.")] = "float32",
    force: Annotated[bool, typer.Option("--force", help="Replace a lens already in --out.")] = False,
    progress: ProgressOpt = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Train a tuned lens (Belrose et al. 2023) on a frozen model; checkpoints go to --out."""
    from vocablens.corpus import load_documents
    from vocablens.handle.lenses.training import check_train_options
    from vocablens.lens.train import TrainSettings

    settings = TrainSettings(steps=steps, tokens_per_step=tokens_per_step, seq_len=seq_len, lr=lr,
                             weight_decay=weight_decay, grad_clip=grad_clip, warmup_steps=warmup, loss=loss,
                             seed=seed, chunk_rows=chunk_rows, gemm_dtype=gemm_dtype)
    settings.validate()
    check_train_options(out_dir, init, save_dtype, force, resume)  # fails before the corpus or the model is read
    set_threads(threads)
    rank, _ = _init_distributed()
    quiet = (json_ and not progress) or rank != 0
    docs = load_documents(corpus)  # a missing or empty corpus fails before the model loads
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)

    def started(info: dict) -> None:
        if not quiet:
            err.print(f"training data: {info['tokens']} tokens in {info['tokens'] // seq_len} chunks of {seq_len} "
                      f"from {info['documents']} documents of {corpus}", style="dim", soft_wrap=True)

    res = lm.train_lens(corpus, out_dir, settings, max_tokens or None, val_fraction, seed, init=init,
                        init_tokens=init_tokens, resume=resume, checkpoint_every=checkpoint_every,
                        save_dtype=save_dtype, force=True, docs=docs, on_step=_progress(quiet, steps),
                        command="vocablens lens train " + " ".join(_argv_tail()),
                        status=lambda msg: status(msg, quiet=quiet), started=started)
    if rank != 0:
        return
    show(res, json_)


def _argv_tail() -> list[str]:
    """The command's arguments after ``train``, with each path reduced to its last component (the
    lens's config travels to other machines; a local path means nothing there)."""
    import shlex
    import sys

    args = sys.argv[1:]
    if "train" in args:
        args = args[args.index("train") + 1:]
    out = []
    for a in args:
        if not a.startswith("-") and ("/" in a or os.sep in a) and Path(a).expanduser().name:
            a = Path(a).expanduser().name
        out.append(shlex.quote(a))
    return out


class _progress:
    """A rich progress bar on stderr with loss and tokens/s; when stderr is not a terminal, a line at
    step 1, every 10 steps, at the end, and whenever 10 s passed without one (a heartbeat also
    inside a long step, with the ETA)."""

    def __init__(self, quiet: bool, steps: int) -> None:
        self.quiet, self.steps, self.bar, self.task, self.beat = quiet, steps, None, None, None
        self.step, self.t0 = 0, time.perf_counter()

    def _beat_line(self) -> str:
        el = time.perf_counter() - self.t0
        eta = f"{el / self.step * (self.steps - self.step):.0f} s" if self.step else "unknown"
        if self.step >= self.steps:
            return f"training: {self.steps} steps done, {el:.0f} s; finishing"
        return f"training: step {self.step + 1}/{self.steps} running, {el:.0f} s, ETA {eta}"

    def __enter__(self):
        if self.quiet:
            return None
        self.t0 = time.perf_counter()
        if err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                                TimeRemainingColumn(), console=err)
            self.bar.start()
            self.task = self.bar.add_task("train", total=self.steps, loss="-", tps="-")
        else:
            from vocablens.cli.progress import plain_status

            self.beat = plain_status(f"training: {self.steps} steps ...", beat=self._beat_line)

        def on_step(info):
            self.step = info.step
            if self.bar is not None:
                self.bar.update(self.task, completed=info.step, loss=f"{info.loss:.4f}",
                                tps=f"{info.tokens_per_s:.1f}")
            elif (info.step == 1 or info.step % 10 == 0 or info.step == info.steps
                  or self.beat.clock() - self.beat.last >= self.beat.every):
                err.print(f"step {info.step}/{info.steps} loss {info.loss:.4f} nats "
                          f"(layer 0 {info.layer_loss[0]:.3f}, layer {len(info.layer_loss) - 1} "
                          f"{info.layer_loss[-1]:.3f}) lr {info.lr:.4f} |g| {info.grad_norm:.3f} "
                          f"{info.tokens_per_s:.1f} tok/s", soft_wrap=True)
                self.beat.last = self.beat.clock()

        return on_step

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        if self.beat is not None:
            self.beat.close()
        return False


@lens_app.command("eval")
def lens_eval(
    model: ModelOpt = DEFAULT_MODEL,
    lens_path: Annotated[str, typer.Option("--lens", help="Lens folder or file (tuned: ours or tuned-lens's params.pt; jacobian: ours or a published lens.pt), or a hub id from the local cache (default: the lenses shipped for the model).")] = "",
    kind: Annotated[str, typer.Option("--kind", help="The lenses to score, a comma list of logit, tuned, jacobian (default logit,tuned).")] = "logit,tuned",
    corpus: CorpusOpt = "",
    split: Annotated[str, typer.Option("--split", help="validation (held out, default) or train or all.")] = "validation",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens to score.")] = 4096,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per chunk.")] = 512,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a plot: .html (plotly) or .png (matplotlib).")] = None,
    threads: Annotated[int, typer.Option("--threads", help="torch threads (0 = torch's default).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --plot file.")] = False,
    progress: ProgressOpt = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    tp: TpOpt = False,
) -> None:
    """Per layer, every lens asked for (default logit vs tuned) on the same held-out text: KL to final, CE (nats, bits/byte), entropy, top-1 agreement."""
    from vocablens.cli.lenses import parse_kinds

    kinds = parse_kinds(kind)
    if kinds != ["logit", "tuned"]:
        from vocablens.cli.lenses import eval_kinds

        return eval_kinds(kinds, model, lens_path, corpus, split, max_tokens, seq_len, plot, threads, force,
                          progress, json_, trust_remote_code, device)
    from vocablens.cli.lenses import lens_caption
    from vocablens.cli.progress import stage_progress
    from vocablens.handle.lenses.evaluation import lens_eval_inputs
    from vocablens.parallel.processes import init_from_env

    check_eval_options(max_tokens, seq_len, split, plot, force)
    set_threads(threads)
    from vocablens.cli.torchrun import group_device

    # under torchrun: rows split over ranks, sums all-reduced, rank 0 prints (--tp: the model split instead)
    rank, _ = init_from_env(group_device(tp, device))
    quiet = (json_ and not progress) or rank != 0
    inputs = lens_eval_inputs(model, lens_path or None, corpus or None, split,  # before the model loads
                              notes=None if quiet else (lambda line: err.print(in_command_words(line), style="dim")))
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet, tp=tp)

    bar = [(lambda *_: None), (lambda: None)]  # the progress bar, opened when scoring starts

    def started(lens, tokens: int, data: dict) -> None:
        if not quiet:
            err.print(lens_caption("tuned", lens), style="dim", soft_wrap=True)
            err.print(f"scoring {tokens} tokens of {data['corpus']} ({split}) at {lm.borders.n_layers + 1} layers, "
                      f"both lenses", style="dim", soft_wrap=True)
        bar[:] = stage_progress("lens eval", "tokens", quiet=quiet)

    try:
        res = lm.eval_lens(inputs, max_tokens=max_tokens, seq_len=seq_len, plot=plot, force=force,
                           status=lambda msg: status(msg, quiet=quiet), started=started,
                           progress=lambda *a: bar[0](*a))
    finally:
        bar[1]()
    if rank != 0:
        return
    show(res, json_, notes=[f"wrote {plot}"] if plot is not None else [])
