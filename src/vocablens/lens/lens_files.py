"""Files a lens is saved in: safetensors tensors plus a JSON config written together, atomically, and
read back as the pair written together (the tuned lens, the Jacobian lens and their checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vocablens.errors import BadInput, CorruptModelFile
from vocablens.files import atomic_path

#: the safetensors header key holding the JSON metadata saved with the tensors (see read_pair)
META_KEY = "vocablens"


def read_json(p: Path) -> dict:
    """A JSON object from ``p``.

    Raises:
        BadInput: missing file. CorruptModelFile: not a JSON object (e.g. truncated).
    """
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptModelFile(f"{p} is not valid JSON ({exc.__class__.__name__}); the file may be truncated") from None
    if not isinstance(obj, dict):
        raise CorruptModelFile(f"{p} does not hold a JSON object")
    return obj


def read_safetensors(p: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file. Raises BadInput (missing) or CorruptModelFile (truncated)."""
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist") from None
    except Exception as exc:
        raise CorruptModelFile(f"{p} is truncated or not a safetensors file ({str(exc).splitlines()[0][:120]}); "
                               "save, train or download it again") from None


def read_pair(dirpath: Path, tensor_name: str, meta_name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the metadata that :func:`save_files` wrote together into ``dirpath``.

    The metadata is read from the safetensors header (:data:`META_KEY`) when it is there, else
    from ``meta_name``: a save killed between its two renames leaves the new tensors beside the old
    (or no) JSON file, and the pair read is still the one written together.

    Raises:
        BadInput: a missing file. CorruptModelFile: a truncated or malformed file.
    """
    from safetensors import safe_open

    tensors = read_safetensors(dirpath / tensor_name)
    with safe_open(str(dirpath / tensor_name), framework="pt") as h:
        embedded = (h.metadata() or {}).get(META_KEY)
    if embedded is None:
        return tensors, read_json(dirpath / meta_name)
    try:
        meta = json.loads(embedded)
    except ValueError:
        raise CorruptModelFile(f"{dirpath / tensor_name} holds malformed metadata; save it again") from None
    if not isinstance(meta, dict):
        raise CorruptModelFile(f"{dirpath / tensor_name} holds malformed metadata; save it again")
    return tensors, meta


def check_lens_tensor(path: Path, name: str, t, layers: list[str] | None = None) -> torch.Tensor:
    """THE check of every tensor a lens file holds, on load (tuned lens, Jacobian lens, their published
    formats): a floating-point tensor whose values are all finite, else one line naming the file, the
    tensor and the layer. A lens with an integer matrix or a NaN would give read-outs with no meaning
    (a NaN row ranks the final token first).

    Args:
        path: the file read. name: the tensor's name in it (``weight``, ``J``, ``3.bias``, ``J[5]``).
        t: the tensor (a stack [S, ...] when ``layers`` is given).
        layers: for a stack, how each of its S slices is named (``"layer 3"``, ``"block 5 (stream layer 6)"``).

    Returns:
        ``t``.

    Raises:
        CorruptModelFile: not a tensor, or not floating point (an int32 J).
        NonFiniteWeights (a CorruptModelFile): NaN or inf, at the first such slice.
    """
    from vocablens.errors import NonFiniteWeights

    if not torch.is_tensor(t) or not t.is_floating_point():
        what = str(t.dtype).replace("torch.", "") if torch.is_tensor(t) else type(t).__name__
        raise CorruptModelFile(f"{path}: lens tensor {name} is {what}, not floating point: a lens is never read "
                               "from integer or bool values; save or fit it again in a float dtype")
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return t
    where = ""
    if layers is not None and t.dim() >= 1 and len(layers) == t.shape[0]:
        i = int(bad.reshape(t.shape[0], -1).any(dim=1).nonzero()[0, 0])
        where = f" at {layers[i]}"
    kinds = " and ".join(x for x, m in (("NaN", torch.isnan(t)), ("inf", torch.isinf(t))) if bool(m.any()))
    raise NonFiniteWeights(f"{path}: lens tensor {name}{where} holds {kinds} ({int(bad.sum()):,} entries); a "
                           "lens with a non-finite value is never read: train, fit or download it again")


def save_files(dirpath: Path, tensors: dict[str, torch.Tensor], meta: dict, tensor_name: str, meta_name: str) -> None:
    """Write ``tensor_name`` (safetensors) then ``meta_name`` (JSON) into ``dirpath``, each through
    :func:`vocablens.files.atomic_path` (temporary file, usual permissions, rename: never half a file).

    Raises:
        WriteFailed: the directory cannot be written.
    """
    from safetensors.torch import save_file

    from vocablens.errors import WriteFailed

    try:
        dirpath.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(f"cannot create {dirpath}: {exc.strerror or exc}") from None
    with atomic_path(dirpath / tensor_name) as tmp:  # the tensors carry their metadata: see read_pair
        save_file({k: t.detach().cpu().contiguous() for k, t in tensors.items()}, str(tmp),  # cpu: the file
                  metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    with atomic_path(dirpath / meta_name) as tmp:
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")


__all__ = ["META_KEY", "check_lens_tensor", "read_json", "read_pair", "read_safetensors", "save_files"]
