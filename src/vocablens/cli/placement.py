"""Where a command's model goes: ``--device`` (one device) and the global ``--device-map``,
``--max-memory`` (with a device map: each device's cap) and ``--offload-folder``, taken anywhere on
the command line (:func:`take_placement`) and handed to every whole-model load (:func:`placed`).

Without ``--device-map``, a command's own ``--max-memory`` keeps its meaning: the blocks beyond it are
streamed from the checkpoint at each forward (one small machine's last resort). With it, the model is
placed by accelerate over the devices named (:mod:`vocablens.models.files.placement`).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from vocablens.errors import BadInput

#: the placement options of the command running now (:func:`take_placement`; None: none given)
PLACEMENT: dict | None = None

#: global option -> the loader's argument it sets
_TAKEN = {"--device-map": "device_map", "--offload-folder": "offload_folder", "--max-memory": "max_memory"}


def resolve_device(text: str | None) -> str:
    """``--device`` -> a canonical torch device string: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Under torchrun (``LOCAL_RANK`` set), a bare ``cuda`` means ``cuda:LOCAL_RANK``.

    Raises:
        BadInput: an unknown device, CUDA (or MPS) asked for but not available, ``cuda:N`` beyond
            the devices present.
    """
    import torch

    if text is not None and not str(text).strip():
        raise BadInput("--device is empty; use cpu, cuda, cuda:N or mps")
    raw = (text or "cpu").strip()
    try:
        dev = torch.device(raw.lower())
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise BadInput(f"--device {raw!r} is not a device vocablens runs on; use cpu, cuda, cuda:N or mps")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise BadInput(f"--device {raw}: CUDA is not available here (torch {torch.__version__}, {build}); "
                           "use --device cpu")
        if dev.index is None and os.environ.get("LOCAL_RANK", "").isdigit():
            dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % n)
        if dev.index is not None and dev.index >= n:
            raise BadInput(f"--device {raw}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise BadInput(f"--device {raw}: MPS (Apple GPU) is not available here; use --device cpu")
    return "cpu" if dev.type == "cpu" else str(dev)


DeviceOpt = Annotated[str, typer.Option(
    "--device", callback=resolve_device,
    help="Where the model's tensors live and the work runs: cpu (default), cuda, cuda:N, mps. One model over "
         "several devices (with CPU or disk offload): --device-map auto instead (see vocablens --help).")]


def take_placement(args: list[str]) -> list[str]:
    """``args`` without ``--device-map X``, ``--offload-folder D`` and, when ``--device-map`` is there,
    ``--max-memory M`` (anywhere before a ``--``); sets :data:`PLACEMENT` (None when no device map).
    The values are checked now, one line each (:mod:`vocablens.models.files.placement`).

    Raises:
        BadInput: an option without a value, ``--offload-folder`` without ``--device-map``, a bad map
            or a bad ``--max-memory`` for it.
    """
    global PLACEMENT
    PLACEMENT = None
    cut = args.index("--") if "--" in args else len(args)
    if not any(a == "--device-map" or a.startswith("--device-map=") for a in args[:cut]):
        if any(a == "--offload-folder" or a.startswith("--offload-folder=") for a in args[:cut]):
            raise BadInput("--offload-folder holds what --device-map puts on disk: give --device-map too")
        return args
    kept, found, i = [], {}, 0
    while i < cut:
        a = args[i]
        name = a.split("=", 1)[0]
        if name not in _TAKEN:
            kept.append(a)
            i += 1
            continue
        if "=" in a:
            found[_TAKEN[name]], i = a.split("=", 1)[1], i + 1
        elif i + 1 < cut and not args[i + 1].startswith("--"):
            found[_TAKEN[name]], i = args[i + 1], i + 2
        else:
            raise BadInput(f"{name} needs a value" + (": auto, balanced, sequential or FILE.json"
                                                      if name == "--device-map" else ""))
    from vocablens.models.files.placement import device_map_arg, max_memory_map

    try:
        found["device_map"] = device_map_arg(found["device_map"])
        found["max_memory"] = max_memory_map(found.get("max_memory"))
    except BadInput as e:
        raise BadInput(str(e).replace("`device_map`", "--device-map").replace("`max_memory`", "--max-memory")) from None
    PLACEMENT = found
    return kept + args[cut:]


def placed(mode: str, device: str, options: dict) -> tuple[str, dict]:
    """A command's load (``mode``, ``device``, the loader's ``options``) with :data:`PLACEMENT` in it:
    ``("full", options + device map)``; unchanged when no device map was given.

    Raises:
        BadInput: a load of some parts only (the command reads no blocks), or ``--device`` given too.
    """
    if PLACEMENT is None:
        return mode, options
    if mode not in ("full", "streaming"):
        raise BadInput(f"--device-map places a whole model; this command reads its {mode} only (no blocks): "
                       "use --device")
    if device != "cpu":
        raise BadInput(f"give --device or --device-map, not both (got --device {device}); the map names the devices")
    return "full", {**{k: v for k, v in options.items() if k != "max_memory"}, **PLACEMENT}


__all__ = ["DeviceOpt", "PLACEMENT", "placed", "resolve_device", "take_placement"]
