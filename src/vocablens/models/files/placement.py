"""One model over several devices of one process: accelerate's device map, the borders kept where the stream is.

``load(spec, device_map="auto", max_memory="0=70GiB,1=70GiB,cpu=200GiB")`` places a whole model the
way transformers' ``from_pretrained(device_map=...)`` does (accelerate's hooks move the residual
stream from one device to the next), with one change made before anything loads: the borders are
pinned where the stream is. The token embedding (and ``project_in``) goes to the device where block
0 runs, the final norm, ``project_out`` and the LM head to the device where the last block runs
(a tied head stays one tensor, with the embedding); a border is never offloaded to disk or to CPU
memory behind a GPU, because the analyses read ``W_E`` and ``W_U`` as tensors. Blocks mapped to
``"cpu"`` while a GPU runs the model, or to ``"disk"``, keep their weights there and are brought to
the device that runs them at each forward (accelerate's offload; ``"disk"`` reads the checkpoint's
safetensors files in place, or an offload folder).

Where the map comes from: ``auto`` / ``balanced`` (accelerate's balanced memory over the GPUs),
``balanced_low_0``, ``sequential`` (fill GPU 0, then 1, ...), a JSON file of ``{module name:
device}``, or such a dict; ``max_memory`` caps each device (``{0: "70GiB", "cpu": "200GiB"}`` or
``"0=70GiB,cpu=200GiB"``). Without a device map, ``max_memory`` keeps its other meaning: the blocks
beyond it are streamed from the checkpoint (:mod:`vocablens.models.files.streaming`).

Layer 1 (models): knows transformers and accelerate; analyses never see a device map.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vocablens.errors import BadInput

#: the device maps accelerate computes by name
PLANS = ("auto", "balanced", "balanced_low_0", "sequential")


def device_map_arg(value: Any) -> str | dict[str, Any]:
    """A device map as given (``--device-map`` / ``device_map=``) -> a plan name of :data:`PLANS` or a
    dict ``{module name: device}`` (devices canonical: GPU index int, ``"cpu"``, ``"disk"``, ``"mps"``).

    Args:
        value: a name of :data:`PLANS`, the path of a JSON file holding ``{module name: device}``, or
            such a dict (devices: ``0``, ``"cuda:1"``, ``"cpu"``, ``"disk"``, ``"mps"``).

    Raises:
        BadInput: an unknown name, a file that is missing or not a JSON object, a device that is not
            one of those or not present here (one line naming the value).
    """
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in PLANS:
            return text.lower()
        path = Path(text).expanduser()
        if not text.lower().endswith(".json") and not path.is_file():
            raise BadInput(f"`device_map` takes {', '.join(PLANS)} or a JSON file of {{module: device}}; got {value!r}")
        if not path.is_file():
            raise BadInput(f"`device_map` file {text}: no such file")
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"`device_map` file {text}: cannot be read as JSON ({type(e).__name__})") from None
    if not isinstance(value, dict) or not value:
        raise BadInput(f"`device_map` must map module names to devices (a JSON object); got {type(value).__name__}")
    return {str(k): device_name(v, f"`device_map` entry {k!r}") for k, v in value.items()}


def device_name(v: Any, what: str) -> int | str:
    """One device of a map -> accelerate's spelling: a GPU index (int), ``"cpu"``, ``"disk"`` or ``"mps"``.

    Raises:
        BadInput: not a device, or a GPU this machine does not have.
    """
    text = str(v).strip().lower()
    if text in ("cpu", "disk", "mps"):
        if text == "mps" and not torch.backends.mps.is_available():
            raise BadInput(f"{what}: MPS (Apple GPU) is not available here")
        return text
    if text.startswith("cuda:"):
        text = text[5:]
    if text == "cuda":
        text = "0"
    if not text.isdigit():
        raise BadInput(f"{what}: {v!r} is not a device; use a GPU index (0, cuda:1), cpu or disk")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(text) >= n:
        have = f"GPUs 0..{n - 1}" if n else "no GPU (CUDA is not available)"
        raise BadInput(f"{what}: GPU {text} asked for; this machine has {have}")
    return int(text)


def max_memory_map(value: Any) -> dict[int | str, int] | None:
    """``max_memory`` for a device map -> ``{device: bytes}``.

    Args:
        value: ``"0=70GiB,1=70GiB,cpu=200GiB"`` (sizes as :func:`~vocablens.models.files.streaming.parse_bytes`
            reads them), a dict of the same, or None / ``""`` (accelerate's own estimate of what is free).

    Raises:
        BadInput: an item that is not ``DEVICE=SIZE``, a bad size, ``disk`` (it has no cap), or a
            device this machine does not have.
    """
    from vocablens.models.files.streaming import parse_bytes

    if value in (None, ""):
        return None
    if isinstance(value, (int, float)) or (isinstance(value, str) and "=" not in value):
        raise BadInput(f"with a device map, `max_memory` names each device: 0=70GiB,1=70GiB,cpu=200GiB; got {value!r}")
    items = value.items() if isinstance(value, dict) else [
        tuple(x.split("=", 1)) if "=" in x else (x, None) for x in str(value).split(",") if x.strip()]
    out: dict[int | str, int] = {}
    for k, size in items:
        if size is None:
            raise BadInput(f"`max_memory` items are DEVICE=SIZE (0=70GiB,cpu=200GiB); got {str(k).strip()!r}")
        dev = device_name(k, "`max_memory`")
        if dev == "disk":
            raise BadInput("`max_memory` caps GPUs and the CPU; disk has no cap (what does not fit goes there)")
        out[dev] = parse_bytes(size.strip() if isinstance(size, str) else size)
    return out


def uses_gpu(device_map: str | dict, max_memory: dict | None) -> bool:
    """Whether the model will run on a GPU (for the dtype rule of :func:`vocablens.models.files.source.run_dtype`)."""
    if isinstance(device_map, dict):
        return any(isinstance(v, int) for v in device_map.values())
    if max_memory is not None:
        return any(isinstance(k, int) for k in max_memory)
    return torch.cuda.is_available()


def placed_kwargs(src: str, kw: dict, tdtype, device_map: str | dict, max_memory: dict | None,
                  offload_folder: str | None) -> dict[str, Any]:
    """The ``from_pretrained`` arguments that place the model: ``device_map`` (module -> device, the
    borders pinned: module docstring) and ``offload_folder`` (a temporary folder when the map holds
    ``disk`` and none was given). ``kw``: the other ``from_pretrained`` arguments (trust, hub).

    Raises:
        BadInput: a map that leaves parameters unplaced or names modules the model does not have.
    """
    from transformers import AutoConfig

    from vocablens.models.files.auto_class import auto_model_class

    config = AutoConfig.from_pretrained(src, **kw)
    with torch.device("meta"):  # shapes only; a tied head stays tied (accelerate's init_empty_weights unties it)
        skel = auto_model_class(config).from_config(config, dtype=tdtype or getattr(config, "dtype", None),
                                                    trust_remote_code=kw.get("trust_remote_code", False))
    coarse = device_map if isinstance(device_map, dict) else planned(skel, device_map, max_memory, tdtype)
    fine = pinned(skel, coarse)
    out: dict[str, Any] = {"device_map": fine}
    if "disk" in fine.values():
        out["offload_folder"] = offload_folder or _scratch_folder(out)
    return out


def planned(skel, plan: str, max_memory: dict | None, tdtype) -> dict[str, Any]:
    """accelerate's device map named ``plan`` for the meta-device skeleton ``skel``."""
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map

    no_split = list(getattr(skel, "_no_split_modules", None) or [])
    if plan == "sequential":
        budget = get_max_memory(max_memory)
    else:
        budget = get_balanced_memory(skel, max_memory=max_memory, no_split_module_classes=no_split, dtype=tdtype,
                                     low_zero=plan == "balanced_low_0")
    return infer_auto_device_map(skel, max_memory=budget, no_split_module_classes=no_split, dtype=tdtype)


def _device_of(name: str, coarse: dict[str, Any]) -> Any:
    """The device ``coarse`` gives module ``name``: its own entry or its nearest ancestor's."""
    parts = name.split(".") if name else []
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in coarse:
            return coarse[key]
    raise BadInput(f"`device_map` places no device for {name or 'the model'} (nor for a module above it); "
                   "name every top-level module, or use auto")


def pinned(skel, coarse: dict[str, Any]) -> dict[str, Any]:
    """``coarse`` refined to one entry per block and per border module, the borders pinned where the
    stream is: embedding and ``project_in`` where block 0 runs, final norm, ``project_out`` and head
    where the last block runs (a tied head: with the embedding).

    Raises:
        BadInput: an entry naming no module of the model; a module left without a device.
    """
    from vocablens.models.borders import Borders

    names = {id(m): n for n, m in skel.named_modules()}
    unknown = [k for k in coarse if k and k not in names.values() and k not in dict(skel.named_parameters())]
    if unknown:
        raise BadInput(f"`device_map` names {unknown[0]!r}, which is not a module of this model")
    b = Borders.from_model(skel)
    keep = {id(m) for m in [*b.blocks, b.embedding, b.lm_head, b.final_norm, b.project_in, b.project_out] if m is not None}
    fine: dict[str, Any] = {}
    _refine(skel, "", coarse, keep, names, fine)
    values = list(fine.values())
    main = next((v for v in values if v not in ("cpu", "disk")), "cpu")

    def runs(name: str) -> Any:  # where accelerate runs a module mapped to ``fine[name]``
        return main if fine[name] in ("cpu", "disk") else fine[name]

    first, last = runs(names[id(b.blocks[0])]), runs(names[id(b.blocks[-1])])
    for m in (b.embedding, b.project_in):
        if m is not None:
            fine[names[id(m)]] = first
    for m in (b.final_norm, b.project_out, b.lm_head):
        if m is not None:
            fine[names[id(m)]] = first if (m is b.lm_head and _tied(skel, b, names)) else last
    return fine


def _tied(skel, b, names: dict) -> bool:
    """Whether the head is the embedding: by identity, or (a meta-device skeleton, where transformers
    ties only on load) by the model's own list of tied weights, or its config where it has no list."""
    keys = getattr(skel, "all_tied_weights_keys", None)
    if b.tied or keys is None:
        cfg = getattr(skel, "config", None)
        return b.tied or bool(getattr(cfg, "tie_word_embeddings", False))
    head, emb = names[id(b.lm_head)] + ".weight", names[id(b.embedding)] + ".weight"
    return keys.get(head) == emb or keys.get(emb) == head


def _refine(mod, name: str, coarse: dict, keep: set, names: dict, fine: dict) -> None:
    """Fill ``fine`` for ``mod`` (named ``name``): one entry where its subtree holds no kept module and
    no finer entry of ``coarse``, else its own tensors one by one and its children refined."""
    subtree = [m for m in mod.modules() if m is not mod]
    below = name + "." if name else ""
    split = any(id(m) in keep for m in subtree) or any(k.startswith(below) and k != name for k in coarse if k)
    tensors = [n for n, _ in [*mod.named_parameters(), *mod.named_buffers()]]
    if not tensors:
        return
    if id(mod) in keep or not split:
        fine[name] = _device_of(name, coarse)
        return
    for n, _ in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]:
        fine[below + n] = _device_of(below + n, coarse)
    for cname, child in mod.named_children():
        _refine(child, below + cname, coarse, keep, names, fine)


def _scratch_folder(kwargs: dict) -> str:
    """A fresh folder for offloaded weights that transformers rewrites (most are read in place from
    the checkpoint's safetensors), named in ``kwargs["scratch"]`` too: :func:`remove_scratch_with`
    removes it with the model."""
    import tempfile

    kwargs["scratch"] = tempfile.mkdtemp(prefix="vocablens-offload-")
    return kwargs["scratch"]


def remove_scratch_with(model, folder: str | None) -> None:
    """Remove ``folder`` (a scratch offload folder; None: nothing) once ``model`` is garbage-collected
    or the interpreter exits (``weakref.finalize``)."""
    import shutil
    import weakref

    if folder:
        weakref.finalize(model, shutil.rmtree, folder, True)


def placement_line(b) -> str:
    """One line saying where the parts of the placed model whose borders are ``b`` (its
    :class:`~vocablens.models.Borders` as found, before the readout check) are: ``device map:
    embedding cpu, blocks 0-3 cpu, 4-5 disk, head cpu`` (from ``model.hf_device_map``)."""
    model = b.model
    dm = getattr(model, "hf_device_map", None) or {}
    names = {id(m): n for n, m in model.named_modules()}
    where = [_device_of(names[id(blk)], dm) for blk in b.blocks]
    runs, start = [], 0
    for i in range(1, len(where) + 1):
        if i == len(where) or where[i] != where[start]:
            runs.append(f"{start}-{i - 1} {where[start]}" if i - 1 > start else f"{start} {where[start]}")
            start = i
    dev = lambda m: _device_of(names[id(m)], dm)  # noqa: E731
    return f"device map: embedding {dev(b.embedding)}, blocks {', '.join(runs)}, head {dev(b.lm_head)}"


__all__ = ["PLANS", "device_map_arg", "device_name", "max_memory_map", "placed_kwargs", "placement_line",
           "planned", "pinned", "remove_scratch_with", "uses_gpu"]
