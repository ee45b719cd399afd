"""The Jacobian lens: one average Jacobian per layer carries the residual stream into the last layer's basis.

Gurnee et al. (2026, "Verbalizable Representations Form a Global Workspace in Language Models",
Methods; reference code ``anthropics/jacobian-lens``) read layer l as ``unembed(J_l h_l)``, with

    J_l = E_prompt[ (1/|P|) Σ_{p ∈ P} Σ_{p' ∈ P, p' >= p} ∂h_L[p'] / ∂h_l[p] ]      [d, d]

where P is the set of valid positions of a prompt (the first ``skip_first`` positions, attention
sinks, and the last position are left out). Cross-position terms count: a source position's row is
the sum of its effects on every later valid target position, averaged over source positions, and
prompts weigh equally. The logit lens is the case ``J_l = I``; layer L is never translated, so the
lens at L is the model's own output. Fitting: :mod:`vocablens.lens.jacobian_fit`.

Layer numbering: ours is the stream layer (0 = embedding output, i = output of block i, L = last
block's output before the final norm). The reference (and TransformerLens 4) index block outputs:
their layer l is our stream layer l+1, their target layer n_layers-1 our layer L; they never fit our
layer 0. A lens may hold matrices for a subset of layers (:attr:`JacobianLens.layers`).

Files (:meth:`JacobianLens.save`): ``jacobian.safetensors`` (``J`` [S, d, d], ``layers`` [S] int64)
plus ``jacobian.json`` (format, d_model, n_layers, layers, the model's identity, fitting settings),
written atomically; they may share a directory with a tuned lens. The published format — a dict
saved with ``torch.save``: ``{"J": {layer: [d, d]}, "n_prompts", "source_layers", "d_model"}`` plus an
optional ``metadata`` dict (TransformerLens) — is read with ``torch.load(weights_only=True)``
(:func:`load_published`) and written by :meth:`JacobianLens.save_published`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile, OutputExists, ShapeMismatch
from vocablens.lens.hub import with_origin
from vocablens.lens.published import (  # noqa: F401  (layer_span re-exported)
    IDENTITY_ATOL, identity_gap, layer_span, published_matrix, usable_blocks)
from vocablens.lens.tuned import check_lens_tensor, model_identity, read_pair, save_files
from vocablens.models import Borders
from vocablens.models.files.spec import DEFAULT_MODEL

LENS_FILE = "jacobian.safetensors"
CONFIG_FILE = "jacobian.json"
PUBLISHED_FILE = "lens.pt"
#: ``settings["format"]`` of a lens read from the published format
PUBLISHED_FORMAT = "jacobian-lens"
FORMAT = "vocablens-jacobian-lens"
FORMAT_VERSION = 1


class JacobianLens:
    """Per-layer linear translators ``translate(l, h) = h J_lᵀ`` (float32), for the layers fitted.

    Attributes:
        J: [S, d, d] float32, one matrix per fitted layer (``J[i]`` maps layer ``layers[i]`` to layer L).
        layers: the S fitted stream layers, increasing, each in 0..L-1.
        d_model: d.
        n_layers: L, the model's number of blocks.
        identity: :func:`~vocablens.lens.tuned.model_identity` of the model (may be partial for a
            published lens: it records no unembedding hash).
        settings: fitting settings and provenance (corpus, n_prompts, tokens, dtype, source).
    """

    kind = "jacobian"

    def __init__(self, J: torch.Tensor, layers: list[int], n_layers: int, identity: dict | None = None,
                 settings: dict | None = None) -> None:
        if J.dim() != 3 or J.shape[1] != J.shape[2] or J.shape[0] != len(layers):
            raise ShapeMismatch(f"a Jacobian lens needs J [S, d, d] for S layers; got {tuple(J.shape)} "
                                f"for {len(layers)} layers")
        layers = [int(x) for x in layers]
        if layers != sorted(set(layers)) or (layers and not 0 <= layers[0] <= layers[-1] < n_layers):
            raise BadInput(f"Jacobian-lens layers must be increasing stream layers in 0..{n_layers - 1}; got {layers}")
        self.J = J.detach().float()
        self.layers = layers
        self.d_model = int(J.shape[1])
        self.n_layers = int(n_layers)
        self.identity: dict = dict(identity or {})
        self.settings: dict = dict(settings or {})
        self._index = {ly: i for i, ly in enumerate(layers)}

    # ------------------------------------------------------------------ reading
    def has(self, layer: int) -> bool:
        """Whether a matrix was fitted for stream layer ``layer`` (layer L is always read as it is)."""
        return layer in self._index

    def matrix(self, layer: int) -> torch.Tensor:
        """``J_l`` [d, d] float32 of stream layer ``layer``.

        Raises:
            BadInput: no matrix for that layer.
        """
        if layer not in self._index:
            raise BadInput(f"the Jacobian lens has no matrix for layer {layer} (fitted: {layer_span(self.layers)}); "
                           "read another layer or fit it (`vocablens lens fit-jacobian`)")
        return self.J[self._index[layer]]

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """[..., d] residual stream at ``layer`` (0..L-1) -> ``h J_lᵀ`` [..., d] float32.

        Raises:
            BadInput: no matrix for that layer.
            ShapeMismatch: last dimension is not d_model.
        """
        if h.shape[-1] != self.d_model:
            raise ShapeMismatch(f"residual stream has width {h.shape[-1]}, the lens expects {self.d_model}")
        return h.float() @ self.matrix(layer).to(h.device).T

    def translate_all(self, H: torch.Tensor) -> torch.Tensor:
        """[L, N, d] residual streams of layers 0..L-1 -> translated [L, N, d] float32 (one batched
        GEMM); rows of layers without a matrix are NaN."""
        out = torch.full(H.shape, float("nan"), dtype=torch.float32, device=H.device)
        if self.layers:
            idx = torch.tensor(self.layers, device=H.device)
            out[idx] = torch.bmm(H[idx].float(), self.J.to(H.device).transpose(1, 2))
        return out

    def to(self, device) -> "JacobianLens":
        """Move the matrices to ``device`` (in place); returns self."""
        self.J = self.J.to(device)
        return self

    def check_model(self, borders: Borders) -> None:
        """Raise :class:`CheckpointMismatch` unless this lens fits ``borders``' model: d_model, the
        number of layers, then every identity the file records (:func:`vocablens.lens.identity.
        verify_identity`: the unembedding hash; a published file's model name and revision). Sets
        :attr:`verified`."""
        from vocablens.lens.identity import verify_identity

        name = self.identity.get("name")
        who = f" ({name})" if name else ""
        if borders.d_model != self.d_model or borders.n_layers != self.n_layers:
            raise CheckpointMismatch(
                f"this Jacobian lens is for a model with d_model={self.d_model}, {self.n_layers} layers{who}; "
                f"the model has d_model={borders.d_model}, {borders.n_layers} layers")
        published = self.settings.get("format") == PUBLISHED_FORMAT
        self.verified = verify_identity(borders, "Jacobian lens", name=name if published else None,
                                        revision=self.identity.get("revision"),
                                        unembed_sha256=self.identity.get("unembed_sha256"))

    def info(self) -> dict:
        """Provenance for captions and JSON: ``{"name", "corpus", "n_prompts", "tokens", "dtype", "source",
        "revision", "format", "verified", "hub", "quality"}`` (``hub``: the repository, commit and path
        of a lens fetched from the hub, :func:`~vocablens.lens.hub.hub_origin`; ``quality``: per-layer KL and
        top-1 on held-out text, :mod:`vocablens.lens.quality`; ``format``: ``vocablens`` or ``jacobian-lens`` for a
        published ``lens.pt``; ``verified``: :func:`~vocablens.lens.identity.verify_identity`'s verdict
        once checked against a model)."""
        s = self.settings
        return {"name": self.identity.get("name"), "corpus": (s.get("data") or {}).get("corpus", s.get("corpus")),
                "n_prompts": s.get("n_prompts"), "tokens": s.get("tokens"), "dtype": s.get("stored_dtype"),
                "source": s.get("source", "vocablens"), "revision": self.identity.get("revision"),
                "format": s.get("format", "vocablens"), "verified": getattr(self, "verified", None),
                "hub": s.get("hub"), "quality": s.get("quality")}

    # ------------------------------------------------------------------ our files
    def config_dict(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("vocablens")
        except PackageNotFoundError:
            v = "unknown"
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "d_model": self.d_model,
                "n_layers": self.n_layers, "layers": self.layers, "model": self.identity,
                "fitting": self.settings, "vocablens_version": v}

    def save(self, path: str | Path, dtype: torch.dtype = torch.float16, force: bool = False) -> Path:
        """Write ``jacobian.safetensors`` + ``jacobian.json`` into directory ``path`` atomically.

        Args:
            dtype: storage dtype: float16 (default, as the reference: entries are O(1), and float16's
                10 mantissa bits beat bfloat16's 7), bfloat16 or float32.
            force: replace a Jacobian lens already there.

        Raises:
            OutputExists: ``path`` holds a Jacobian lens and ``force`` is False.
            WriteFailed: the directory cannot be written.
        """
        path = Path(path)
        if (path / LENS_FILE).exists() and not force:
            raise OutputExists(f"{path} already holds a Jacobian lens; pass `force` to replace it")
        self.settings["stored_dtype"] = str(dtype).replace("torch.", "")
        tensors = {"J": self.J.detach().to(dtype).contiguous(),
                   "layers": torch.tensor(self.layers, dtype=torch.int64)}
        save_files(path, tensors, self.config_dict(), LENS_FILE, CONFIG_FILE)
        return path

    @classmethod
    @with_origin
    def load(cls, path: str | Path, borders: Borders | None = None) -> "JacobianLens":
        """Read a Jacobian lens: our directory (``jacobian.safetensors`` + ``jacobian.json``), or a
        published ``lens.pt`` (a file, or a directory holding one; needs ``borders`` for the layer count).

        Raises:
            BadInput: nothing readable at ``path``; a published lens without ``borders``.
            CorruptModelFile: a truncated or malformed file, a J that is not floating point.
            NonFiniteWeights: a NaN or inf in J (the message names the file, the tensor and the layer).
            CheckpointMismatch: the lens does not fit ``borders``' model; a matrix for layer L (the
                target's own, stored by some scripts) that is not the identity.
        """
        path = Path(path).expanduser()
        if path.is_file() and path.suffix == ".pt":
            return load_published(path, borders)
        if path.is_file():
            path = path.parent
        if not (path / LENS_FILE).exists():
            if (path / PUBLISHED_FILE).exists():
                return load_published(path / PUBLISHED_FILE, borders)
            raise BadInput(f"no Jacobian lens at {path} (expected {LENS_FILE} + {CONFIG_FILE}, or {PUBLISHED_FILE})")
        tensors, cfg = read_pair(path, LENS_FILE, CONFIG_FILE)
        if cfg.get("format") != FORMAT:
            raise CorruptModelFile(f"{path / CONFIG_FILE} is not a vocablens Jacobian-lens config")
        J, layers = tensors.get("J"), tensors.get("layers")
        try:
            L, d = int(cfg["n_layers"]), int(cfg["d_model"])
        except (KeyError, TypeError, ValueError):
            raise CorruptModelFile(f"{path / CONFIG_FILE} lacks n_layers / d_model; fit the lens again") from None
        if J is None or layers is None or J.dim() != 3 or tuple(J.shape[1:]) != (d, d) or J.shape[0] != layers.numel():
            raise CorruptModelFile(f"{path / LENS_FILE} does not hold J [S, {d}, {d}] and layers [S]")
        check_lens_tensor(path / LENS_FILE, "J", J, [f"layer {int(x)}" for x in layers.tolist()])
        lay = [int(x) for x in layers.tolist()]
        if lay and lay[-1] == L:  # the target layer's own J (= I), as some scripts store it: never translated
            gap = identity_gap(J[-1])
            if gap > IDENTITY_ATOL:
                raise CheckpointMismatch(f"{path / LENS_FILE} holds a matrix for layer {L}, the last block's output "
                                         f"(the target, which maps to itself), that is not the identity "
                                         f"(max |J - I| = {gap:.3g})")
            J, lay = J[:-1], lay[:-1]
        lens = cls(J, lay, L, cfg.get("model") or {}, cfg.get("fitting") or {})
        if borders is not None:
            lens.check_model(borders)
            lens.to(borders.read_device)
        return lens

    # ------------------------------------------------------------------ the published format
    def published_dict(self, dtype: torch.dtype = torch.float16) -> dict:
        """The reference format: ``{"J": {block l: [d, d]}, "n_prompts", "source_layers", "d_model",
        "metadata"}`` with block index l = stream layer - 1 (a stream-layer-0 matrix has no place there
        and is left out). ``metadata`` holds what TransformerLens 4 records (``model_name``,
        ``model_revision``, ``target_layer``, ``corpus``) plus our ``unembed_sha256``."""
        J = {ly - 1: self.J[i].to(dtype).cpu() for i, ly in enumerate(self.layers) if ly >= 1}  # cpu: torch.save's file
        meta = {"model_name": self.identity.get("name"), "model_revision": self.identity.get("revision"),
                "unembed_sha256": self.identity.get("unembed_sha256"), "target_layer": self.n_layers - 1,
                "corpus": str((self.settings.get("data") or {}).get("corpus", "")),
                "n_layers": self.n_layers, "source": "vocablens"}
        return {"J": J, "n_prompts": int(self.settings.get("n_prompts") or 0), "source_layers": sorted(J),
                "d_model": self.d_model, "metadata": {k: v for k, v in meta.items() if v is not None}}

    def save_published(self, path: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """Write the reference format (:meth:`published_dict`) to the file ``path`` atomically."""
        from vocablens.files import atomic_path

        path = Path(path)
        with atomic_path(path) as tmp:
            torch.save(self.published_dict(dtype), str(tmp))
        return path


def load_published(path: str | Path, borders: Borders | None = None, n_layers: int | None = None) -> JacobianLens:
    """Read a lens saved in the reference format (``anthropics/jacobian-lens``'s ``JacobianLens.save``,
    also written by TransformerLens 4): ``torch.load(weights_only=True)`` of a dict with ``J``
    ({block l: [d, d]}), ``n_prompts``, ``source_layers``, ``d_model`` and an optional ``metadata``.

    Block l becomes stream layer l+1. The model's layer count comes from ``borders`` (or ``n_layers``);
    the file's ``metadata.target_layer`` (TransformerLens) or, failing that, a contiguous run of source
    layers 0..m (the reference's default fits every block below the last: m = n_layers - 2) must agree.
    A matrix for the last block itself (scripts that store ``target + 1`` slots, the target's own J = I)
    is checked to be the identity (within :data:`IDENTITY_ATOL`) and left out: layer L is never
    translated. Every matrix must be floating point and finite (:func:`~vocablens.lens.lens_files.
    check_lens_tensor`).

    Raises:
        BadInput: neither ``borders`` nor ``n_layers``.
        CorruptModelFile: not such a dict (or not loadable with ``weights_only=True``), a matrix not
            floating point. NonFiniteWeights: a NaN or inf (naming the file, J[b] and the layer).
        CheckpointMismatch: d_model or the layers do not fit the model (the message names the blocks
            the file holds and the blocks the model has), a last-block matrix that is not I, or the model name,
            revision or unembedding hash the file records differ from the model's
            (:func:`vocablens.lens.identity.verify_identity`; the reference's files record none).
    """
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise BadInput(f"{path} does not exist") from None
    except Exception as exc:
        raise CorruptModelFile(f"cannot read {path} as a Jacobian lens (weights only): "
                               f"{str(exc).splitlines()[0][:160]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("J"), dict) or "d_model" not in obj:
        keys = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise CorruptModelFile(f"{path} is not a Jacobian lens (a dict with J, n_prompts, source_layers, d_model; found {keys})")
    try:
        d = int(obj["d_model"])
        blocks = sorted(int(k) for k in obj["J"])
    except (TypeError, ValueError):
        raise CorruptModelFile(f"{path}: d_model or the layer keys of J are not integers") from None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    L = borders.n_layers if borders is not None else n_layers
    if L is None:
        raise BadInput("a published Jacobian lens records no layer count: load it with the model")
    if borders is not None and borders.d_model != d:
        raise CheckpointMismatch(f"this Jacobian lens is for d_model={d}; the model has d_model={borders.d_model}")
    mats = {b: published_matrix(path, obj["J"], b, d) for b in blocks}
    blocks = usable_blocks(blocks, mats, meta.get("target_layer"), L, d)
    first = obj["J"][blocks[0]] if blocks[0] in obj["J"] else obj["J"][str(blocks[0])]
    stored = str(first.dtype).replace("torch.", "")
    source = "TransformerLens" if meta.get("transformer_lens_fit") else str(meta.get("source") or "jacobian-lens format")
    settings = {"source": source,
                "n_prompts": int(obj.get("n_prompts") or 0), "corpus": meta.get("corpus"),
                "stored_dtype": stored, "metadata": {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))}}
    settings["format"] = PUBLISHED_FORMAT
    identity = {"name": _text(meta.get("model_name")), "revision": _text(meta.get("model_revision")),
                "unembed_sha256": _text(meta.get("unembed_sha256")), "d_model": d, "n_layers": L}
    lens = JacobianLens(torch.stack([mats[b].float() for b in blocks]), [b + 1 for b in blocks], L, identity, settings)
    if borders is not None:
        lens.check_model(borders)
        lens.to(borders.read_device)
    return lens


def _text(x) -> str | None:
    return str(x) if isinstance(x, str) and x else None


def shipped_jacobian_path(model_name: str = DEFAULT_MODEL) -> Path | None:
    """Directory of the Jacobian lens shipped in the package for ``model_name``, or None."""
    from vocablens.lens.tuned import SHIPPED_DIR

    p = SHIPPED_DIR / str(model_name)
    return p if (p / LENS_FILE).exists() else None


def find_jacobian_lens(model_spec: str = DEFAULT_MODEL, path: str | Path | None = None) -> Path:
    """THE way a command finds its Jacobian lens: ``path`` (``--lens``: our directory, a published
    ``lens.pt`` or a directory holding one, or a hub id from the local cache) when given, else the
    lens shipped for ``model_spec``.

    Raises:
        BadInput: nothing there / none shipped.
    """
    if path:
        from vocablens.lens.published import resolve_lens_source

        p = resolve_lens_source(str(path), "jacobian", str(model_spec))
        if p.is_file() and p.suffix == ".pt":
            return p
        d = p if p.is_dir() else p.parent
        if (d / LENS_FILE).exists():
            return d
        if (d / PUBLISHED_FILE).exists():
            return d / PUBLISHED_FILE
        raise BadInput(f"no Jacobian lens in {path} (expected {LENS_FILE} + {CONFIG_FILE}, or a {PUBLISHED_FILE})")
    shipped = shipped_jacobian_path(str(model_spec))
    if shipped is None:
        raise BadInput(f"no Jacobian lens shipped for {model_spec!r}; give `path` (fit one with "
                       "`vocablens lens fit-jacobian`)")
    return shipped


def identity_for(borders: Borders, name: str | None = None) -> dict[str, Any]:
    """The model identity a lens fitted on ``borders`` records (:func:`~vocablens.lens.tuned.model_identity`)."""
    return model_identity(borders, name)


__all__ = ["CONFIG_FILE", "FORMAT", "IDENTITY_ATOL", "JacobianLens", "LENS_FILE", "PUBLISHED_FILE", "find_jacobian_lens",
           "layer_span", "load_published", "shipped_jacobian_path"]
