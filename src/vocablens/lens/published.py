"""Where a ``--lens`` points: a local file or folder, or a lens published on the Hugging Face Hub,
read from the local cache only (no network).

Both published formats are understood by the loaders: tuned-lens's (``params.pt`` + ``config.json``,
:func:`load_tuned_lens_library`, here) and the Jacobian lens's (``lens.pt``,
:func:`vocablens.lens.jacobian.load_published`). What each file records about the model it was fitted
for is checked by :func:`vocablens.lens.identity.verify_identity`. A hub id is ``OWNER/REPO`` or ``OWNER/REPO/PATH``
(PATH: the file or folder inside the repository, e.g. ``neuronpedia/jacobian-lens/gpt2-small/jlens/
Salesforce-wikitext/gpt2_jacobian_lens.pt``, or ``AlignmentResearch/tuned-lens/lens/gpt2``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.lens.tuned import CONFIG_FILE, TunedLens, read_json
from vocablens.models import Borders

#: the tuned-lens library's file names (``TunedLens.save(path, ckpt="params.pt", config="config.json")``)
TUNED_LENS_PARAMS = "params.pt"


def _cached_snapshots(repo_id: str) -> list[Path]:
    """Snapshot folders of ``repo_id`` (model, dataset or space) in the local Hugging Face cache."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except Exception:  # huggingface_hub absent or too old: no cache to search
        return []
    out = []
    for kind in ("models", "spaces", "datasets"):
        root = Path(HF_HUB_CACHE) / f"{kind}--{repo_id.replace('/', '--')}" / "snapshots"
        if root.is_dir():
            out.extend(sorted(root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True))
    return out


def resolve_lens_source(spec: str) -> Path:
    """A local path for ``spec``: the path itself when it exists, else a hub id looked up in the local cache.

    Raises:
        BadInput: neither a local path nor a cached hub file (one line, saying what was looked for).
    """
    p = Path(spec).expanduser()
    if p.exists():
        return p
    parts = [x for x in str(spec).strip("/").split("/") if x]
    if len(parts) >= 2 and not str(spec).startswith((".", "/", "~")):
        repo, inner = "/".join(parts[:2]), "/".join(parts[2:])
        for snap in _cached_snapshots(repo):
            cand = snap / inner if inner else snap
            if cand.exists():
                return cand
        raise BadInput(f"--lens {spec}: no such local path, and the hub repository {repo!r}"
                       f"{' holds no ' + inner if inner else ''} in the local cache (offline; download it first)")
    raise BadInput(f"--lens {spec}: no such file or folder")


def load_tuned_lens_library(path: str | Path, borders: Borders | None = None) -> TunedLens:
    """Read a lens saved by the tuned-lens library (AlignmentResearch/tuned-lens,
    ``tuned_lens/nn/lenses.py`` ``TunedLens.save``): ``params.pt`` (``torch.save`` of its
    ``layer_translators`` state dict: ``{i}.weight`` [d, d], ``{i}.bias`` [d], i = 0..L-1) +
    ``config.json`` (``TunedLensConfig``: ``base_model_name_or_path``, ``d_model``,
    ``num_hidden_layers``, ``bias``, ``base_model_revision``, ``unembed_hash``, ``lens_type``). The
    layouts correspond: both compute ``h + A h + b`` on the residual stream of layer i (the input of
    block i for i = 0). The model name, revision and unembedding hash are checked against ``borders``
    (:func:`vocablens.lens.identity.verify_identity`).

    ``params.pt`` is read with ``torch.load(weights_only=True)`` (no unpickling of code).

    Raises:
        CorruptModelFile: unreadable file, missing keys, or shapes that do not match the config.
        CheckpointMismatch: ``borders`` given and its shapes, name, revision or head differ.
    """
    path = Path(path)
    cfg = read_json(path / CONFIG_FILE)
    try:
        d, L = int(cfg["d_model"]), int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        raise CorruptModelFile(f"{path / CONFIG_FILE} lacks d_model / num_hidden_layers") from None
    try:
        state = torch.load(path / TUNED_LENS_PARAMS, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptModelFile(f"cannot read {path / TUNED_LENS_PARAMS}: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(state, dict):
        raise CorruptModelFile(f"{path / TUNED_LENS_PARAMS} does not hold a state dict")
    first = state.get("0.weight")
    lens = TunedLens(d, L, {"name": cfg.get("base_model_name_or_path") or None,
                            "revision": cfg.get("base_model_revision") or None,
                            "tuned_lens_unembed_hash": cfg.get("unembed_hash") or None},
                     {"source": "tuned-lens library", "lens_type": cfg.get("lens_type"),
                      "stored_dtype": str(first.dtype).replace("torch.", "") if torch.is_tensor(first) else None})
    with torch.no_grad():
        for i in range(L):
            w = state.get(f"{i}.weight")
            if w is None or tuple(w.shape) != (d, d):
                raise CorruptModelFile(f"{path / TUNED_LENS_PARAMS}: translator {i} weight missing or not [{d}, {d}]")
            lens.weight[i].copy_(w.float())
            bvec = state.get(f"{i}.bias")
            if bvec is not None:
                if tuple(bvec.shape) != (d,):
                    raise CorruptModelFile(f"{path / TUNED_LENS_PARAMS}: translator {i} bias is not [{d}]")
                lens.bias[i].copy_(bvec.float())
    if borders is not None:
        lens.check_model(borders)
        lens.to(borders.device)
    return lens


__all__ = ["TUNED_LENS_PARAMS", "load_tuned_lens_library", "resolve_lens_source"]
