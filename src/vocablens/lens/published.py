"""Where a ``--lens`` points: a local file or folder, or a lens published on the Hugging Face Hub,
read from the local cache only (no network).

Both published formats are understood by the loaders: tuned-lens's (``params.pt`` + ``config.json``,
:func:`vocablens.lens.tuned.load_tuned_lens_library`) and the Jacobian lens's (``lens.pt``,
:func:`vocablens.lens.jacobian.load_published`). What each file records about the model it was fitted
for is checked by :func:`vocablens.lens.identity.verify_identity`. A hub id is ``OWNER/REPO`` or ``OWNER/REPO/PATH``
(PATH: the file or folder inside the repository, e.g. ``neuronpedia/jacobian-lens/gpt2-small/jlens/
Salesforce-wikitext/gpt2_jacobian_lens.pt``, or ``AlignmentResearch/tuned-lens/lens/gpt2``).
"""

from __future__ import annotations

from pathlib import Path

from vocablens.errors import BadInput


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
        raise BadInput(f"`path` {spec}: no such local path, and the hub repository {repo!r}"
                       f"{' holds no ' + inner if inner else ''} in the local cache (offline; download it first)")
    raise BadInput(f"`path` {spec}: no such file or folder")


__all__ = ["resolve_lens_source"]
