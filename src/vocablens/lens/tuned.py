"""The tuned lens: one affine translator per layer, trained to match the model's final distribution.

Belrose et al. (2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens", §3):
the logit lens (nostalgebraist 2020) decodes the residual stream ``h_l`` of layer ``l`` with the
model's own final norm and LM head, which assumes every layer already writes in the last layer's
basis. The tuned lens instead decodes ``h_l + A_l h_l + b_l`` (residual form, as in the reference
implementation, so weight decay pulls towards the identity), with ``A_l`` [d, d] and ``b_l`` [d]
trained on a frozen model to minimise KL(final ‖ lens) at every position. Layer L (the model's output)
is never translated. ``A`` and ``b`` start at zero, so an untrained tuned lens *is* the logit lens.

This module holds the lens and its files (and how a command finds one); training is in
:mod:`vocablens.lens.train` (least-squares start: :mod:`vocablens.lens.regression`), evaluation in
:mod:`vocablens.lens.evaluate`.

Training (:func:`vocablens.lens.train.train`), defaults as in the paper and the reference (AlignmentResearch/tuned-lens,
``scripts/ingredients.py``): SGD with Nesterov momentum 0.9, learning-rate scale 1 (the torch learning
rate is ``lr · (1 - momentum)``, as the reference does to undo momentum's 1/(1-β) gain), linear
decay to 0 without warmup, weight decay 1e-3, gradient-norm clip 1, token-packed chunks with EOS
between documents, loss = sum over layers of the mean KL per token. Where ours differ, and why:

- tokens per step: the paper uses 2^18 tokens per step for 250 steps (65 M tokens, GPUs). On a CPU
  we default to 2^12 tokens per step; the step count is yours (``steps``). With far fewer tokens the
  lens still beats the logit lens at every layer (see ``vocablens lens eval``).
- chunk length: 512 tokens by default (the reference uses 2048), so a forward fits small machines.
- the LM-head GEMMs of *training* may run with bfloat16 inputs (``gemm_dtype="bfloat16"``; float32
  by default): faster on CPUs with native bf16 (AVX512-BF16, docs/performance-ops.md); softmax, log-sum-exp, KL and the
  translators stay float32, and evaluation is always float32. The shipped lens was trained that way.
- an optional least-squares start (``--init regression``, :func:`regression_init`; off by default, so
  the default start is the paper's zero init = the logit lens) for runs with very few tokens.
- the gradient of the loss with respect to the lens logits is written analytically
  (``softmax(lens) - p_final``, or ``softmax(lens) - onehot(next)`` for cross-entropy), token-chunked,
  with all layers of a chunk stacked into one GEMM, so the [T, V] distributions of all L layers never
  exist at once and autograd only sees the cheap part (translators and final norm).

Files (:meth:`TunedLens.save`): ``lens.safetensors`` (``weight`` [L, d, d], ``bias`` [L, d]) plus
``config.json`` (model identity incl. a SHA-256 of the bfloat16-rounded unembedding and final norm,
d_model, n_layers, training settings, vocablens version), written atomically. Loading onto another
model raises :class:`~vocablens.errors.CheckpointMismatch`. A lens saved by the tuned-lens library
(``params.pt`` + ``config.json``) is read with ``torch.load(weights_only=True)``
(:func:`load_tuned_lens_library`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile, OutputExists, ShapeMismatch
from vocablens.lens.hub import with_origin
from vocablens.lens.lens_files import (  # noqa: F401  (re-exported)
    META_KEY, check_lens_tensor, read_json, read_pair, read_safetensors, save_files)
from vocablens.models import Borders
from vocablens.models.files.spec import DEFAULT_MODEL

LENS_FILE = "lens.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "vocablens-tuned-lens"
FORMAT_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "lenses"


# ---------------------------------------------------------------------------------------- identity
def model_identity(borders: Borders, name: str | None = None) -> dict[str, Any]:
    """What a lens must match: family, shapes, and the unembedding's identity hash.

    ``unembed_sha256`` is :meth:`~vocablens.models.unembed.Unembedding.identity_hash`: a SHA-256 of
    W_U (and b_U), the final norm's parameters and project_out, each rounded to bfloat16 first, so
    float32 and bfloat16 loads of the same checkpoint agree.

    Returns:
        ``{"family", "name", "d_model", "n_layers", "vocab_size", "unembed_sha256"}``.
    """
    return {
        "family": borders.family,
        "name": name,
        "d_model": borders.d_model,
        "n_layers": borders.n_layers,
        "vocab_size": borders.vocab_size,
        "unembed_sha256": borders.unembedding.identity_hash(),
    }


# ---------------------------------------------------------------------------------------- the lens
class TunedLens(nn.Module):
    """Affine translators for layers 0..L-1: ``translate(l, h) = h + h A_lᵀ + b_l`` (float32).

    Attributes:
        weight: [L, d, d] float32 parameter (``A_l``, applied as ``h @ A_l.T`` like ``nn.Linear``).
        bias: [L, d] float32 parameter.
        identity: :func:`model_identity` of the model the lens belongs to (may be empty).
        settings: training settings and provenance (free-form, saved in the config).
    """

    def __init__(self, d_model: int, n_layers: int, identity: dict | None = None,
                 settings: dict | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if d_model < 1 or n_layers < 1:
            raise BadInput(f"a tuned lens needs d_model >= 1 and n_layers >= 1; got {d_model}, {n_layers}")
        self.d_model = int(d_model)
        self.n_layers = int(n_layers)
        self.weight = nn.Parameter(torch.zeros(n_layers, d_model, d_model, device=device))
        self.bias = nn.Parameter(torch.zeros(n_layers, d_model, device=device))
        self.identity: dict = dict(identity or {})
        self.settings: dict = dict(settings or {})

    @classmethod
    def for_model(cls, borders: Borders, name: str | None = None, settings: dict | None = None) -> "TunedLens":
        """A zero (untrained, = logit lens) tuned lens shaped for ``borders``' model."""
        return cls(borders.d_model, borders.n_layers, model_identity(borders, name), settings, device=borders.read_device)

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """[..., d] residual stream at ``layer`` (0..L-1) -> translated [..., d] float32.

        Raises:
            BadInput: layer outside 0..L-1.
            ShapeMismatch: last dimension is not d_model.
        """
        if not 0 <= layer < self.n_layers:
            raise BadInput(f"the tuned lens has translators for layers 0..{self.n_layers - 1}; got {layer}")
        if h.shape[-1] != self.d_model:
            raise ShapeMismatch(f"residual stream has width {h.shape[-1]}, the lens expects {self.d_model}")
        h = h.to(self.weight.device, torch.float32)  # a placed model: the layer is read where the lens is
        return h + torch.nn.functional.linear(h, self.weight[layer], self.bias[layer])

    def translate_all(self, H: torch.Tensor) -> torch.Tensor:
        """[L, N, d] residual streams of layers 0..L-1 -> translated [L, N, d] float32 (one batched GEMM)."""
        H = H.to(self.weight.device, torch.float32)
        return torch.baddbmm(self.bias[:, None, :], H, self.weight.transpose(1, 2)) + H

    def check_model(self, borders: Borders) -> None:
        """Raise :class:`CheckpointMismatch` unless this lens was made for ``borders``' model: shapes,
        then every identity the file records (:func:`vocablens.lens.identity.verify_identity`; ours: the
        unembedding hash; tuned-lens's: model name, revision, its unembedding hash). Sets :attr:`verified`."""
        from vocablens.lens.identity import verify_identity

        if borders.d_model != self.d_model or borders.n_layers != self.n_layers:
            raise CheckpointMismatch(
                f"this tuned lens is for a model with d_model={self.d_model}, {self.n_layers} layers"
                f"{' (' + str(self.identity.get('name')) + ')' if self.identity.get('name') else ''}; "
                f"the model has d_model={borders.d_model}, {borders.n_layers} layers")
        idt, published = self.identity, self.settings.get("source") == "tuned-lens library"
        self.verified = verify_identity(borders, "tuned lens", name=idt.get("name") if published else None,
                                        revision=idt.get("revision"), unembed_sha256=idt.get("unembed_sha256"),
                                        tuned_lens_hash=idt.get("tuned_lens_unembed_hash"))

    def info(self) -> dict:
        """Provenance for captions and JSON: ``{"name", "tokens", "revision", "corpus", "dtype", "format",
        "verified"}`` (the model the lens is for, its training tokens and corpus, stored dtype, file format,
        :func:`~vocablens.lens.identity.verify_identity`'s verdict once checked against a model; ``hub``:
        where a lens fetched from the hub came from, :func:`~vocablens.lens.hub.hub_origin`; ``quality``:
        per-layer KL and top-1 on held-out text, :mod:`vocablens.lens.quality`)."""
        s = self.settings
        data = s.get("data") or {}
        return {"name": self.identity.get("name"), "tokens": s.get("tokens", data.get("tokens", "?")),
                "revision": self.identity.get("revision"), "corpus": data.get("corpus", s.get("corpus")),
                "dtype": s.get("stored_dtype"), "format": "tuned-lens" if s.get("source") == "tuned-lens library"
                else "vocablens", "verified": getattr(self, "verified", None), "hub": s.get("hub"),
                "quality": s.get("quality")}

    # ------------------------------------------------------------------ files
    def config_dict(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        try:
            __version__ = version("vocablens")  # not the package root: nothing below cli imports it
        except PackageNotFoundError:
            __version__ = "unknown"
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "d_model": self.d_model,
                "n_layers": self.n_layers, "model": self.identity, "training": self.settings,
                "vocablens_version": __version__}

    def save(self, path: str | Path, dtype: torch.dtype = torch.float32, force: bool = False) -> Path:
        """Write ``lens.safetensors`` + ``config.json`` into directory ``path`` atomically.

        Args:
            dtype: storage dtype (float32, or bfloat16 to halve the size).
            force: replace an existing lens there.

        Raises:
            OutputExists: ``path`` already holds a lens and ``force`` is False.
        """
        path = Path(path)
        if (path / LENS_FILE).exists() and not force:
            raise OutputExists(f"{path} already holds a tuned lens; pass `force` to replace it")
        tensors = {"weight": self.weight.detach().to(dtype).contiguous(),
                   "bias": self.bias.detach().to(dtype).contiguous()}
        save_files(path, tensors, self.config_dict(), LENS_FILE, CONFIG_FILE)
        return path

    @classmethod
    @with_origin
    def load(cls, path: str | Path, borders: Borders | None = None) -> "TunedLens":
        """Read a lens directory (ours, or the tuned-lens library's ``params.pt`` layout).

        Args:
            path: a directory holding ``lens.safetensors`` + ``config.json`` (or ``params.pt`` +
                ``config.json``), or the name of a model a lens is shipped for (``"smollm2"``).
            borders: when given, the lens is checked against this model and moved to its device.

        Raises:
            BadInput: nothing readable at ``path``.
            CorruptModelFile: a truncated or malformed file; a tensor not floating point.
            NonFiniteWeights: a NaN or inf in the file (the message names the tensor and the layer).
            CheckpointMismatch: the lens belongs to another model.
        """
        path = Path(path)
        if not path.exists() and shipped_lens_path(str(path)) is not None:  # a model's name: its shipped lens
            path = shipped_lens_path(str(path))
        if path.is_file():
            path = path.parent
        if not (path / LENS_FILE).exists() and (path / "params.pt").exists():
            return load_tuned_lens_library(path, borders)
        if not (path / LENS_FILE).exists():
            raise BadInput(f"no tuned lens at {path} (expected {LENS_FILE} and {CONFIG_FILE})")
        tensors, cfg = read_pair(path, LENS_FILE, CONFIG_FILE)
        if cfg.get("format") != FORMAT:
            raise CorruptModelFile(f"{path / CONFIG_FILE} is not a vocablens tuned-lens config")
        W, b = tensors.get("weight"), tensors.get("bias")
        try:
            L, d = int(cfg["n_layers"]), int(cfg["d_model"])
        except (KeyError, TypeError, ValueError):
            raise CorruptModelFile(f"{path / CONFIG_FILE} lacks n_layers / d_model; train the lens again") from None
        if W is None or b is None or tuple(W.shape) != (L, d, d) or tuple(b.shape) != (L, d):
            raise CorruptModelFile(f"{path / LENS_FILE} does not hold weight [{L}, {d}, {d}] and bias [{L}, {d}]")
        for name, t in (("weight", W), ("bias", b)):
            check_lens_tensor(path / LENS_FILE, name, t, [f"layer {i}" for i in range(L)])
        lens = cls(d, L, cfg.get("model") or {}, {**(cfg.get("training") or {}),
                                                   "stored_dtype": str(W.dtype).replace("torch.", "")})
        with torch.no_grad():
            lens.weight.copy_(W.float())
            lens.bias.copy_(b.float())
        if borders is not None:
            lens.check_model(borders)
            lens.to(borders.read_device)
        return lens


def load_tuned_lens_library(path: str | Path, borders: Borders | None = None) -> TunedLens:
    """Read a lens saved by the tuned-lens library (AlignmentResearch/tuned-lens,
    ``tuned_lens/nn/lenses.py`` ``TunedLens.save``): ``params.pt`` (``torch.save`` of its
    ``layer_translators`` state dict: ``{i}.weight`` [d, d], ``{i}.bias`` [d], i = 0..L-1) +
    ``config.json`` (``TunedLensConfig``: ``base_model_name_or_path``, ``d_model``,
    ``num_hidden_layers``, ``bias``, ``base_model_revision``, ``unembed_hash``, ``lens_type``). The
    layouts correspond: both compute ``h + A h + b`` on the residual stream of layer i (the input of
    block i for i = 0). The model name, revision and unembedding hash are checked against ``borders``
    (:func:`vocablens.lens.identity.verify_identity`).

    ``params.pt`` is read with ``torch.load(weights_only=True)`` (no unpickling of code).

    Raises:
        CorruptModelFile: unreadable file, missing keys, shapes that do not match the config, a tensor
            not floating point. NonFiniteWeights: a NaN or inf (naming the tensor and the layer).
        CheckpointMismatch: ``borders`` given and its shapes, name, revision or head differ.
    """
    path = Path(path)
    cfg = read_json(path / CONFIG_FILE)
    try:
        d, L = int(cfg["d_model"]), int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        raise CorruptModelFile(f"{path / CONFIG_FILE} lacks d_model / num_hidden_layers") from None
    try:
        state = torch.load(path / "params.pt", map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptModelFile(f"cannot read {path / 'params.pt'}: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(state, dict):
        raise CorruptModelFile(f"{path / 'params.pt'} does not hold a state dict")
    first = state.get("0.weight")
    lens = TunedLens(d, L, {"name": cfg.get("base_model_name_or_path") or None,
                            "revision": cfg.get("base_model_revision") or None,
                            "tuned_lens_unembed_hash": cfg.get("unembed_hash") or None},
                     {"source": "tuned-lens library", "lens_type": cfg.get("lens_type"),
                      "stored_dtype": str(first.dtype).replace("torch.", "") if torch.is_tensor(first) else None})
    with torch.no_grad():
        for i in range(L):
            w = state.get(f"{i}.weight")
            if w is None or tuple(w.shape) != (d, d):
                raise CorruptModelFile(f"{path / 'params.pt'}: translator {i} weight missing or not [{d}, {d}]")
            lens.weight[i].copy_(check_lens_tensor(path / "params.pt", f"{i}.weight (layer {i})", w).float())
            bvec = state.get(f"{i}.bias")
            if bvec is not None:
                if tuple(bvec.shape) != (d,):
                    raise CorruptModelFile(f"{path / 'params.pt'}: translator {i} bias is not [{d}]")
                lens.bias[i].copy_(check_lens_tensor(path / "params.pt", f"{i}.bias (layer {i})", bvec).float())
    if borders is not None:
        lens.check_model(borders)
        lens.to(borders.read_device)
    return lens


# ---------------------------------------------------------------------------------------- finding a lens
def shipped_lens_path(model_name: str = DEFAULT_MODEL) -> Path | None:
    """Directory of the lens shipped in the package for ``model_name``, or None."""
    p = SHIPPED_DIR / str(model_name)
    return p if (p / LENS_FILE).exists() else None


def find_lens(model_spec: str = DEFAULT_MODEL, path: str | Path | None = None) -> Path:
    """THE way a command finds its tuned lens: the directory ``path`` (``--lens DIR``; ours or
    tuned-lens's ``params.pt`` layout; or a hub id ``OWNER/REPO/PATH`` found in the local cache,
    :func:`vocablens.lens.published.resolve_lens_source`) when given, else the lens shipped for ``model_spec``.

    Raises:
        BadInput: ``path`` holds no lens, or no path and no lens shipped for that model.
    """
    if path:
        p = Path(path).expanduser()
        if not p.exists() and (looks_like_hub_id(str(path)) or str(path) in ("published", "tuned:published",
                                                                             "jacobian:published")):
            from vocablens.lens.published import resolve_lens_source  # a published lens: the hub or its cache

            p = resolve_lens_source(str(path), "tuned", str(model_spec))
        if p.is_file():
            p = p.parent
        if not ((p / LENS_FILE).exists() or (p / "params.pt").exists()):
            raise BadInput(f"no tuned lens in {path} (expected {LENS_FILE} and {CONFIG_FILE}); "
                           "`path` takes a lens directory")
        return p
    shipped = shipped_lens_path(str(model_spec))
    if shipped is None:
        raise BadInput(f"no tuned lens shipped for {model_spec!r}; give `path` DIR "
                       "(train one with `vocablens lens train`)")
    return shipped


def looks_like_hub_id(spec: str) -> bool:
    """``OWNER/REPO[/PATH]`` that is not a local path (no leading ``/``, ``.`` or ``~``)."""
    return len([x for x in spec.split("/") if x]) >= 2 and not spec.startswith(("/", ".", "~"))


def load_for_model(borders: Borders, model_spec: str = DEFAULT_MODEL, path: str | Path | None = None) -> TunedLens:
    """The lens :func:`find_lens` finds, loaded and checked against ``borders``.

    Raises:
        BadInput: no lens there / none shipped.
        CheckpointMismatch: the lens belongs to another model.
    """
    return TunedLens.load(find_lens(model_spec, path), borders)


__all__ = [
    "CONFIG_FILE", "LENS_FILE", "TunedLens", "find_lens", "load_for_model", "load_tuned_lens_library", "looks_like_hub_id",
    "model_identity", "read_json", "read_pair", "read_safetensors", "save_files", "shipped_lens_path",
]
