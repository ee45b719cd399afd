"""Fitting the Jacobian lens (Gurnee et al. 2026, Methods): the exact average Jacobian per layer.

The estimator is the reference's (``anthropics/jacobian-lens``, ``jlens/fitting.py``; TransformerLens
4.3 ``JacobianLens.fit`` reproduces it): for one prompt,

    J_l = (1/|P|) Σ_{p ∈ P} Σ_{p' ∈ P} ∂h_L[p'] / ∂h_l[p]        (causality: terms with p' < p are 0)

with P = positions ``skip_first .. T-2`` (attention sinks and the last position out), and the lens is
the mean of J_l over prompts. See :mod:`vocablens.lens.jacobian` for the lens itself.

How: reverse mode, vector-Jacobian products batched over output directions. A cotangent that is the
one-hot e_i at every valid target position, pulled back to layer l, gives at each source position p
the row i of Σ_{p'} ∂h_L[p']/∂h_l[p] — for *every* layer l at once, from one backward pass, because
all layers lie on the path to h_L. So d VJPs per prompt give all L matrices exactly. Forward mode
(JVPs) would need d passes *per layer* (L·d in all) for the same result, which is why reverse mode is
used. The prompt is replicated ``dim_batch`` times along the batch axis (k copies of B prompts),
forwarded once with the graph kept, and each backward plants k output directions (one per copy):
``ceil(d / k)`` backwards per batch of prompts. The graph is rooted at the lowest fitted layer (a leaf
tensor replaces the stream there), the model's parameters are frozen for the duration (their
``requires_grad`` flags put back afterwards) so no weight gradient is formed, and neither the final
norm nor the LM head is run. Only positions ``skip_first .. T-2`` are in the graph
(:func:`~vocablens.lens.stream_graph.suffix_graph`): the first ``skip_first`` run once without grad
into the model's key/value cache (they are no sources, and by causality a source p reaches only
targets p' >= p through positions >= p, so for every source they are constants), and the last
position is not run (it is no target and reaches no earlier position). The terms are the same as the
whole sequence's; every backward is T' = T - 1 - skip_first positions long instead of T (TransformerLens
4.3 differentiates all T).

Cost per batch of B prompts of T tokens: one forward of k·B·T tokens, plus ceil(d/k) backward passes
of k·B·T' tokens through the blocks above the root (each ≈ 1 forward's FLOPs: input gradients only).
In all ≈ d·B·T' · 2·N_blocks FLOPs (N_blocks = the blocks' parameters), i.e. about d·T'/T forward
passes per prompt, whatever k. Peak memory: the kept graph of k·B·T' tokens (activations of every
block above the root, the cache of k·B·skip_first keys and values) plus, per backward, one
[k·B, T', d] gradient per fitted layer, plus the sums S·d²·4 bytes (float32; float64 for a float64
model).

Resumable like ``lens train``: a checkpoint (``checkpoint.safetensors``: the running sums; ``checkpoint.json``:
prompts done, settings, data hash, model identity) written through :mod:`vocablens.files` every
``checkpoint_every`` batches; ``resume`` continues exactly where it stopped.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile
from vocablens.lens.jacobian import FORMAT, JacobianLens
from vocablens.lens.stream_graph import frozen, stream_graph, suffix_graph
from vocablens.lens.tuned import model_identity, read_pair, save_files
from vocablens.models import Borders

CKPT_FILE = "checkpoint.safetensors"
CKPT_META = "checkpoint.json"
#: leading positions left out of the average (the reference's SKIP_FIRST_N_POSITIONS)
SKIP_FIRST = 16


@dataclass(frozen=True)
class JacobianFitSettings:
    """Settings of :func:`fit_jacobian_lens` (saved with the lens and in checkpoints).

    Attributes:
        skip_first: leading positions left out of sources and targets (attention sinks); the last
            position is always left out (it has no next token).
        dim_batch: output directions per backward pass (k): the prompt batch is replicated k times.
        prompt_batch: prompts per forward (B; they must have equal length).
        layers: stream layers to fit (None = all 0..L-1).
    """

    skip_first: int = SKIP_FIRST
    dim_batch: int = 8
    prompt_batch: int = 1
    layers: tuple[int, ...] | None = None

    def validate(self, n_layers: int) -> list[int]:
        """The layers to fit. Raises BadInput for out-of-range settings."""
        if self.skip_first < 0:
            raise BadInput(f"skip_first must be >= 0; got {self.skip_first}")
        if self.dim_batch < 1 or self.prompt_batch < 1:
            raise BadInput(f"dim_batch and prompt_batch must be >= 1; got {self.dim_batch}, {self.prompt_batch}")
        layers = list(range(n_layers)) if self.layers is None else sorted(set(int(x) for x in self.layers))
        bad = [x for x in layers if not 0 <= x < n_layers]
        if not layers or bad:
            raise BadInput(f"Jacobian-lens layers must lie in 0..{n_layers - 1} (layer {n_layers} is the output "
                           f"itself); got {list(self.layers or [])}")
        return layers


@dataclass(frozen=True)
class FitProgress:
    """Where a fit is: prompts done / total, backward passes of the current batch, seconds so far."""

    prompts_done: int
    prompts: int
    pass_done: int
    passes: int
    seconds: float


def jacobian_sums(borders: Borders, ids: torch.Tensor, layers: Sequence[int], skip_first: int = SKIP_FIRST,
                  dim_batch: int = 8, on_pass: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """Σ over the B prompts of ``ids`` [B, T] of their per-prompt J_l (module docstring), for each
    layer in ``layers``: [S, d, d] in float32 (float64 for a float64 model), on the CPU.

    Only positions ``skip_first .. T-2`` are in the graph (:func:`suffix_graph`; the last position is
    no target and, by causality, reaches no earlier one, so it is not run at all).

    Args:
        borders: the model (eval mode; its parameters' ``requires_grad`` flags are left as found).
        ids: [B, T] int64, prompts of one length T > skip_first + 1.
        layers: stream layers 0..L-1 (increasing).
        skip_first: leading positions left out.
        dim_batch: k, output directions per backward (memory grows with k, FLOPs do not).
        on_pass: called as ``on_pass(done, passes)`` after each backward.

    Raises:
        BadInput: prompts too short, a model in training mode.
    """
    ids = torch.as_tensor(ids)  # cpu: the prompts as passed; the graph moves them to the model's device
    if ids.dim() == 1:
        ids = ids[None]
    B, T = ids.shape
    if T <= skip_first + 1:
        raise BadInput(f"prompts of {T} tokens leave no position to average after skipping {skip_first} and the last; "
                       f"use longer prompts (more than {skip_first + 1} tokens) or a smaller skip_first")
    if borders.model.training:
        raise BadInput("the model is in training mode (dropout); call model.eval() before fitting a Jacobian lens")
    d, L = borders.d_model, borders.n_layers
    k = max(1, min(int(dim_batch), d))
    root = min(layers)
    acc = torch.float64 if borders.input_embedding.dtype == torch.float64 else torch.float32
    sums = torch.zeros(len(layers), d, d, dtype=acc)  # cpu: the running sums, one place for every device
    with frozen(borders.model):
        # row j*B + b = copy j of prompt b; the last position is dropped (no target, reaches nothing earlier)
        store = suffix_graph(borders, ids[:, : T - 1].repeat(k, 1), root, layers, skip_first)
        target = store[L]
        sources = [store[ly] for ly in layers]
        Ts = target.shape[1]  # T - 1 - skip_first, or T - 1 when the model takes no cache
        dev = target.device
        vpos = torch.arange(Ts - (T - 1 - skip_first), Ts, device=dev)  # the positions averaged
        copies = torch.arange(k, device=dev)
        cot = torch.zeros_like(target)
        passes = math.ceil(d / k)
        with torch.enable_grad():
            for n_pass, start in enumerate(range(0, d, k)):
                n = min(k, d - start)
                cot.zero_()
                view = cot.view(k, B, Ts, d)
                view[copies[:n, None, None], :, vpos[None, :, None], (start + copies[:n])[:, None, None]] = 1.0
                grads = torch.autograd.grad(target, sources, grad_outputs=cot, retain_graph=n_pass < passes - 1)
                for s, g in enumerate(grads):
                    rows = g.reshape(k, B, Ts, d)[:n, :, vpos.to(g.device)].to(acc).mean(dim=2).sum(dim=1)  # [n, d]
                    sums[s, start: start + n] += rows.cpu()  # cpu: into the running sums
                del grads
                if on_pass is not None:
                    on_pass(n_pass + 1, passes)
    return sums


def _batches(prompts: list[torch.Tensor], size: int) -> list[list[int]]:
    """Consecutive prompts of equal length in groups of at most ``size`` (order kept)."""
    out: list[list[int]] = []
    for i, x in enumerate(prompts):
        if out and len(out[-1]) < size and prompts[out[-1][0]].numel() == x.numel():
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _prompts(rows) -> list[torch.Tensor]:
    if torch.is_tensor(rows):
        if rows.dim() == 1:
            rows = rows[None]
        if rows.dim() != 2:
            raise BadInput(f"prompts must be [N, T] token ids or a list of [T_i]; got shape {tuple(rows.shape)}")
        return list(rows)
    out = [torch.as_tensor(r).flatten() for r in rows]
    if not out:
        raise BadInput("no prompts to fit on")
    return out


def fit_jacobian_lens(borders: Borders, rows, settings: JacobianFitSettings = JacobianFitSettings(),
                      checkpoint_dir: str | Path | None = None, checkpoint_every: int = 1, resume: bool = False,
                      data_info: dict | None = None, on_progress: Callable[[FitProgress], None] | None = None,
                      name: str | None = None) -> JacobianLens:
    """Fit a Jacobian lens on a frozen model (Gurnee et al. 2026; estimator and cost: module docstring).

    Args:
        borders: the model (nothing of it is modified).
        rows: prompts: [N, T] int64 token ids (e.g. :func:`vocablens.corpus.pack_tokens`), or a list of
            [T_i] tensors (equal-length neighbours share a forward). Prompts of at most
            ``skip_first + 1`` tokens are refused.
        settings: :class:`JacobianFitSettings`.
        checkpoint_dir: where checkpoints go; ``checkpoint_every``: every N batches (0 = only at the end).
        resume: continue from ``checkpoint_dir``'s checkpoint (same prompts, settings and model).
        data_info: provenance of the prompts (corpus, tokens), stored with the lens.
        on_progress: called with a :class:`FitProgress` after every backward pass.
        name: the model's name, recorded in the lens.

    Returns:
        :class:`~vocablens.lens.jacobian.JacobianLens` over ``settings.layers`` (default 0..L-1),
        ``settings["n_prompts"]`` the prompts averaged; its matrices on the model's device.

    Raises:
        BadInput: bad settings or prompts, resume without a checkpoint.
        CheckpointMismatch: the checkpoint is for another model, other settings or other prompts.
    """
    layers = settings.validate(borders.n_layers)
    prompts = _prompts(rows)
    short = [i for i, p in enumerate(prompts) if p.numel() <= settings.skip_first + 1]
    if short:
        raise BadInput(f"prompt {short[0] + 1} has {prompts[short[0]].numel()} tokens; each needs more than "
                       f"{settings.skip_first + 1} (skip_first + the last position)")
    data_info = dict(data_info or {})
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(p.to(torch.int64).cpu().numpy().tobytes() + b"|")  # cpu: the prompts' hash
    data_info.setdefault("prompts_sha256", digest.hexdigest()[:16])
    identity = model_identity(borders, name)
    sets = asdict(settings) | {"layers": layers}
    batches = _batches(prompts, settings.prompt_batch)
    sums = None
    start, n_done = 0, 0
    if resume:
        if checkpoint_dir is None:
            raise BadInput("`resume` needs a checkpoint directory")
        tensors, meta = load_fit_checkpoint(checkpoint_dir)
        if (meta.get("model") or {}).get("unembed_sha256") != identity["unembed_sha256"]:
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} is for another model")
        if meta.get("settings") != sets:
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made with other settings: "
                                     f"{meta.get('settings')}")
        if (meta.get("data") or {}).get("prompts_sha256") != data_info["prompts_sha256"]:
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made on other prompts")
        sums, start, n_done = tensors["sums"], int(meta["next_batch"]), int(meta["n_done"])
    t0 = time.perf_counter()
    for bi in range(start, len(batches)):
        group = batches[bi]
        ids = torch.stack([prompts[i] for i in group])

        def on_pass(done: int, passes: int, _group=group) -> None:
            if on_progress is not None:
                on_progress(FitProgress(n_done, len(prompts), done, passes, time.perf_counter() - t0))

        part = jacobian_sums(borders, ids, layers, settings.skip_first, settings.dim_batch, on_pass)
        sums = part if sums is None else sums + part
        n_done += len(group)
        if checkpoint_dir is not None and checkpoint_every > 0 and (bi + 1) % checkpoint_every == 0:
            _save_checkpoint(checkpoint_dir, sums, bi + 1, n_done, sets, data_info, identity)
    if checkpoint_dir is not None:
        _save_checkpoint(checkpoint_dir, sums, len(batches), n_done, sets, data_info, identity)
    tokens = sum(int(p.numel()) for p in prompts)
    info = {"estimator": "jacobian_lens (reference: targets summed, sources averaged)", **sets,
            "n_prompts": n_done, "tokens": tokens, "data": data_info,
            "fit_dtype": str(borders.input_embedding.dtype).replace("torch.", ""),
            "seconds_this_run": round(time.perf_counter() - t0, 1)}
    return JacobianLens((sums / n_done).float(), layers, borders.n_layers, identity, info).to(borders.read_device)


def _save_checkpoint(dirpath, sums, next_batch, n_done, sets, data_info, identity) -> None:
    meta = {"format": FORMAT + "-checkpoint", "next_batch": next_batch, "n_done": n_done, "settings": sets,
            "data": data_info, "model": identity}
    save_files(Path(dirpath), {"sums": sums}, meta, CKPT_FILE, CKPT_META)


def load_fit_checkpoint(dirpath: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a fitting checkpoint: ``({"sums": [S, d, d]}, meta)``.

    Raises:
        BadInput: no checkpoint there. CorruptModelFile: truncated / malformed files.
    """
    dirpath = Path(dirpath)
    if not (dirpath / CKPT_FILE).exists():
        raise BadInput(f"no checkpoint in {dirpath} (expected {CKPT_FILE} and {CKPT_META})")
    tensors, meta = read_pair(dirpath, CKPT_FILE, CKPT_META)
    if meta.get("format") != FORMAT + "-checkpoint" or "sums" not in tensors:
        raise CorruptModelFile(f"{dirpath / CKPT_META} is not a vocablens Jacobian-lens checkpoint")
    return tensors, meta


__all__ = ["FitProgress", "JacobianFitSettings", "SKIP_FIRST", "fit_jacobian_lens", "frozen", "jacobian_sums",
           "load_fit_checkpoint", "stream_graph"]
