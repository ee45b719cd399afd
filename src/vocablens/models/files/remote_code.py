"""A model's own Python code (``auto_map`` in its config) runs only when the user asks for it.

transformers imports a checkpoint's ``configuration_*.py`` / ``modeling_*.py`` when its
``config.json`` names a ``model_type`` it does not know and an ``auto_map`` to local code; when a
call leaves ``trust_remote_code`` unset it asks "Do you wish to run the custom code? [y/N]" on the
terminal (and ``echo y |`` answers it). vocablens passes ``trust_remote_code=False`` to every
transformers call unless ``--trust-remote-code`` is given, and refuses such a directory in one line
before transformers reads it (:func:`refuse_remote_code`, through
:func:`vocablens.models.files.spec.check_remote_code` for what the user named); :data:`REMOTE_CODE_HINT` recognises the
error transformers raises for a hub id whose code was refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from vocablens.errors import BadInput

#: what transformers' error says when ``trust_remote_code=False`` meets a repository that needs its code
REMOTE_CODE_HINT = "contains custom code which must be executed"


def _module_file(ref) -> str | None:
    """``"configuration_x.XConfig"`` or ``"repo--configuration_x.XConfig"`` -> ``"configuration_x.py"``."""
    if isinstance(ref, (list, tuple)):
        ref = next((r for r in ref if isinstance(r, str)), None)
    if not isinstance(ref, str) or "." not in ref:
        return None
    return ref.split("--")[-1].rsplit(".", 1)[0] + ".py"


def needs_remote_code(path: Path) -> str | None:
    """The code file a model directory would make transformers import, or None.

    A directory needs its own code when ``config.json`` names a ``model_type`` transformers does not
    know and an ``auto_map`` (a known ``model_type`` with an ``auto_map`` loads with the built-in
    class when ``trust_remote_code`` is off). Reads ``config.json`` only; imports nothing from it.

    Returns:
        the file named by ``auto_map`` (``AutoConfig`` first, else ``AutoModelForCausalLM``, else
        the first entry), e.g. ``"configuration_vlcustom.py"``; None for a directory without one.
    """
    try:
        data = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    amap = data.get("auto_map")
    if not isinstance(amap, dict) or not amap:
        return None
    from transformers import CONFIG_MAPPING

    mt = data.get("model_type")
    if isinstance(mt, str) and mt in CONFIG_MAPPING:
        return None
    for key in ("AutoConfig", "AutoModelForCausalLM"):
        if key in amap:
            return _module_file(amap[key]) or "its own code"
    return _module_file(next(iter(amap.values()))) or "its own code"


def remote_code_message(spec: str, what: str = "its own code") -> str:
    """The one line for a model whose code vocablens will not run without the flag."""
    return (f"{spec} needs its own Python code ({what}, named by auto_map in its config) to load; "
            "vocablens does not run a model's code unless you pass `trust_remote_code`")


def refuse_remote_code(spec, path: Path | None, trust_remote_code: bool) -> None:
    """Refuse a model directory whose config needs its own code, unless ``trust_remote_code``.

    Args:
        spec: what the user named (for the message). path: the resolved model directory, or None
            (a GGUF file, a hub id: nothing to check here; transformers refuses those itself).
        trust_remote_code: the user's ``--trust-remote-code``.

    Raises:
        BadInput: the directory needs its own code and the flag is off (the code is never imported).
    """
    if trust_remote_code or path is None or not Path(path).is_dir():
        return
    f = needs_remote_code(Path(path))
    if f is not None:
        raise BadInput(remote_code_message(str(spec), f))


__all__ = ["REMOTE_CODE_HINT", "needs_remote_code", "refuse_remote_code", "remote_code_message"]
