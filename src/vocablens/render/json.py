"""The one JSON conversion: any result dict -> plain JSON data (and text), for ``--json`` and the
explorer's API alike. NaN and infinities become null; tensors, numpy scalars and tuples become lists
and numbers; keys become strings."""

from __future__ import annotations

import json
import math
from typing import Any


def json_ready(o: Any) -> Any:
    """A copy of ``o`` that :func:`json.dumps` writes as strict JSON (NaN/inf -> None, tensors -> lists)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): json_ready(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_ready(v) for v in o]
    try:
        import torch

        if isinstance(o, torch.Tensor):
            return json_ready(o.tolist())
    except ImportError:  # pragma: no cover
        pass
    if hasattr(o, "item") and callable(o.item):
        return json_ready(o.item())
    return o


def dumps(obj: Any) -> str:
    """``obj`` as indented strict JSON text (UTF-8 characters kept), one trailing newline."""
    return json.dumps(json_ready(obj), indent=2, ensure_ascii=False) + "\n"
