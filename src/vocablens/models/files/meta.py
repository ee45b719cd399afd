"""A causal LM built from its config on the meta device: shapes and sharing, no storage."""

from __future__ import annotations

import torch
from torch import nn


def meta_model(config, trust_remote_code: bool = False) -> nn.Module:
    """Build a causal LM from its config on the meta device: shapes and sharing, no storage.

    Uses ``with torch.device("meta")`` (which keeps tied heads tied), not accelerate's
    ``init_empty_weights`` (which, in transformers 5.x, leaves them untied). A config whose class
    lives in the model's own code is built only with ``trust_remote_code`` (never a prompt).

    Raises:
        UnsupportedArchitecture: transformers has no causal-LM class for ``config.model_type``.
    """
    from vocablens.errors import UnsupportedArchitecture
    from vocablens.models.files.auto_class import auto_model_class

    try:
        with torch.device("meta"):  # the causal-LM class, else a vision-language model's (models.files.auto_class)
            return auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as exc:
        raise UnsupportedArchitecture(str(getattr(config, "model_type", "?")), "none",
                                      str(exc).splitlines()[0] if str(exc) else "no causal LM class") from None


__all__ = ["meta_model"]
