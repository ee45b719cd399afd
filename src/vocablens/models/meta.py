"""A causal LM built from its config on the meta device: shapes and sharing, no storage."""

from __future__ import annotations

import torch
from torch import nn


def meta_model(config) -> nn.Module:
    """Build a causal LM from its config on the meta device: shapes and sharing, no storage.

    Uses ``with torch.device("meta")`` (which keeps tied heads tied), not accelerate's
    ``init_empty_weights`` (which, in transformers 5.x, leaves them untied).

    Raises:
        UnsupportedArchitecture: transformers has no causal-LM class for ``config.model_type``.
    """
    from transformers import AutoModelForCausalLM

    from vocablens.errors import UnsupportedArchitecture

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:
        raise UnsupportedArchitecture(str(getattr(config, "model_type", "?")), "none",
                                      str(exc).splitlines()[0] if str(exc) else "no causal LM class") from None


__all__ = ["meta_model"]
