"""How good a lens is, stored with it: per-layer KL to the model's final distribution and top-1 agreement
on held-out text, beside the logit lens's on the same tokens (Belrose et al. 2023, §4; the measure of
:func:`vocablens.lens.compare.compare_lenses`).

A fitted or trained lens carries its figures in ``settings["quality"]`` (saved in its file); a lens
without them (a published file, a merged lens) gets them measured on first use and cached
(:func:`cache_path`: keyed by the lens's matrices, the model's head and the text), so every reader — the
CLI table's footer, ``--json`` under ``"lenses"``, the report's caption, the explorer — can say how well
the lens does at the layer shown (:func:`quality_at`; the line: :func:`vocablens.render.lens.quality_text`).

The record: ``{"corpus", "corpus_sha256", "split", "tokens", "kl" [L+1], "top1" [L+1], "logit_kl" [L+1],
"logit_top1" [L+1], "mean_kl", "logit_mean_kl", "mean_top1", "logit_mean_top1"}`` — KL in nats, top-1 as a
fraction; ``None`` at a layer the lens does not read; means over the layers 0..L-1 the lens reads.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from vocablens.models import Borders


def _clean(xs: list[float]) -> list[float | None]:
    return [None if x is None or math.isnan(x) else round(float(x), 5) for x in xs]


def _mean(xs: list[float | None], n: int) -> float | None:
    vals = [x for x in xs[:n] if x is not None]
    return round(sum(vals) / len(vals), 5) if vals else None


def measure_quality(borders: Borders, lens, kind: str, rows: torch.Tensor, data: dict | None = None) -> dict:
    """Per-layer KL(final ‖ lens) and top-1 agreement of ``lens`` and of the logit lens on ``rows``.

    Args:
        borders: the model. lens: a tuned or Jacobian lens (checked against the model).
        kind: the lens's kind (``tuned``, ``jacobian``).
        rows: [N, T] int64 held-out token rows (T >= 2).
        data: the rows' provenance (``corpus``, ``corpus_sha256``, ``split``).

    Returns:
        The quality record (module docstring). Cost: one forward per row plus 2·V·d FLOPs per (lens,
        layer < L, token).

    Raises:
        BadInput: empty rows. CheckpointMismatch: a lens of another model.
    """
    from vocablens.lens.compare import compare_lenses

    res = compare_lenses(borders, {"logit": None, kind: lens}, rows)
    L, m = res.n_layers, res.metrics
    rec = {"corpus": (data or {}).get("corpus"), "corpus_sha256": (data or {}).get("corpus_sha256"),
           "split": (data or {}).get("split"), "tokens": res.tokens,
           "kl": _clean(m[kind]["kl"]), "top1": _clean(m[kind]["top1_agreement"]),
           "logit_kl": _clean(m["logit"]["kl"]), "logit_top1": _clean(m["logit"]["top1_agreement"])}
    for key in ("kl", "top1"):
        rec[f"mean_{key}"] = _mean(rec[key], L)
        rec[f"logit_mean_{key}"] = _mean(rec[f"logit_{key}"], L)
    return rec


def quality_at(lens, layer: int) -> dict | None:
    """``{"kl", "top1", "logit_kl", "logit_top1"}`` of ``lens``'s stored quality at stream layer ``layer``
    (None where not measured)."""
    q = (getattr(lens, "settings", None) or {}).get("quality")
    if not q or not 0 <= layer < len(q.get("kl") or []):
        return None
    return {k: q[k][layer] for k in ("kl", "top1", "logit_kl", "logit_top1")}


def lens_digest(lens) -> str:
    """SHA-256 (16 hex) of a lens's parameters (a Jacobian lens's matrices, a tuned lens's state)."""
    h = hashlib.sha256()
    if hasattr(lens, "J"):
        h.update(lens.J.detach().float().cpu().numpy().tobytes())  # cpu: the hash
    else:
        for k, v in sorted(lens.state_dict().items()):
            h.update(k.encode() + v.detach().float().cpu().numpy().tobytes())  # cpu: the hash
    return h.hexdigest()[:16]


def cache_path(lens, borders: Borders, data: dict) -> Path | None:
    """Where the quality measured on first use for ``lens`` on ``borders``' model and the text ``data``
    (``corpus_sha256``, tokens) is cached: the cache folder of every vocablens cache
    (:func:`vocablens.models.files.gguf_cache.cache_root`), then ``lens-quality/<digest>.json``; None with
    ``VOCABLENS_CACHE=off``."""
    from vocablens.lens.tuned import model_identity
    from vocablens.models.files.gguf_cache import cache_root

    key = json.dumps([lens_digest(lens), model_identity(borders).get("unembed_sha256"), data.get("corpus_sha256"),
                      data.get("split"), data.get("tokens")], sort_keys=True)
    root = cache_root()
    return None if root is None else root / "lens-quality" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def read_cached(path: Path) -> dict | None:
    """The cached quality record at ``path``, or None (missing or unreadable: measured again)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "kl" in rec else None


def write_cached(path: Path, rec: dict) -> None:
    """Write a quality record to the cache atomically; a cache that cannot be written is skipped."""
    from vocablens.files import atomic_path

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(rec, sort_keys=True), encoding="utf-8")
    except Exception:  # a read-only home: the figures are shown, just not kept
        pass


__all__ = ["cache_path", "lens_digest", "measure_quality", "quality_at", "read_cached",
           "write_cached"]
