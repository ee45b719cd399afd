"""Where a ``--lens`` points: a local file or folder, or a lens published on the Hugging Face Hub,
downloaded at a pinned commit (offline: read from the local cache; :mod:`vocablens.lens.hub`).

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


def resolve_lens_source(spec: str, kind: str | None = None, model_spec: str = "smollm2") -> Path:
    """A local path for ``spec``: the path itself when it exists, else a hub lens
    (:func:`vocablens.lens.hub.resolve_hub_lens`: ``OWNER/REPO[/PATH][@REVISION]`` downloaded at a pinned
    commit, or read from the local cache when offline; the short forms ``published``,
    ``jacobian:published``, ``tuned:published`` for ``model_spec``'s ``kind`` lens).

    Raises:
        BadInput: neither a local path nor a hub lens there (one line, saying what was looked for).
    """
    from vocablens.lens.hub import SHORT_FORMS, resolve_hub_lens

    p = Path(spec).expanduser()
    if p.exists():
        return p
    parts = [x for x in str(spec).strip("/").split("/") if x]
    if str(spec) in SHORT_FORMS or (len(parts) >= 2 and not str(spec).startswith((".", "/", "~"))):
        return resolve_hub_lens(str(spec), kind, model_spec)
    raise BadInput(f"--lens {spec}: no such file or folder")


__all__ = ["resolve_lens_source"]
