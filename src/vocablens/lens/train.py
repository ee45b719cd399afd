"""Training a tuned lens (Belrose et al. 2023, §3): settings, the loop, checkpoints and exact resume.

Defaults and where ours differ from the paper: :mod:`vocablens.lens.tuned`'s docstring. Per step the
frozen model runs once without gradients; the loss of every layer (KL(final ‖ lens), or CE to the next
token) and its gradient with respect to the lens states come from :func:`vocablens.ops.linear_kl`
(token-chunked, analytic: ``softmax(lens) - p_final``), so the [T, V] distributions of all layers
never exist at once and autograd only sees the translators and the final norm. Checkpoints
(``checkpoint.safetensors`` + ``checkpoint.json``) are written through :mod:`vocablens.files`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile
from vocablens.lens.train_step import optimizer_step
from vocablens.lens.tuned import FORMAT, TunedLens, read_pair, save_files
from vocablens.models import Borders

CKPT_FILE = "checkpoint.safetensors"
CKPT_META = "checkpoint.json"


@dataclass(frozen=True)
class TrainSettings:
    """Settings of :func:`train` (saved with the lens and in checkpoints).

    Attributes:
        steps: optimizer steps (>= 1).
        tokens_per_step: tokens per step over all processes (rounded to whole chunks).
        seq_len: tokens per packed chunk.
        lr: learning-rate scale (the reference's ``lr_scale``; torch lr = lr·(1-momentum)).
        momentum: Nesterov momentum.
        weight_decay: L2 on A and b (pulls towards the identity translator).
        grad_clip: max global gradient norm (0 = off).
        warmup_steps: linear warmup steps before the linear decay.
        loss: ``kl`` (to the final distribution) or ``ce`` (to the next token).
        seed: data order.
        chunk_rows: (layer, token) rows per LM-head GEMM (memory: ~3 · rows · V · 4 bytes).
        gemm_dtype: ``float32`` or ``bfloat16`` inputs of the training GEMMs (float32 accumulation
            of the softmax and loss either way).
        micro_batch: chunks per model forward.
    """

    steps: int = 250
    tokens_per_step: int = 4096
    seq_len: int = 512
    lr: float = 1.0
    momentum: float = 0.9
    weight_decay: float = 1e-3
    grad_clip: float = 1.0
    warmup_steps: int = 0
    loss: str = "kl"
    seed: int = 0
    chunk_rows: int = 2048
    gemm_dtype: str = "float32"
    micro_batch: int = 1

    def validate(self) -> None:
        """Raises BadInput for out-of-range settings."""
        if self.steps < 1:
            raise BadInput(f"`steps` must be at least 1; got {self.steps}")
        if self.seq_len < 2:
            raise BadInput(f"`seq_len` must be at least 2; got {self.seq_len}")
        if self.tokens_per_step < 1:
            raise BadInput(f"`tokens_per_step` must be at least 1; got {self.tokens_per_step}")
        if self.loss not in ("kl", "ce"):
            raise BadInput(f"`loss` must be kl or ce; got {self.loss!r}")
        if self.gemm_dtype not in ("float32", "bfloat16"):
            raise BadInput(f"`gemm_dtype` must be float32 or bfloat16; got {self.gemm_dtype!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise BadInput(f"`lr` must be a positive number; got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise BadInput(f"momentum must be in [0, 1); got {self.momentum}")
        if self.chunk_rows < 1 or self.micro_batch < 1 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise BadInput("chunk_rows and micro_batch must be >= 1, warmup_steps and weight_decay >= 0")

    def rows_per_step(self) -> int:
        return max(1, round(self.tokens_per_step / self.seq_len))

    def lr_at(self, step: int) -> float:
        """Torch learning rate at optimizer step ``step`` (0-based): warmup, then linear decay to 0."""
        base = self.lr * (1.0 - self.momentum) if self.momentum > 0 else self.lr
        if step < self.warmup_steps:
            return base * (step + 1) / (self.warmup_steps + 1)
        rest = max(1, self.steps - self.warmup_steps)
        return base * max(0.0, 1.0 - (step - self.warmup_steps) / rest)


@dataclass(frozen=True)
class StepInfo:
    """Progress of one optimizer step (for progress bars and logs).

    Attributes: step (1-based), steps, loss (sum over layers of mean per-token loss, nats),
    layer_loss ([L] floats, nats), tokens (seen so far, all processes), tokens_per_s (this run),
    lr, grad_norm (before clipping).
    """

    step: int
    steps: int
    loss: float
    layer_loss: list[float]
    tokens: int
    tokens_per_s: float
    lr: float
    grad_norm: float


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did. ``lens`` is trained; ``history`` holds one StepInfo per step run."""

    lens: TunedLens
    history: list[StepInfo]
    seconds: float
    tokens: int
    resumed_from: int = 0


def _dist():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(), dist.get_world_size()
    return None, 0, 1


def save_checkpoint(dirpath: str | Path, lens: TunedLens, opt: torch.optim.Optimizer, step: int,
                    settings: TrainSettings, data_info: dict, history: list[StepInfo]) -> None:
    """Write ``checkpoint.safetensors`` (lens + momentum buffers) and ``checkpoint.json`` atomically."""
    tensors = {"weight": lens.weight.detach().clone(), "bias": lens.bias.detach().clone()}
    for name, p in (("weight", lens.weight), ("bias", lens.bias)):
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            tensors[f"momentum.{name}"] = buf.detach().clone()
    meta = {"format": FORMAT + "-checkpoint", "step": step, "settings": asdict(settings),
            "data": data_info, "model": lens.identity, "d_model": lens.d_model, "n_layers": lens.n_layers,
            "history": [asdict(h) for h in history]}
    save_files(Path(dirpath), tensors, meta, CKPT_FILE, CKPT_META)


def load_checkpoint(dirpath: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises:
        BadInput: no checkpoint there.
        CorruptModelFile: truncated / malformed files.
    """
    dirpath = Path(dirpath)
    if not (dirpath / CKPT_FILE).exists():
        raise BadInput(f"no checkpoint in {dirpath} (expected {CKPT_FILE} and {CKPT_META})")
    tensors, meta = read_pair(dirpath, CKPT_FILE, CKPT_META)  # the pair written together, even if killed
    if meta.get("format") != FORMAT + "-checkpoint":
        raise CorruptModelFile(f"{dirpath / CKPT_META} is not a vocablens tuned-lens checkpoint")
    return tensors, meta


def lens_from_checkpoint(dirpath: str | Path, borders: Borders | None = None) -> TunedLens:
    """The lens held by a training checkpoint (e.g. of an interrupted run), with its settings,
    data provenance and ``stopped_at_step`` in ``settings``.

    Raises:
        BadInput: no checkpoint there.
        CorruptModelFile: truncated / malformed checkpoint.
        CheckpointMismatch: ``borders`` given and the checkpoint is for another model.
    """
    tensors, meta = load_checkpoint(dirpath)
    d, L = int(meta["d_model"]), int(meta["n_layers"])
    hist = meta.get("history") or []
    settings = {**(meta.get("settings") or {}), "data": meta.get("data") or {},
                "stopped_at_step": int(meta["step"]),
                "tokens": int(meta["step"]) * TrainSettings(**meta["settings"]).rows_per_step()
                * int(meta["settings"]["seq_len"]),
                "final_loss": hist[-1]["loss"] if hist else None}
    lens = TunedLens(d, L, meta.get("model") or {}, settings)
    with torch.no_grad():
        lens.weight.copy_(tensors["weight"].float())
        lens.bias.copy_(tensors["bias"].float())
    if borders is not None:
        lens.check_model(borders)
        lens.to(borders.read_device)
    return lens


def train(borders: Borders, rows: torch.Tensor, settings: TrainSettings = TrainSettings(),
          lens: TunedLens | None = None, checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, resume: bool = False, data_info: dict | None = None,
          on_step: Callable[[StepInfo], None] | None = None, name: str | None = None) -> TrainResult:
    """Train a tuned lens on a frozen model (Belrose et al. 2023, §3; defaults: module docstring).

    Per step: ``rows_per_step`` packed chunks [seq_len] are read (seeded order; with several
    torch.distributed processes, rank r takes chunks r, r+W, ...), the model runs once without
    gradients, the residual streams of layers 0..L-1 are translated and decoded, and the loss (sum
    over layers of the mean KL(final ‖ lens) per token, nats; or CE to the next token) is
    back-propagated into the translators only. Cost per token: one frozen forward plus, per layer,
    an LM-head forward and backward (2·V·d FLOPs each).

    Args:
        borders: the model (frozen; nothing of it is modified).
        rows: [N, seq_len] int64 packed token ids (:func:`vocablens.corpus.pack_tokens`).
        settings: :class:`TrainSettings`.
        lens: start from this lens (default: a zero lens = the logit lens).
        checkpoint_dir: where checkpoints go (rank 0 writes).
        checkpoint_every: write a checkpoint every N steps (0 = only at the end).
        resume: continue from ``checkpoint_dir``'s checkpoint (exactly: same data order, momentum).
        data_info: provenance of the data (corpus, token count), stored in checkpoints and settings.
        on_step: called after each step with a :class:`StepInfo` (rank 0 only).

    Returns:
        :class:`TrainResult`.

    Raises:
        BadInput: bad settings, rows of the wrong shape, resume without checkpoint.
        CheckpointMismatch: the checkpoint to resume is for another model or other settings.
        TrainingDiverged: a non-finite loss or gradient (names the layer); the last good checkpoint
            stays as it was.
    """
    settings.validate()
    if rows.dim() != 2 or rows.shape[0] < 1 or rows.shape[1] != settings.seq_len:
        raise BadInput(f"training rows must be [N >= 1, seq_len={settings.seq_len}]; got {list(rows.shape)}")
    dist, rank, world = _dist()
    data_info = dict(data_info or {})
    data_info.setdefault("n_rows", int(rows.shape[0]))
    data_info.setdefault("rows_sha256", hashlib.sha256(rows.cpu().numpy().tobytes()).hexdigest()[:16])  # cpu: once
    if lens is None:
        lens = TunedLens.for_model(borders, name)
    else:
        lens.check_model(borders)
    gemm_dtype = torch.bfloat16 if settings.gemm_dtype == "bfloat16" else torch.float32
    U = borders.unembedding.float32()
    weight = U.weight.detach().to(gemm_dtype)
    opt = torch.optim.SGD([lens.weight, lens.bias], lr=settings.lr_at(0), momentum=settings.momentum,
                          nesterov=settings.momentum > 0, weight_decay=settings.weight_decay)
    start, history = 0, []
    if resume:
        start, history = _resume(checkpoint_dir, lens, opt, settings, data_info)
    rps = settings.rows_per_step()
    tokens_per_step = rps * settings.seq_len
    t0 = time.perf_counter()
    tokens_run = 0
    step_rows = _row_order(int(rows.shape[0]), rps, settings.seed)

    for step in range(start, settings.steps):
        lr = settings.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        means, loss_sum, gnorm = optimizer_step(U, weight, lens, opt, borders, rows[step_rows(step)[rank::world]],
                                                 settings, dist, step, checkpoint_dir)
        tokens_run += tokens_per_step
        info = StepInfo(step=step + 1, steps=settings.steps, loss=loss_sum,
                        layer_loss=means, tokens=(step + 1) * tokens_per_step,
                        tokens_per_s=tokens_run / max(1e-9, time.perf_counter() - t0), lr=lr, grad_norm=gnorm)
        history.append(info)
        if rank == 0:
            last = step + 1 == settings.steps
            if checkpoint_dir is not None and (last or (checkpoint_every and (step + 1) % checkpoint_every == 0)):
                save_checkpoint(checkpoint_dir, lens, opt, step + 1, settings, data_info, history)
            if on_step is not None:
                on_step(info)
    lens.settings = {**asdict(settings), "data": data_info, "tokens": settings.steps * tokens_per_step,
                     "world_size": world, "final_loss": history[-1].loss if history else None}
    return TrainResult(lens=lens, history=history, seconds=time.perf_counter() - t0, tokens=tokens_run,
                       resumed_from=start)


def _resume(checkpoint_dir, lens: TunedLens, opt: torch.optim.Optimizer, settings: TrainSettings,
            data_info: dict) -> tuple[int, list[StepInfo]]:
    """Load ``checkpoint_dir``'s lens and momentum into ``lens`` and ``opt``: -> (its step, its history).
    Raises BadInput (no directory, or the run already done) or CheckpointMismatch (another model,
    other settings, other data)."""
    if checkpoint_dir is None:
        raise BadInput("`resume` needs a checkpoint directory")
    tensors, meta = load_checkpoint(checkpoint_dir)
    if meta.get("model", {}).get("unembed_sha256") != lens.identity.get("unembed_sha256"):
        raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} is for another model")
    if meta.get("settings") != asdict(settings):
        diff = {k: (v, asdict(settings).get(k)) for k, v in (meta.get("settings") or {}).items()
                if asdict(settings).get(k) != v}
        raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made with other settings: {diff}")
    if meta.get("data", {}).get("rows_sha256") != data_info["rows_sha256"]:
        raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made on other data")
    with torch.no_grad():
        lens.weight.copy_(tensors["weight"])
        lens.bias.copy_(tensors["bias"])
    for nm, p in (("weight", lens.weight), ("bias", lens.bias)):
        if f"momentum.{nm}" in tensors:
            opt.state[p]["momentum_buffer"] = tensors[f"momentum.{nm}"].to(p.device, copy=True)
    start = int(meta["step"])
    if start >= settings.steps:
        raise BadInput(f"the checkpoint in {checkpoint_dir} is already at step {start} of {settings.steps}")
    return start, [StepInfo(**h) for h in meta.get("history", [])]


def _row_order(n_rows: int, rps: int, seed: int) -> Callable[[int], list[int]]:
    """step -> the ``rps`` row indices it reads: each epoch a seeded permutation of the ``n_rows`` rows
    (the same on every process and device), read in order across steps."""
    perm_cache: dict[int, list[int]] = {}

    def step_rows(step: int) -> list[int]:
        out = []
        for g in range(step * rps, (step + 1) * rps):
            epoch, i = divmod(g, n_rows)
            if epoch not in perm_cache:
                perm_cache.clear()
                perm_cache[epoch] = torch.randperm(  # cpu: the data order, the same on every device
                    n_rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
            out.append(perm_cache[epoch][i])
        return out
    return step_rows


__all__ = ["CKPT_FILE", "CKPT_META", "StepInfo", "TrainResult", "TrainSettings", "lens_from_checkpoint",
           "load_checkpoint", "save_checkpoint", "train"]
