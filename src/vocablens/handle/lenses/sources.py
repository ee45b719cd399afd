"""Where lenses are, before any model loads: the lens of each kind a command asks for
(:func:`find_lenses`), every kind a folder holds (:func:`lenses_at`, the explorer's ``--lens``), and
the shards of a Jacobian-lens fit merged into one lens (:func:`merge_shards`, ``vocablens lens merge``).
None of these needs a model; the CLI and the explorer call them to refuse bad input in one line first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


def find_lenses(kinds: Sequence[str], model: str, lens_path: str | Path | None) -> dict[str, Path]:
    """Where each non-logit kind's lens is, before the model loads: ``lens_path`` (``--lens``: a folder
    may hold both a tuned and a Jacobian lens; a published file serves its own kind) or the lens shipped
    for ``model`` (:func:`vocablens.lens.tuned.find_lens`, :func:`vocablens.lens.jacobian.find_jacobian_lens`).

    Raises:
        BadInput: ``lens_path`` with only the logit lens, or no lens of a kind asked for.
    """
    from vocablens.lens.jacobian import find_jacobian_lens
    from vocablens.lens.tuned import find_lens

    wanted = [k for k in kinds if k != "logit"]
    if lens_path and not wanted:
        raise BadInput("`lens_path` reads a tuned or Jacobian lens: add `kind` tuned or `kind` jacobian")
    return {k: find_lens(model, lens_path) if k == "tuned" else find_jacobian_lens(model, lens_path) for k in wanted}


def lenses_at(path: str | Path, model_spec: str = DEFAULT_MODEL) -> dict[str, Path]:
    """Every lens kind the folder or file ``path`` holds, as ``{kind: where}`` for ``tuned`` and/or
    ``jacobian`` (:func:`~vocablens.lens.tuned.find_lens`, :func:`~vocablens.lens.jacobian.find_jacobian_lens`):
    a folder may hold a tuned lens, a Jacobian lens or both; a published ``lens.pt`` is a Jacobian lens.
    Only where the files are is decided here; reading and checking them is the loaders' work.

    Raises:
        BadInput: ``path`` is not there, or holds no lens of either kind (one line naming both layouts).
    """
    from vocablens.lens.jacobian import CONFIG_FILE as J_CONFIG, LENS_FILE as J_FILE, PUBLISHED_FILE, find_jacobian_lens
    from vocablens.lens.published import resolve_lens_source
    from vocablens.lens.tuned import CONFIG_FILE, LENS_FILE, find_lens

    resolve_lens_source(str(path))  # not there at all: say so first
    found = {}
    for kind, find in (("tuned", find_lens), ("jacobian", find_jacobian_lens)):
        try:
            found[kind] = find(model_spec, path)
        except BadInput:
            continue
    if not found:
        raise BadInput(f"no lens in {path}: a tuned lens is {LENS_FILE} + {CONFIG_FILE} (or tuned-lens's params.pt), "
                       f"a Jacobian lens {J_FILE} + {J_CONFIG} (or a published {PUBLISHED_FILE}); "
                       "`path` takes a folder holding either")
    return found


def merge_shards(paths: Sequence, out, save_dtype: str = "float16", force: bool = False) -> dict:
    """``vocablens lens merge``: the shards of a Jacobian-lens fit merged exactly and saved (no model
    needed; :func:`vocablens.lens.jacobian_merge.merge_lens_files`); returns its record.

    Raises:
        BadInput, CheckpointMismatch, OutputExists: as :func:`~vocablens.lens.jacobian_merge.merge_lens_files`.
    """
    from vocablens.lens.jacobian_merge import merge_lens_files

    return merge_lens_files(paths, out, save_dtype, force)


__all__ = ["find_lenses", "lenses_at", "merge_shards"]
