"""Published lenses fetched from the Hugging Face Hub: ``OWNER/REPO[/PATH][@REVISION]`` and the short
forms of the two public collections.

Online, the revision (a branch, tag or commit; default ``main``) is resolved to its commit once and
every file is downloaded at that commit (``huggingface_hub``: progress bars on stderr, interrupted
downloads resumed, files kept in the usual cache), so the lens read is pinned; :func:`hub_origin`
reads the pin back from the cached path for the lens's provenance. Offline (``HF_HUB_OFFLINE=1``), or
for a lens already cached at a commit, only the local cache is read, as before.

The collections (``vocablens/data/published_lenses.json``):

- ``jacobian:published``: the Jacobian lenses of ``neuronpedia/jacobian-lens`` (fitted on 1,000
  wikitext prompts; Gurnee et al. 2026), found by the model's hub id or short name as TransformerLens 4's
  ``jacobian_lens_registry.json`` lists them;
- ``tuned:published``: tuned-lens's Space ``AlignmentResearch/tuned-lens`` (Belrose et al. 2023), folder
  ``lens/<hub id>/`` (``config.json`` + ``params.pt``, read with ``torch.load(weights_only=True)``);
- ``published``: the collection of the kind asked for (``--kind``).

What each file records of its model (name, revision, shape) is checked by the loaders as for a local file.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL

#: the short forms of ``--lens``: ``published`` (the kind asked for) and ``KIND:published``
SHORT_FORMS = ("published", "jacobian:published", "tuned:published")
_TYPES = {"model": "models", "space": "spaces", "dataset": "datasets"}


@lru_cache(maxsize=1)
def collections() -> dict:
    """The published collections: ``{"jacobian": {"repo", "repo_type", "models": {short: {"hub_ids",
    "file"}}}, "tuned": {"repo", "repo_type", "folder"}}``."""
    return json.loads((resources.files("vocablens") / "data" / "published_lenses.json").read_text())


def offline() -> bool:
    """Whether Hugging Face offline mode is set (``HF_HUB_OFFLINE``, as huggingface_hub reads it)."""
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except Exception:  # huggingface_hub absent: only the cache (there is none) can be read
        return True
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def split_hub_spec(spec: str) -> tuple[str, str, str | None]:
    """``OWNER/REPO[/PATH][@REVISION]`` -> ``(repo, path, revision)`` (path ``""`` for the whole repo)."""
    body, rev = spec, None
    if "@" in spec.rsplit("/", 1)[-1]:
        body, rev = spec.rsplit("@", 1)
        if not rev:
            raise BadInput(f"`path` {spec}: an empty revision after '@'")
    parts = [x for x in body.strip("/").split("/") if x]
    return "/".join(parts[:2]), "/".join(parts[2:]), rev


def model_hub_id(model_spec: str) -> str | None:
    """The hub id of the model ``model_spec`` names: the default model's, a hub id, a catalogue alias's,
    or the ``_name_or_path`` a model directory's ``config.json`` records; None when unknown (a GGUF file)."""
    from vocablens.models.files.catalogue import catalogue_entry

    spec = str(model_spec)
    if spec.lower() in (DEFAULT_MODEL, "smollm2-135m-instruct", "default"):
        return "HuggingFaceTB/SmolLM2-135M-Instruct"
    entry = catalogue_entry(spec)
    if entry is not None:
        return entry.hub_id
    p = Path(spec).expanduser()
    if (p / "config.json").is_file():
        try:
            name = json.loads((p / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
        except (OSError, ValueError):
            return None
        return name if isinstance(name, str) and name.count("/") == 1 and not Path(name).exists() else None
    return spec if spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not p.exists() else None


def published_spec(kind: str, model_spec: str) -> tuple[str, str | None]:
    """The hub spec (``OWNER/REPO/PATH``, repo type) of the published ``kind`` lens for ``model_spec``.

    Raises:
        BadInput: an unknown kind, a model without a known hub id, or one the collection does not list.
    """
    if kind not in ("jacobian", "tuned"):
        raise BadInput(f"`path` published serves a tuned or Jacobian lens; got kind {kind!r}")
    hub_id = model_hub_id(model_spec)
    col = collections()[kind]
    if hub_id is None:
        raise BadInput(f"`path` {kind}:published: the model {model_spec!r} has no hub id to look up in "
                       f"{col['repo']}; give `path` {col['repo']}/PATH")
    if kind == "tuned":
        return f"{col['repo']}/{col['folder'].format(hub_id=hub_id)}", col["repo_type"]
    want = {hub_id.lower(), hub_id.split("/")[-1].lower(), str(model_spec).lower()}
    for short, entry in col["models"].items():
        if want & {short.lower(), *(h.lower() for h in entry["hub_ids"])}:
            return f"{col['repo']}/{entry['file']}", col["repo_type"]
    raise BadInput(f"`path` jacobian:published: {col['repo']} has no lens for {hub_id} "
                   f"(it has {len(col['models'])}: {', '.join(sorted(col['models']))})")


def cached(repo: str, inner: str, revision: str | None) -> Path | None:
    """``inner`` of ``repo`` in the local cache (any repo type) at ``revision`` (a commit, or a branch or
    tag the cache has a ref for; None: the newest snapshot), or None."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except Exception:  # huggingface_hub absent: no cache
        return None
    for folder in _TYPES.values():
        root = Path(HF_HUB_CACHE) / f"{folder}--{repo.replace('/', '--')}"
        snaps = root / "snapshots"
        if not snaps.is_dir():
            continue
        if revision is None:
            cands = sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        else:
            ref = root / "refs" / revision
            cands = [snaps / (ref.read_text().strip() if ref.is_file() else revision)]
        for snap in cands:
            if (snap / inner).exists():
                return snap / inner
    return None


def hub_origin(path: str | Path) -> dict | None:
    """Where a cached hub file came from, read off its cache path: ``{"repo", "repo_type", "revision"
    (the commit), "path"}``; None for a file outside the Hugging Face cache."""
    parts = Path(path).parts
    for i in range(len(parts) - 2):
        head = parts[i].split("--")
        if len(head) >= 3 and head[0] in _TYPES.values() and parts[i + 1] == "snapshots":
            rtype = next(k for k, v in _TYPES.items() if v == head[0])
            return {"repo": "/".join(head[1:]), "repo_type": rtype, "revision": parts[i + 2],
                    "path": "/".join(parts[i + 3:])}
    return None


def with_origin(load):
    """Decorate a lens loader ``load(cls, path, ...)``: the lens it returns records :func:`hub_origin`
    of ``path`` in ``settings["hub"]`` when the file came from the hub cache (shown in its provenance)."""
    import functools

    @functools.wraps(load)
    def wrapped(cls, path, *args, **kwargs):
        lens = load(cls, path, *args, **kwargs)
        origin = hub_origin(Path(path).expanduser())
        if origin is not None and isinstance(getattr(lens, "settings", None), dict):
            lens.settings["hub"] = origin
        return lens

    return wrapped


def fetch(spec: str, repo_type: str | None = None) -> Path:
    """A local path for the hub spec ``OWNER/REPO[/PATH][@REVISION]``: the cache when offline (or when
    ``REVISION`` is a commit already cached), else downloaded at the resolved commit.

    Raises:
        BadInput: offline and not cached; the hub unreachable; no such repository, revision or path
            (one line each).
    """
    repo, inner, revision = split_hub_spec(spec)
    hit = cached(repo, inner, revision) if revision and len(revision) == 40 else None
    if hit is not None:
        return hit
    if offline():
        hit = cached(repo, inner, revision)
        if hit is None:
            raise BadInput(f"`path` {spec}: not in the local cache of the Hugging Face hub and HF_HUB_OFFLINE is set "
                           "(download it where the hub is reachable, or unset HF_HUB_OFFLINE)")
        return hit
    rtype, info = _repo_info(spec, repo, revision, repo_type)
    return _download(spec, repo, inner, rtype, info)


def _repo_info(spec: str, repo: str, revision: str | None, repo_type: str | None):
    """``(repo type, RepoInfo)`` at ``revision``, trying model, space, dataset unless ``repo_type``."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi()
    for rtype in [repo_type] if repo_type else list(_TYPES):
        try:
            return rtype, api.repo_info(repo, revision=revision, repo_type=rtype)
        except RevisionNotFoundError:
            raise BadInput(f"`path` {spec}: the hub repository {repo!r} has no revision {revision!r}") from None
        except RepositoryNotFoundError:
            continue
        except HfHubHTTPError as exc:
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                continue
            raise BadInput(f"`path` {spec}: the hub at {constants.ENDPOINT} answered "
                           f"{str(exc).splitlines()[0][:120]}") from None
        except Exception as exc:  # connection refused, DNS, timeout: one line, never a traceback
            raise BadInput(f"`path` {spec}: the hub at {constants.ENDPOINT} cannot be reached "
                           f"({exc.__class__.__name__}); set HF_HUB_OFFLINE=1 to read the local cache") from None
    raise BadInput(f"`path` {spec}: no hub repository {repo!r} (or it is private)")


def _download(spec: str, repo: str, inner: str, rtype: str, info) -> Path:
    """Download ``inner`` (a file, or every file under a folder) of ``repo`` at the commit ``info.sha``;
    returns its path in the cache's snapshot of that commit."""
    from huggingface_hub import hf_hub_download

    files = [s.rfilename for s in (info.siblings or [])]
    under = [inner] if inner in files else [f for f in files if not inner or f.startswith(inner.rstrip("/") + "/")]
    if not under:
        raise BadInput(f"`path` {spec}: {repo} at {info.sha[:12]} holds no {inner!r}")
    try:
        for f in under:
            got = Path(hf_hub_download(repo, f, revision=info.sha, repo_type=rtype))
    except Exception as exc:  # a broken connection mid-download: the .incomplete file is resumed next time
        raise BadInput(f"`path` {spec}: the download failed ({exc.__class__.__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''}); run again to resume it") from None
    snapshot = got
    for _ in Path(f).parts:
        snapshot = snapshot.parent
    return snapshot / inner if inner else snapshot


def resolve_hub_lens(spec: str, kind: str | None = None, model_spec: str = DEFAULT_MODEL) -> Path:
    """A local path for a ``--lens`` that names the hub: a short form (:data:`SHORT_FORMS`, ``kind``
    the lens kind wanted) or ``OWNER/REPO[/PATH][@REVISION]``.

    Raises:
        BadInput: as :func:`published_spec` and :func:`fetch`; a short form whose kind differs from ``kind``.
    """
    if spec in SHORT_FORMS:
        want = spec.split(":")[0] if ":" in spec else kind
        if kind is not None and want != kind:
            raise BadInput(f"`path` {spec} names a {want} lens; this reads a {kind} lens")
        target, rtype = published_spec(str(want), model_spec)
        return fetch(target, rtype)
    return fetch(spec)


__all__ = ["SHORT_FORMS", "cached", "collections", "fetch", "hub_origin", "model_hub_id", "offline",
           "published_spec", "resolve_hub_lens", "split_hub_spec", "with_origin"]
