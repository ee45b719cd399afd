"""The final norm of a model read without its modeling code: the checkpoint's tensors, computed by
the family's own transformers module.

The two-matrix reads (:mod:`vocablens.models.files.matrices_only`) read the final norm's tensors by name (a
module named like a final norm, outside every block: :func:`final_norm_keys`) but build no model,
because importing a family's modeling code costs resident memory and seconds (docs/performance.md). What the norm
computes is never re-implemented here: :class:`FamilyNorm` hands its input to the module of the
family's own class (``LlamaRMSNorm``, Gemma's ``(1 + w)`` RMSNorm, ``nn.LayerNorm`` with or without
bias ...), taken from a meta-device skeleton of the model (the family adapter,
:meth:`vocablens.models.Borders.from_model`, finds it there) the first time the norm is called, with
the checkpoint's tensors put in its place. A caller that never calls the norm (``argmax --no-norm``,
the scan before its norm bounds) never pays for the modeling code, and a caller that keeps what the
family's module computed from an earlier run can key it by :attr:`FamilyNorm.family` (the argmax
norm bounds do: :mod:`vocablens.argmax.stored`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from vocablens.errors import CorruptModelFile
from vocablens.models.borders import FINAL_NORM_NAMES, Borders


def final_norm_keys(keys) -> dict[str, str] | None:
    """``{parameter name: checkpoint key}`` of the final norm among checkpoint ``keys``: the one module
    named as in :data:`FINAL_NORM_NAMES` whose path holds no block index (``model.norm.weight``,
    ``transformer.ln_f.weight`` + ``.bias``); None when there is not exactly one such module."""
    groups: dict[str, dict[str, str]] = {}
    for k in keys:
        parts = k.split(".")
        if len(parts) >= 2 and parts[-2] in FINAL_NORM_NAMES and not any(p.isdigit() for p in parts):
            groups.setdefault(".".join(parts[:-1]), {})[parts[-1]] = k
    return next(iter(groups.values())) if len(groups) == 1 else None


def skeleton_final_norm(d: Path, trust_remote_code: bool = False) -> nn.Module | None:
    """The final-norm module of the model in directory ``d``, of the family's own class, from a
    meta-device skeleton (``AutoModelForCausalLM.from_config`` under ``init_empty_weights``: no
    storage); None when the family has none."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    from vocablens.models.files.auto_class import auto_model_class

    config = AutoConfig.from_pretrained(str(d), trust_remote_code=trust_remote_code)
    with init_empty_weights():
        model = auto_model_class(config).from_config(config, trust_remote_code=trust_remote_code)
    return Borders.from_model(model).final_norm


def family_identity(d: Path) -> str | None:
    """What decides the family's final-norm module of the model in directory ``d``, as a SHA-256
    (hex) of the bytes of ``d/config.json`` (the family, its sizes and epsilon) and the transformers
    version (the family's code); None when the config cannot be read or names remote code
    (``auto_map``: its code is not transformers')."""
    import transformers

    try:
        raw = (Path(d) / "config.json").read_bytes()
    except OSError:
        return None
    if b'"auto_map"' in raw:
        return None
    return hashlib.sha256(b"%s\0%s" % (transformers.__version__.encode(), raw)).hexdigest()


class FamilyNorm(nn.Module):
    """The checkpoint's final-norm tensors (``weight`` [d], ``bias`` [d] when stored), computed by the
    family's own module. Shape [..., d] -> [..., d], in the module's dtype rules (transformers').

    Args:
        params: parameter name -> tensor, as the checkpoint stores them.
        build: returns the family's final-norm module (parameters on ``meta``), called once, at the
            first forward (:func:`skeleton_final_norm`).
        family: what decides that module (:func:`family_identity`), or None: with the parameters'
            bytes, a key under which a caller may keep what the module computes across runs.

    Raises (at the first forward):
        CorruptModelFile: the family's module has other parameters than the checkpoint's, or a
            buffer the checkpoint does not store.
    """

    def __init__(self, params: dict[str, torch.Tensor], build: Callable[[], nn.Module | None],
                 family: str | None = None):
        super().__init__()
        for n, t in params.items():
            self.register_parameter(n, nn.Parameter(t, requires_grad=False))
        self.__dict__["_build"] = build
        self.__dict__["_family"] = None        # not a submodule: the parameters are listed once, here
        self.family = family

    @property
    def built(self) -> bool:
        """Whether the family's module (and so its modeling code) has been built in this process."""
        return self.__dict__["_family"] is not None

    def family_module(self) -> nn.Module:
        """The family's own module holding this norm's tensors (built on the first call)."""
        m = self.__dict__["_family"]
        if m is None:
            m = self.__dict__["_build"]()
            names = set() if m is None else {n for n, _ in m.named_parameters()}
            if m is None or names != set(self._parameters):
                raise CorruptModelFile(f"the checkpoint's final norm holds {sorted(self._parameters)}, the family's "
                                       f"final norm {sorted(names) if m is not None else 'nothing'}; load the borders "
                                       "or the whole model instead")
            lost = [n for n, b in m.named_buffers() if b.is_meta]
            if lost:
                raise CorruptModelFile(f"the final norm's buffer {lost[0]} is not in the checkpoint")
            self.__dict__["_family"] = m = m.eval()
        for n, p in self._parameters.items():  # this module's tensors, also after a move to another device
            m._parameters[n] = p
        return m

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.family_module()(hidden_states)

    def extra_repr(self) -> str:
        m = self.__dict__["_family"]
        return "family module built at first use" if m is None else type(m).__name__


__all__ = ["FamilyNorm", "family_identity", "final_norm_keys", "skeleton_final_norm"]
