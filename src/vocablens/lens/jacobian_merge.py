"""A Jacobian-lens fit split into shards and merged exactly (``lens fit-jacobian --shard I/N``,
``vocablens lens merge``, torchrun).

The lens is a mean over prompts of per-prompt matrices (:mod:`vocablens.lens.jacobian_fit`), so a fit on
disjoint slices of the prompts merges exactly: ``J = Σ_i n_i J_i / Σ_i n_i`` with ``n_i`` the prompts of
shard i (the reference code ``anthropics/jacobian-lens`` fits large models by ``--shard i/N`` and merges
the same way, weighted by prompt count). The merge is computed in float64 from the shards' stored
matrices: shards saved in float32 merge to the one-process fit within float32 rounding (about 1e-6
relative); float16 shards add their storage rounding (about 5e-4 relative).

Shards merge only when they are parts of one fit: :func:`fit_record` is what must agree (the model's
unembedding hash, name and revision, the dtype the model ran in, the fitted layers, the estimator,
``skip_first``, the corpus and its content hash, the manifest of all the prompts before slicing, the
prompt length, the split and the number of shards); the shards themselves must be distinct.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from vocablens.errors import BadInput, CheckpointMismatch


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (1 <= I <= N) -> ``(I, N)``.

    Raises:
        BadInput: not of that form.
    """
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise BadInput(f"`shard` takes I/N (e.g. 2/8); got {text!r}") from None
    if not 1 <= i <= n:
        raise BadInput(f"`shard` I/N needs 1 <= I <= N; got {text!r}")
    return i, n


def shard_range(n_prompts: int, index: int, count: int) -> tuple[int, int]:
    """Prompts ``[start, stop)`` of shard ``index`` (1-based) of ``count``: contiguous, disjoint, the first
    ``n_prompts % count`` shards one longer.

    Raises:
        BadInput: fewer prompts than shards.
    """
    if n_prompts < count:
        raise BadInput(f"{n_prompts} prompts cannot be cut into {count} shards; use fewer shards or more tokens")
    base, extra = divmod(n_prompts, count)
    start = (index - 1) * base + min(index - 1, extra)
    return start, start + base + (1 if index - 1 < extra else 0)


def manifest_sha256(rows: Sequence[torch.Tensor] | torch.Tensor) -> str:
    """SHA-256 (16 hex digits) of a list of prompts' token ids, in order: what shards of one fit share."""
    digest = hashlib.sha256()
    for p in rows:
        digest.update(torch.as_tensor(p).to(torch.int64).cpu().numpy().tobytes() + b"|")  # cpu: the hash
    return digest.hexdigest()[:16]


#: what a shard records that every shard of one fit must share: (where, key, what it is called)
FIT_KEYS = (("model", "unembed_sha256", "model (unembedding hash)"), ("model", "name", "model name"),
            ("model", "revision", "model revision"), ("fitting", "fit_dtype", "dtype"),
            ("fitting", "layers", "layers"), ("fitting", "estimator", "estimator"),
            ("fitting", "skip_first", "skip_first"), ("data", "corpus", "corpus"),
            ("data", "corpus_sha256", "corpus content"), ("data", "manifest_sha256", "corpus manifest"),
            ("data", "seq_len", "prompt length"), ("data", "split", "split"),
            ("shard", "count", "number of shards"))


def fit_record(lens) -> dict:
    """What :data:`FIT_KEYS` names, read from a fitted lens (``{label: value}``)."""
    s = lens.settings
    where = {"model": lens.identity, "fitting": s, "data": s.get("data") or {}, "shard": s.get("shard") or {}}
    return {label: where[part].get(key) for part, key, label in FIT_KEYS}


def merge_jacobian_lenses(lenses: Sequence) -> "object":
    """One lens from the shards of a fit: ``J = Σ n_i J_i / Σ n_i`` (float64, then float32).

    Args:
        lenses: :class:`~vocablens.lens.jacobian.JacobianLens` shards (vocablens files: they record
            their prompts and provenance).

    Returns:
        A :class:`~vocablens.lens.jacobian.JacobianLens` whose settings are the first shard's with
        ``n_prompts`` and ``tokens`` summed and ``shards`` listing each shard (index, prompts, range,
        prompts hash, stored dtype).

    Raises:
        BadInput: fewer than two lenses, a lens that records no prompt count.
        CheckpointMismatch: shards whose :func:`fit_record` differ (one line: what differs, both values),
            the same shard twice.
    """
    from vocablens.lens.jacobian import JacobianLens

    if len(lenses) < 2:
        raise BadInput("lens merge needs at least two shards")
    counts = [int(ln.settings.get("n_prompts") or 0) for ln in lenses]
    if min(counts) < 1:
        raise BadInput("a lens to merge records no prompt count (fit it with `vocablens lens fit-jacobian`)")
    first = fit_record(lenses[0])
    for i, ln in enumerate(lenses[1:], start=2):
        rec = fit_record(ln)
        for label, v in rec.items():
            if v != first[label]:
                raise CheckpointMismatch(f"shard {i} differs from shard 1 in {label}: {_short(v)} vs {_short(first[label])}; "
                                         "only shards of one fit merge")
    seen: dict = {}
    for i, ln in enumerate(lenses, start=1):
        key = (ln.settings.get("shard") or {}).get("index"), (ln.settings.get("data") or {}).get("prompts_sha256")
        if key in seen:
            raise CheckpointMismatch(f"shards {seen[key]} and {i} are the same shard (index {key[0]}, prompts "
                                     f"{key[1]}); each shard merges once")
        seen[key] = i
    total = sum(counts)
    J = sum(ln.J.double().cpu() * n for ln, n in zip(lenses, counts)) / total  # cpu: the merge, float64
    settings = dict(lenses[0].settings)
    settings["n_prompts"] = total
    settings["tokens"] = sum(int(ln.settings.get("tokens") or 0) for ln in lenses)
    settings["shards"] = [{**(ln.settings.get("shard") or {}), "n_prompts": n,
                           "prompts_sha256": (ln.settings.get("data") or {}).get("prompts_sha256"),
                           "stored_dtype": ln.settings.get("stored_dtype")} for ln, n in zip(lenses, counts)]
    settings.pop("shard", None)
    settings.pop("quality", None)  # measured again on the merged lens
    return JacobianLens(J.float(), lenses[0].layers, lenses[0].n_layers, dict(lenses[0].identity), settings)


def reduce_over_ranks(lens) -> None:
    """Under torchrun (an initialised process group of W > 1 ranks), replace each rank's lens (fitted on
    its own prompts) by the lens of all ranks' prompts, in place: the prompt-weighted sums and the
    counts are all-reduced in float64 (``J = Σ_r n_r J_r / Σ_r n_r``, the one-process fit up to float
    rounding). A no-op in a world of one."""
    from vocablens.ops.vocab_parallel.comm import allreduce_sum, world

    if world()[1] == 1:
        return
    n = int(lens.settings["n_prompts"])
    sums = allreduce_sum(lens.J.double() * n)
    counts = allreduce_sum(torch.tensor([n, int(lens.settings.get("tokens") or 0)], dtype=torch.float64,
                                        device=lens.J.device))
    lens.J = (sums / counts[0]).float()
    lens.settings["n_prompts"], lens.settings["tokens"] = int(counts[0]), int(counts[1])
    lens.settings["world_size"] = world()[1]


def prompts_for(rows: torch.Tensor, shard: tuple[int, int] | None, info: dict) -> tuple[torch.Tensor, dict, int]:
    """The prompts this process fits: the shard's slice of ``rows`` [N, T] (``shard`` = (I, N)), then under
    torchrun this rank's contiguous share of it. Records in ``info`` the manifest of all the prompts
    (``manifest_sha256``) and the shard's own (``prompts_sha256``); returns ``(rows, shard record, rank)``.

    Raises:
        BadInput: fewer prompts than shards, or than processes.
    """
    from vocablens.ops.vocab_parallel.comm import share, world

    info["manifest_sha256"] = manifest_sha256(rows)
    rec: dict = {}
    if shard is not None:
        start, stop = shard_range(int(rows.shape[0]), *shard)
        rows = rows[start:stop]
        rec = {"index": shard[0], "count": shard[1], "range": [start, stop]}
    info["prompts_sha256"] = manifest_sha256(rows)
    rank, size = world()
    if size > 1:
        if rows.shape[0] < size:
            raise BadInput(f"{rows.shape[0]} prompts cannot be split over {size} processes; give more tokens")
        a, b = share(int(rows.shape[0]))
        rows = rows[a:b]
        rec["world_size"] = size
    return rows, rec, rank


def merge_lens_files(paths: Sequence, out, save_dtype: str = "float16", force: bool = False) -> dict:
    """``vocablens lens merge``: read the shards' folders, merge them (:func:`merge_jacobian_lenses`) and
    save the lens to ``out``; returns ``{"out", "n_prompts", "tokens", "layers", "shards"}``.

    Raises:
        BadInput: a bad ``save_dtype``, a folder without a lens. CheckpointMismatch: as
            :func:`merge_jacobian_lenses`. OutputExists: ``out`` holds a lens and not ``force``.
    """
    from vocablens.lens.jacobian import JacobianLens

    if save_dtype not in ("float16", "bfloat16", "float32"):
        raise BadInput(f"`save_dtype` must be float16, bfloat16 or float32; got {save_dtype!r}")
    merged = merge_jacobian_lenses([JacobianLens.load(p) for p in paths])
    merged.save(out, dtype=getattr(torch, save_dtype), force=force)
    s = merged.settings
    return {"out": str(out), "n_prompts": s["n_prompts"], "tokens": s["tokens"], "layers": merged.layers,
            "shards": s["shards"]}


def _short(v) -> str:
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."


__all__ = ["FIT_KEYS", "fit_record", "manifest_sha256", "merge_lens_files", "merge_jacobian_lenses", "parse_shard", "prompts_for", "reduce_over_ranks", "shard_range"]
