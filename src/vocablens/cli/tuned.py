"""Tuned-lens commands: ``vocablens lens train`` and ``vocablens lens eval`` (on the shared ``lens_app``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from vocablens.cli.common import (
    JsonOpt, ModelOpt, DeviceOpt, TrustOpt, count_bar, emit_json, err, load_model, out, status,
)
from vocablens.cli.core import lens_app
from vocablens.cli.lenses import check_eval_options, set_threads
from vocablens.errors import BadInput, OutputExists

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
    model: ModelOpt = "smollm2",
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
    import torch

    from vocablens.lens.train import TrainSettings, train
    from vocablens.lens.tuned import LENS_FILE, TunedLens

    settings = TrainSettings(steps=steps, tokens_per_step=tokens_per_step, seq_len=seq_len, lr=lr,
                             weight_decay=weight_decay, grad_clip=grad_clip, warmup_steps=warmup, loss=loss,
                             seed=seed, chunk_rows=chunk_rows, gemm_dtype=gemm_dtype)
    settings.validate()
    if init not in ("zero", "regression"):
        raise BadInput(f"--init must be zero or regression; got {init!r}")
    if save_dtype not in ("float32", "bfloat16"):
        raise BadInput(f"--save-dtype must be float32 or bfloat16; got {save_dtype!r}")
    if (out_dir / LENS_FILE).exists() and not force:
        raise OutputExists(f"{out_dir} already holds a tuned lens; pass --force to replace it")
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputExists(f"{out_dir} exists and is not a directory")
    set_threads(threads)
    rank, world = _init_distributed()
    quiet = (json_ and not progress) or rank != 0
    if resume:  # fail before reading the corpus or loading the model
        from vocablens.lens.train import CKPT_FILE

        if not (out_dir / "checkpoint" / CKPT_FILE).exists():
            raise BadInput(f"--resume: no checkpoint in {out_dir / 'checkpoint'} (train without --resume first)")
    from vocablens.corpus import load_documents

    docs = load_documents(corpus)  # a missing or empty corpus fails before the model loads
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    with status(f"tokenizing the training data of {corpus} ...", quiet=quiet):
        rows, info = lm.corpus_rows(corpus, "train", seq_len, max_tokens or None, val_fraction, 0, seed, docs)
    info["model"] = lm.provenance.name
    if not quiet:
        err.print(f"training data: {info['tokens']} tokens in {rows.shape[0]} chunks of {seq_len} "
                  f"from {info['documents']} documents of {corpus}", style="dim", soft_wrap=True)
    lens = TunedLens.for_model(lm.borders, name=lm.provenance.name)
    t0 = time.perf_counter()
    init_info = {"init": init}
    if init == "regression" and not resume:
        from vocablens.lens.regression import regression_init

        n_fit = max(1, min(rows.shape[0] - 1, init_tokens // seq_len))
        with status(f"least-squares start on {n_fit * seq_len} tokens ...", quiet=quiet):
            lens, alphas = regression_init(lm.borders, rows[:n_fit], lens=lens, calib=rows[n_fit: n_fit + 1])
        init_info.update({"init_tokens": n_fit * seq_len, "init_alphas": alphas,
                          "init_seconds": round(time.perf_counter() - t0, 1)})
    with _progress(quiet, steps) as on_step:
        res = train(lm.borders, rows, settings, lens=lens, checkpoint_dir=out_dir / "checkpoint",
                    checkpoint_every=checkpoint_every, resume=resume, data_info=info, on_step=on_step,
                    name=lm.provenance.name)
    wall = time.perf_counter() - t0
    if rank == 0:
        res.lens.settings.update(init_info)
        res.lens.settings["command"] = "vocablens lens train " + " ".join(_argv_tail())
        res.lens.settings["seconds"] = round(wall, 1)
        res.lens.save(out_dir, dtype=torch.bfloat16 if save_dtype == "bfloat16" else torch.float32, force=True)
        from vocablens.render.tuned import train_summary_to_dict

        summary = train_summary_to_dict(res, out_dir, steps, wall, world, info)
        if json_:
            emit_json(summary)
        else:
            out.print(f"saved the tuned lens to {out_dir} ({res.tokens} tokens in {wall:.0f} s, "
                      f"{summary['tokens_per_s']:.1f} tokens/s; final loss {summary['final_loss']:.4f} nats summed over layers)")


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
    model: ModelOpt = "smollm2",
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
) -> None:
    """Per layer, every lens asked for (default logit vs tuned) on the same held-out text: KL to final, CE (nats, bits/byte), entropy, top-1 agreement."""
    from vocablens.cli.lenses import parse_kinds

    kinds = parse_kinds(kind)
    if kinds != ["logit", "tuned"]:
        from vocablens.cli.lenses import eval_kinds

        return eval_kinds(kinds, model, lens_path, corpus, split, max_tokens, seq_len, plot, threads, force,
                          progress, json_, trust_remote_code, device)
    from vocablens.corpus import NAMED_CORPORA, corpus_record, load_documents
    from vocablens.lens.evaluate import evaluate, text_bytes
    from vocablens.lens.tuned import TunedLens, find_lens
    from vocablens.render.tuned import eval_to_dict, print_eval, save_eval_plot

    check_eval_options(max_tokens, seq_len, split, plot, force)
    set_threads(threads)
    from vocablens.ops.vocab_parallel.comm import share
    from vocablens.parallel.processes import init_from_env

    rank, _ = init_from_env()  # under torchrun: rows split over ranks, sums all-reduced, rank 0 prints
    quiet = (json_ and not progress) or rank != 0
    path = find_lens(model, lens_path)
    lens = TunedLens.load(path)  # checked against the model below
    lens_label = lens_path or f"shipped for {model}"  # never a path the user did not give
    data = lens.settings.get("data") or {}
    docs = None
    if not corpus:
        trained_on, trained_sha = str(data.get("corpus") or ""), data.get("corpus_sha256")
        if trained_on in NAMED_CORPORA:
            corpus = trained_on
        elif trained_on and trained_sha and Path(trained_on).exists():
            here = load_documents(trained_on)
            if corpus_record(trained_on, here)["corpus_sha256"] == trained_sha:
                corpus, docs = trained_on, here
        if not corpus:
            corpus = "pydoc-topics"
            if trained_on and not quiet:
                err.print(f"the lens was trained on the corpus {trained_on!r}"
                          f"{' (sha256 ' + trained_sha[:12] + ')' if trained_sha else ''}, which is not here; "
                          f"evaluating on {corpus} ({split}); give --corpus to choose", style="dim")
    docs = load_documents(corpus) if docs is None else docs  # a missing or empty corpus fails before the model loads
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    lens.check_model(lm.borders)
    val_fraction = float(data.get("val_fraction", 0.1)) if split != "all" else 0.0
    seq = min(seq_len, max_tokens)
    if split == "all":
        rows = lm.pack(docs, seq, max_tokens=max_tokens, shrink=True)
        rec = corpus_record(corpus, docs)
        info = {"corpus": rec["corpus"], "corpus_sha256": rec["corpus_sha256"], "split": "all"}
    else:
        with status(f"tokenizing the {split} split of {corpus} ...", quiet=quiet):
            rows, info = lm.corpus_rows(corpus, split, seq, max_tokens, val_fraction, int(data.get("split_seed", 0)),
                               None, docs, shrink=True)
    rows = rows[: max(1, max_tokens // rows.shape[1])]
    name = info["corpus"]
    if not quiet:
        from vocablens.cli.lenses import lens_caption

        err.print(lens_caption("tuned", lens), style="dim", soft_wrap=True)
        err.print(f"scoring {rows.numel()} tokens of {name} ({split}) at {lm.borders.n_layers + 1} layers, "
                  f"both lenses", style="dim", soft_wrap=True)
    start, stop = share(int(rows.shape[0]))
    T = int(rows.shape[1])
    with count_bar(quiet, (stop - start) * T, "lens eval", "tokens", stage="scoring both lenses") as tick:
        res = evaluate(lm.borders, lens, rows, n_bytes=text_bytes(lm.tokenizer, rows),
                       on_row=lambda done, total: tick(int(done * T)))
    if rank != 0:
        return
    if plot is not None:
        save_eval_plot(res, plot, title=f"{lm.provenance.name}: logit vs tuned lens on {name} ({split})")
    if json_:
        from vocablens.render.lens import lens_record

        emit_json(eval_to_dict(res, lm.provenance, lens_label, info, plot, [lens_record("tuned", lens)]))
    else:
        print_eval(res, out, title=f"{lm.provenance.name}, {rows.numel()} tokens of {name} ({split}), lens {lens_label}")
        if plot is not None:
            err.print(f"wrote {plot}", style="dim")
