"""Lens files written as the reference implementations write them (for the published-format tests).

- tuned-lens (AlignmentResearch/tuned-lens, ``tuned_lens/nn/lenses.py``): ``TunedLens.save`` does
  ``th.save(self.layer_translators.state_dict(), path / "params.pt")`` (a ``ModuleList`` of
  ``nn.Linear(d, d, bias=True)``: keys ``{i}.weight`` [d, d], ``{i}.bias`` [d]) and
  ``json.dump(asdict(TunedLensConfig), f)`` into ``config.json``; ``unembed_hash`` is
  ``tuned_lens/utils.py``'s ``tensor_hash(W_U.numpy())`` = SHA-256 of ``np.array_str(W, precision=1)``.
- the Jacobian lens (``anthropics/jacobian-lens``, TransformerLens 4.3 ``JacobianLens.save``):
  ``torch.save({"J": {block: [d, d] float16}, "n_prompts", "source_layers", "d_model"}`` plus, for
  TransformerLens, ``"metadata"`` (``model_name``, ``model_revision``, ``target_layer`` ...).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch


def tensor_hash(weight: torch.Tensor) -> str:
    """tuned-lens's ``unembed_hash`` of a head weight [V, d] (``Unembed.unembedding_hash``)."""
    return hashlib.sha256(str.encode(np.array_str(weight.detach().cpu().numpy(), precision=1))).hexdigest()


def save_tuned_lens(path: Path, d: int, n_layers: int, base_model_name_or_path: str,
                    base_model_revision: str | None = None, unembed_hash: str | None = None,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """Write ``params.pt`` + ``config.json`` as ``tuned_lens.nn.lenses.TunedLens.save`` does; returns
    the state dict (random translators)."""
    torch.manual_seed(seed)
    translators = torch.nn.ModuleList([torch.nn.Linear(d, d, bias=True) for _ in range(n_layers)])
    with torch.no_grad():
        for t in translators:
            t.weight.mul_(0.1)
    path.mkdir(parents=True, exist_ok=True)
    state = translators.state_dict()
    torch.save(state, path / "params.pt")
    config = {"base_model_name_or_path": base_model_name_or_path, "d_model": d, "num_hidden_layers": n_layers,
              "bias": True, "base_model_revision": base_model_revision, "unembed_hash": unembed_hash,
              "lens_type": "linear_tuned_lens"}  # dataclasses.asdict(TunedLensConfig(...)), in field order
    with open(path / "config.json", "w") as f:
        json.dump(config, f)
    return {k: v.clone() for k, v in state.items()}


def save_jacobian_lens(path: Path, J: dict[int, torch.Tensor], n_prompts: int, d_model: int,
                       metadata: dict | None = None) -> None:
    """Write a ``lens.pt`` as the reference (``metadata=None``) or TransformerLens (``metadata``) does."""
    payload = {"J": {int(k): v.to(torch.float16) for k, v in J.items()}, "n_prompts": n_prompts,
               "source_layers": sorted(int(k) for k in J), "d_model": d_model}
    if metadata:
        payload["metadata"] = metadata
    torch.save(payload, path)
