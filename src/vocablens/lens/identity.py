"""What a lens file says it was fitted for, checked against the loaded model, and the line saying so.

A lens belongs to one model: its translators are meaningless on another one of the same shape. The
files record that model in different ways, and each record present is checked:

- ours (:mod:`vocablens.lens.tuned`, :mod:`vocablens.lens.jacobian`): ``unembed_sha256``, a SHA-256 of
  the bfloat16-rounded decoding path (:meth:`~vocablens.models.unembed.Unembedding.identity_hash`);
- tuned-lens's ``config.json`` (``TunedLensConfig`` in AlignmentResearch/tuned-lens,
  ``tuned_lens/nn/lenses.py``): ``base_model_name_or_path``, ``base_model_revision`` and
  ``unembed_hash``, a SHA-256 of ``numpy.array_str(W_U, precision=1)`` (``tuned_lens/utils.py``
  ``tensor_hash``: the printed corners of the [V, d] head at one decimal, so float32 and float16 loads
  agree; :func:`tuned_lens_unembed_hash`). tuned-lens itself only warns on a different hash; we refuse;
- the Jacobian lens's ``lens.pt``: the reference (``anthropics/jacobian-lens``, the files published as
  ``neuronpedia/jacobian-lens``) records no model at all; TransformerLens 4 adds ``metadata``
  ``model_name`` (the Hugging Face id it booted) and ``model_revision`` (the hub commit), which its
  ``validate_model`` compares for equality.

Shapes (d_model, layer count) are always checked by the lens classes. A record that disagrees with
the model is refused in one line naming both sides (:class:`~vocablens.errors.CheckpointMismatch`); a
file that names no model is accepted on its shapes and says ``unverified: the file names no model``.

The model's side: its Hugging Face id or directory (``config._name_or_path``, set by transformers on
load; for a GGUF file, vocablens's cache directory named after the file) and, for a hub load, the
commit of the snapshot read (``config._commit_hash``). Names compare as hub ids (``OWNER/NAME``,
case-insensitive) when both are, else by their last path component with a GGUF quantization tail
(``.Q4_1``, ``-f16`` ...) left out, so ``gpt2`` matches ``openai-community/gpt2`` and the default
GGUF model matches ``HuggingFaceTB/SmolLM2-135M-Instruct``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from vocablens.errors import CheckpointMismatch
from vocablens.models import Borders

NO_MODEL = "unverified: the file names no model"
_SNAPSHOT = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/([0-9a-f]{40})/?$")
_QUANT_TAIL = re.compile(r"([.-](i?q\d\w*|f16|bf16|f32|gguf))+(-[0-9a-f]{8,})?$")


def tuned_lens_unembed_hash(borders: Borders) -> str | None:
    """tuned-lens's ``unembed_hash`` of this model's head: SHA-256 (hex) of ``numpy.array_str(W_U,
    precision=1)`` with numpy's default print options (threshold 1000, 3 edge items, width 75), W_U
    [V, d] as the model holds it (``Unembed.unembedding_hash``). None for a bfloat16 (or other
    non-numpy) head: tuned-lens cannot hash one either, so no published file records it."""
    import numpy as np

    W = borders.unembedding.weight.detach()
    if W.dtype not in (torch.float32, torch.float16, torch.float64):
        return None
    host = W.cpu().numpy()  # cpu: numpy prints it (tuned-lens's own hash), once when a published lens loads
    text = np.array2string(host, max_line_width=75, precision=1, suppress_small=False, separator=" ",
                           prefix="", threshold=1000, edgeitems=3, floatmode="maxprec", sign="-", legacy=False)
    return hashlib.sha256(text.encode()).hexdigest()


def model_names(borders: Borders) -> tuple[list[str], str | None]:
    """``(names, revision)`` of the loaded model: its id or directory as transformers recorded it
    (``config._name_or_path``; a hub-cache snapshot folder read as its hub id and commit) and the hub
    commit it was read at (``config._commit_hash``, None for a local directory or file)."""
    cfg = getattr(borders.model, "config", None) or borders.config  # a composite model: its own config
    names = {str(x) for x in (getattr(cfg, "_name_or_path", None), getattr(cfg, "name_or_path", None)) if x}
    rev = getattr(cfg, "_commit_hash", None)
    for n in list(names):  # a snapshot folder of the hub cache (a partial load reads one): its id and commit
        hit = _SNAPSHOT.search(n.replace("\\", "/"))
        if hit:
            names.discard(n)
            names.add(f"{hit.group(1)}/{hit.group(2)}")
            rev = rev or hit.group(3)
    return sorted(names), (str(rev) if rev else None)


def _hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not Path(name).exists()


def _short(name: str) -> str:
    return _QUANT_TAIL.sub("", Path(name.rstrip("/")).name.lower())


def same_model(a: str, b: str) -> bool:
    """Whether names ``a`` and ``b`` name one model (module docstring: hub ids exactly, else the last
    path component without a quantization tail)."""
    if _hub_id(a) and _hub_id(b):
        return a.lower() == b.lower()
    return bool(_short(a)) and _short(a) == _short(b)


def shown_name(name: str) -> str:
    """A model name as a message shows it: a hub id as it is, a local path by its last component only
    (outputs never print a path the user did not give)."""
    return name if _hub_id(name) or "/" not in name else Path(name.rstrip("/")).name


def _side(name: str | None, rev: str | None) -> str:
    return (shown_name(name) if name else "an unnamed model") + (f" (revision {rev[:12]})" if rev else "")


def verify_identity(borders: Borders, what: str, name: str | None = None, revision: str | None = None,
                    unembed_sha256: str | None = None, tuned_lens_hash: str | None = None) -> str:
    """Check every identity a lens file records against ``borders``' model; return the verdict line.

    Args:
        what: the lens as a message names it (``"tuned lens"``, ``"Jacobian lens"``).
        name, revision: the model (hub id or path) and hub revision the file says it was fitted for.
        unembed_sha256: ours (:meth:`~vocablens.models.unembed.Unembedding.identity_hash`).
        tuned_lens_hash: tuned-lens's ``unembed_hash`` (:func:`tuned_lens_unembed_hash`).

    Returns:
        ``"verified: ..."`` naming what matched, or ``"unverified: ..."`` saying why nothing could be
        compared (:data:`NO_MODEL` when the file records no model).

    Raises:
        CheckpointMismatch: a recorded name, revision or hash differs from the model's, in one line
            naming both sides.
    """
    names, rev = model_names(borders)
    ours = names[0] if names else None
    fitted = f"this {what} was fitted for {_side(name, revision)}"
    model = f"the model {shown_name(ours)}" if ours else "the model"
    if unembed_sha256:  # ours: the whole decoding path, decisive (a name may differ between load routes)
        have = borders.unembedding.identity_hash()
        if have != unembed_sha256:
            raise CheckpointMismatch(f"{fitted} (unembedding hash {unembed_sha256[:12]}); {model} is another "
                                     f"model (hash {have[:12]})")
        return "verified: unembedding hash"
    matched: list[str] = []
    if name and names:
        if not any(same_model(name, n) for n in names):
            raise CheckpointMismatch(f"{fitted} but the model is {_side(ours, rev)}")
        matched.append("model name")
    if revision and rev:
        if not (rev.startswith(revision) or revision.startswith(rev)):
            raise CheckpointMismatch(f"{fitted} but the model is {_side(ours, rev)}")
        matched.append("revision")
    unchecked = ""
    if tuned_lens_hash:
        have = tuned_lens_unembed_hash(borders)
        if have is None:
            unchecked = f"; tuned-lens unembedding hash not checked ({str(borders.unembedding.weight.dtype).replace('torch.', '')} head)"
        elif have != tuned_lens_hash:
            raise CheckpointMismatch(f"{fitted} (tuned-lens unembedding hash {tuned_lens_hash[:12]}); {model} is "
                                     f"another model (hash {have[:12]})")
        else:
            matched.append("tuned-lens unembedding hash")
    if revision and not rev:
        unchecked += f"; revision {revision[:12]} not checked (the model was not read from the hub)"
    if matched:
        return "verified: " + ", ".join(matched) + unchecked
    if not (name or revision or tuned_lens_hash):
        return NO_MODEL
    return f"unverified: the model records no name to compare with {shown_name(name or '?')}" + unchecked


def provenance(info: dict) -> str:
    """One line of a lens's provenance (its ``info()``): fitted for, corpus, prompts/tokens, dtype,
    format, verdict. Keys absent or empty are left out."""
    bits = [f"for {shown_name(info['name'])}" if info.get("name") else "",
            f"revision {str(info['revision'])[:12]}" if info.get("revision") else "",
            f"corpus {info['corpus']}" if info.get("corpus") else "",
            f"{info['n_prompts']} prompts" if info.get("n_prompts") else "",
            f"{info['tokens']} tokens" if info.get("tokens") not in (None, "", "?", 0) else "",
            f"stored {info['dtype']}" if info.get("dtype") else "",
            f"format {info['format']}" if info.get("format") else "",
            str(info.get("verified") or "")]
    return ", ".join(b for b in bits if b)


__all__ = ["NO_MODEL", "model_names", "provenance", "same_model", "shown_name", "tuned_lens_unembed_hash",
           "verify_identity"]
