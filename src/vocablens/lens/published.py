"""Where a ``--lens`` points: a local file or folder, or a lens published on the Hugging Face Hub,
downloaded at a pinned commit (offline: read from the local cache; :mod:`vocablens.lens.hub`).

What a published Jacobian lens's matrices must be to be read on a model (:func:`published_matrix`,
:func:`usable_blocks`) is checked here too. Both published formats are understood by the loaders:
tuned-lens's (``params.pt`` + ``config.json``,
:func:`vocablens.lens.tuned.load_tuned_lens_library`) and the Jacobian lens's (``lens.pt``,
:func:`vocablens.lens.jacobian.load_published`). What each file records about the model it was fitted
for is checked by :func:`vocablens.lens.identity.verify_identity`. A hub id is ``OWNER/REPO`` or ``OWNER/REPO/PATH``
(PATH: the file or folder inside the repository, e.g. ``neuronpedia/jacobian-lens/gpt2-small/jlens/
Salesforce-wikitext/gpt2_jacobian_lens.pt``, or ``AlignmentResearch/tuned-lens/lens/gpt2``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile
from vocablens.lens.lens_files import check_lens_tensor
from vocablens.models.files.spec import DEFAULT_MODEL

#: max |J - I| of a published lens's matrix for the last block (the target layer maps to itself: the
#: identity exactly, stored in float16 or bfloat16 without loss) for it to be read and dropped
IDENTITY_ATOL = 1e-3


def resolve_lens_source(spec: str, kind: str | None = None, model_spec: str = DEFAULT_MODEL) -> Path:
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
    raise BadInput(f"`path` {spec}: no such file or folder")


def published_matrix(path: Path, J: dict, b: int, d: int) -> torch.Tensor:
    """``J[b]`` of a published lens, checked: a [d, d] floating-point tensor with finite values."""
    m = J[b] if b in J else J[str(b)]
    if not torch.is_tensor(m) or tuple(m.shape) != (d, d):
        raise CorruptModelFile(f"{path}: J[{b}] is not a [{d}, {d}] tensor")
    return check_lens_tensor(path, f"J[{b}]", m[None], [f"block {b} (stream layer {b + 1})"])[0]


def identity_gap(m: torch.Tensor) -> float:
    """max |m - I| of a square matrix [d, d] (float32): 0 for the target layer's own Jacobian."""
    return float((m.float() - torch.eye(m.shape[0], device=m.device)).abs().max())


def usable_blocks(blocks: list[int], mats: dict, target, L: int, d: int) -> list[int]:
    """The blocks of a published lens read on a model of L blocks: a matrix for the last block (the
    target layer, which maps to itself) is dropped when it is the identity, as fitting scripts that
    store ``target + 1`` slots write it; everything else must lie below the last block. Messages name
    what the file holds and what the model has, never a model size the file does not record.

    Raises:
        CheckpointMismatch: blocks past the model's, a recorded ``target_layer`` other than its last
            block, a last-block matrix that is not the identity, or (no target recorded) blocks 0..m
            whose reference reading (every block below the target) puts the target elsewhere.
    """
    held = f"this Jacobian lens holds matrices for blocks {layer_span(blocks)} (d_model={d})"
    has = f"the model has {L} blocks (0..{L - 1})"
    if not blocks or blocks[0] < 0 or blocks[-1] >= L:
        raise CheckpointMismatch(f"{held}; {has}")
    if isinstance(target, int) and not isinstance(target, bool) and target != L - 1:
        raise CheckpointMismatch(f"{held} and records target_layer {target} (the block its matrices map to); "
                                 f"{has}, and the lens is read into the last one, block {L - 1}")
    if blocks[-1] == L - 1:
        gap = identity_gap(mats[L - 1])
        if gap > IDENTITY_ATOL:
            raise CheckpointMismatch(f"{held}; {has}: its matrix for block {L - 1}, the last block (the target, "
                                     f"which maps to itself) should be the identity and is not (max |J - I| = "
                                     f"{gap:.3g}): the file does not fit this model")
        blocks = blocks[:-1]
        if not blocks:
            raise CheckpointMismatch(f"{held}: only the target's identity, nothing to read")
    elif target is None and blocks == list(range(blocks[-1] + 1)) and blocks[-1] != L - 2:
        raise CheckpointMismatch(f"{held} and records no target layer: read as the reference writes it (every "
                                 f"block below the target), its target is block {blocks[-1] + 1}; {has}, "
                                 f"and the lens is read into the last one, block {L - 1}")
    return blocks


def layer_span(layers: list[int]) -> str:
    """``[1, 2, 3]`` -> ``"1..3"``; a non-contiguous list as ``"1,3"``; empty -> ``"none"``."""
    if not layers:
        return "none"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


__all__ = ["IDENTITY_ATOL", "identity_gap", "layer_span", "published_matrix", "resolve_lens_source", "usable_blocks"]
