"""The tuned lens: one affine translator per layer, trained to match the model's final distribution.

Belrose et al. (2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens", §3):
the logit lens (nostalgebraist 2020) decodes the residual stream ``h_l`` of layer ``l`` with the
model's own final norm and LM head, which assumes every layer already writes in the last layer's
basis. The tuned lens instead decodes ``h_l + A_l h_l + b_l`` (residual form, as in the reference
implementation, so weight decay pulls towards the identity), with ``A_l`` [d, d] and ``b_l`` [d]
trained on a frozen model to minimise KL(final ‖ lens) at every position. Layer L (the model's output)
is never translated. ``A`` and ``b`` start at zero, so an untrained tuned lens *is* the logit lens.

Training (:func:`train`), defaults as in the paper and the reference (AlignmentResearch/tuned-lens,
``scripts/ingredients.py``): SGD with Nesterov momentum 0.9, learning-rate scale 1 (the torch learning
rate is ``lr · (1 - momentum)``, as the reference does to undo momentum's 1/(1-β) gain), linear
decay to 0 without warmup, weight decay 1e-3, gradient-norm clip 1, token-packed chunks with EOS
between documents, loss = sum over layers of the mean KL per token. Where ours differ, and why:

- tokens per step: the paper uses 2^18 tokens per step for 250 steps (65 M tokens, GPUs). On a CPU
  we default to 2^12 tokens per step; the step count is yours (``steps``). With far fewer tokens the
  lens still beats the logit lens at every layer (see ``vocablens lens eval``).
- chunk length: 512 tokens by default (the reference uses 2048), so a forward fits small machines.
- the LM-head GEMMs of *training* may run with bfloat16 inputs (``gemm_dtype="bfloat16"``; float32
  by default): on CPUs with AVX512-BF16 this is ~4x faster; softmax, log-sum-exp, KL and the
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

import copy
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from vocablens.errors import (
    BadInput, CheckpointMismatch, CorruptModelFile, OutputExists, TrainingDiverged,
)
from vocablens.models import Borders

LENS_FILE = "lens.safetensors"
CONFIG_FILE = "config.json"
CKPT_FILE = "checkpoint.safetensors"
CKPT_META = "checkpoint.json"
FORMAT = "vocablens-tuned-lens"
FORMAT_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "lenses"


# ---------------------------------------------------------------------------------------- identity
def model_identity(borders: Borders, name: str | None = None) -> dict[str, Any]:
    """What a lens must match: family, shapes, and a SHA-256 of the decoding path.

    The hash covers W_U (and b_U), the final norm's parameters and project_out, each rounded to
    bfloat16 first, so float32 and bfloat16 loads of the same checkpoint agree.

    Returns:
        ``{"family", "name", "d_model", "n_layers", "vocab_size", "unembed_sha256"}``.
    """
    h = hashlib.sha256()
    tensors: list[tuple[str, torch.Tensor]] = [("W_U", borders.W_U)]
    if borders.b_U is not None:
        tensors.append(("b_U", borders.b_U))
    for prefix, mod in (("final_norm", borders.final_norm), ("project_out", borders.project_out)):
        if mod is not None:
            tensors += [(f"{prefix}.{n}", p) for n, p in sorted(mod.named_parameters())]
    for n, t in tensors:
        h.update(n.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return {
        "family": borders.family,
        "name": name,
        "d_model": borders.d_model,
        "n_layers": borders.n_layers,
        "vocab_size": borders.vocab_size,
        "unembed_sha256": h.hexdigest(),
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
                 settings: dict | None = None) -> None:
        super().__init__()
        if d_model < 1 or n_layers < 1:
            raise BadInput(f"a tuned lens needs d_model >= 1 and n_layers >= 1; got {d_model}, {n_layers}")
        self.d_model = int(d_model)
        self.n_layers = int(n_layers)
        self.weight = nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.bias = nn.Parameter(torch.zeros(n_layers, d_model))
        self.identity: dict = dict(identity or {})
        self.settings: dict = dict(settings or {})

    @classmethod
    def for_model(cls, borders: Borders, name: str | None = None, settings: dict | None = None) -> "TunedLens":
        """A zero (untrained, = logit lens) tuned lens shaped for ``borders``' model."""
        return cls(borders.d_model, borders.n_layers, model_identity(borders, name), settings)

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """[..., d] residual stream at ``layer`` (0..L-1) -> translated [..., d] float32.

        Raises:
            BadInput: layer outside 0..L-1.
            ShapeMismatch: last dimension is not d_model.
        """
        from vocablens.errors import ShapeMismatch

        if not 0 <= layer < self.n_layers:
            raise BadInput(f"the tuned lens has translators for layers 0..{self.n_layers - 1}; got {layer}")
        if h.shape[-1] != self.d_model:
            raise ShapeMismatch(f"residual stream has width {h.shape[-1]}, the lens expects {self.d_model}")
        h = h.float()
        return h + torch.nn.functional.linear(h, self.weight[layer], self.bias[layer])

    def translate_all(self, H: torch.Tensor) -> torch.Tensor:
        """[L, N, d] residual streams of layers 0..L-1 -> translated [L, N, d] float32 (one batched GEMM)."""
        H = H.float()
        return torch.baddbmm(self.bias[:, None, :], H, self.weight.transpose(1, 2)) + H

    def check_model(self, borders: Borders) -> None:
        """Raise :class:`CheckpointMismatch` unless this lens was made for ``borders``' model."""
        ident = model_identity(borders) if self.identity.get("unembed_sha256") else None
        if borders.d_model != self.d_model or borders.n_layers != self.n_layers:
            raise CheckpointMismatch(
                f"this tuned lens is for a model with d_model={self.d_model}, {self.n_layers} layers"
                f"{' (' + str(self.identity.get('name')) + ')' if self.identity.get('name') else ''}; "
                f"the model has d_model={borders.d_model}, {borders.n_layers} layers")
        if ident is not None and ident["unembed_sha256"] != self.identity["unembed_sha256"]:
            raise CheckpointMismatch(
                f"this tuned lens was trained on another model ({self.identity.get('name') or self.identity.get('family')}:"
                f" unembedding hash {self.identity['unembed_sha256'][:12]}, this model's is "
                f"{ident['unembed_sha256'][:12]})")

    # ------------------------------------------------------------------ files
    def config_dict(self) -> dict:
        from vocablens import __version__

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
            raise OutputExists(f"{path} already holds a tuned lens; pass --force to replace it")
        tensors = {"weight": self.weight.detach().to(dtype).contiguous(),
                   "bias": self.bias.detach().to(dtype).contiguous()}
        _atomic_save(path, tensors, self.config_dict(), LENS_FILE, CONFIG_FILE)
        return path

    @classmethod
    def load(cls, path: str | Path, borders: Borders | None = None) -> "TunedLens":
        """Read a lens directory (ours, or the tuned-lens library's ``params.pt`` layout).

        Args:
            path: a directory holding ``lens.safetensors`` + ``config.json`` (or ``params.pt`` +
                ``config.json``).
            borders: when given, the lens is checked against this model.

        Raises:
            BadInput: nothing readable at ``path``.
            CorruptModelFile: a truncated or malformed file.
            CheckpointMismatch: the lens belongs to another model.
        """
        path = Path(path)
        if path.is_file():
            path = path.parent
        if not (path / LENS_FILE).exists() and (path / "params.pt").exists():
            return load_tuned_lens_library(path, borders)
        if not (path / LENS_FILE).exists():
            raise BadInput(f"no tuned lens at {path} (expected {LENS_FILE} and {CONFIG_FILE})")
        cfg = _read_json(path / CONFIG_FILE)
        if cfg.get("format") != FORMAT:
            raise CorruptModelFile(f"{path / CONFIG_FILE} is not a vocablens tuned-lens config")
        tensors = _read_safetensors(path / LENS_FILE)
        W, b = tensors.get("weight"), tensors.get("bias")
        L, d = int(cfg["n_layers"]), int(cfg["d_model"])
        if W is None or b is None or tuple(W.shape) != (L, d, d) or tuple(b.shape) != (L, d):
            raise CorruptModelFile(f"{path / LENS_FILE} does not hold weight [{L}, {d}, {d}] and bias [{L}, {d}]")
        lens = cls(d, L, cfg.get("model") or {}, cfg.get("training") or {})
        with torch.no_grad():
            lens.weight.copy_(W.float())
            lens.bias.copy_(b.float())
        if borders is not None:
            lens.check_model(borders)
        return lens


def load_tuned_lens_library(path: str | Path, borders: Borders | None = None) -> TunedLens:
    """Read a lens saved by the tuned-lens library: ``params.pt`` (state dict of its
    ``layer_translators``: ``{i}.weight`` [d, d], ``{i}.bias`` [d], i = 0..L-1) + ``config.json``
    (``d_model``, ``num_hidden_layers``, ``bias``). The layouts correspond: both compute
    ``h + A h + b`` on the residual stream of layer i (the input of block i for i = 0).

    ``params.pt`` is read with ``torch.load(weights_only=True)`` (no unpickling of code).

    Raises:
        CorruptModelFile: unreadable file, missing keys, or shapes that do not match the config.
        CheckpointMismatch: ``borders`` given and its d_model / layer count differ.
    """
    path = Path(path)
    cfg = _read_json(path / CONFIG_FILE)
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
    lens = TunedLens(d, L, {"name": cfg.get("base_model_name_or_path"),
                            "tuned_lens_unembed_hash": cfg.get("unembed_hash")},
                     {"source": "tuned-lens library", "lens_type": cfg.get("lens_type")})
    with torch.no_grad():
        for i in range(L):
            w = state.get(f"{i}.weight")
            if w is None or tuple(w.shape) != (d, d):
                raise CorruptModelFile(f"{path / 'params.pt'}: translator {i} weight missing or not [{d}, {d}]")
            lens.weight[i].copy_(w.float())
            bvec = state.get(f"{i}.bias")
            if bvec is not None:
                if tuple(bvec.shape) != (d,):
                    raise CorruptModelFile(f"{path / 'params.pt'}: translator {i} bias is not [{d}]")
                lens.bias[i].copy_(bvec.float())
    if borders is not None:
        lens.check_model(borders)
    return lens


def shipped_lens_path(model_name: str = "smollm2") -> Path | None:
    """Directory of the lens shipped in the package for ``model_name``, or None."""
    p = SHIPPED_DIR / model_name
    return p if (p / LENS_FILE).exists() else None


def load_for_model(borders: Borders, model_spec: str = "smollm2", path: str | Path | None = None) -> TunedLens:
    """The lens at ``path``, or else the one shipped for ``model_spec``; checked against ``borders``.

    Raises:
        BadInput: no path and no lens shipped for that model.
        CheckpointMismatch: the lens belongs to another model.
    """
    if not path:
        path = shipped_lens_path(str(model_spec))
        if path is None:
            raise BadInput(f"no tuned lens shipped for {model_spec!r}; give --lens DIR "
                           "(train one with `vocablens lens train`)")
    return TunedLens.load(path, borders)


def _read_json(p: Path) -> dict:
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptModelFile(f"{p} is not valid JSON ({exc.__class__.__name__}); the file may be truncated") from None
    if not isinstance(obj, dict):
        raise CorruptModelFile(f"{p} does not hold a JSON object")
    return obj


def _read_safetensors(p: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except FileNotFoundError:
        raise BadInput(f"{p} does not exist") from None
    except Exception as exc:
        raise CorruptModelFile(f"{p} is truncated or not a safetensors file ({str(exc).splitlines()[0][:120]})") from None


def _atomic_save(dirpath: Path, tensors: dict[str, torch.Tensor], meta: dict, tensor_name: str,
                 meta_name: str) -> None:
    """Write tensors and JSON next to their final names, fsync, then rename (never half a file)."""
    from safetensors.torch import save_file

    dirpath.mkdir(parents=True, exist_ok=True)
    fd, tmp_t = tempfile.mkstemp(prefix=f".{tensor_name}.", dir=dirpath)
    os.close(fd)
    fd, tmp_m = tempfile.mkstemp(prefix=f".{meta_name}.", dir=dirpath)
    os.close(fd)
    try:
        save_file(tensors, tmp_t)
        with open(tmp_m, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp_t, "rb") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        for t in (tmp_t, tmp_m):  # mkstemp makes 0600 files; give them the usual permissions
            os.chmod(t, 0o666 & ~umask)
        os.replace(tmp_t, dirpath / tensor_name)
        os.replace(tmp_m, dirpath / meta_name)
    finally:
        for t in (tmp_t, tmp_m):
            if os.path.exists(t):
                os.unlink(t)


# ---------------------------------------------------------------------------------------- the head in float32
class _Head:
    """Final norm (+ project_out) as float32 modules, and W_U for the chunked GEMMs.

    The model's own modules are copied to float32 when the model is not float32, so lens math is
    float32 whatever the model dtype.
    """

    def __init__(self, borders: Borders, gemm_dtype: torch.dtype = torch.float32) -> None:
        def f32(mod):
            if mod is None:
                return None
            if all(p.dtype == torch.float32 for p in mod.parameters()):
                return mod
            return copy.deepcopy(mod).float()

        self.norm = f32(borders.final_norm)
        self.project_out = f32(borders.project_out)
        W = borders.W_U.detach()
        self.W = W if W.dtype == gemm_dtype else W.to(gemm_dtype)
        self.b = None if borders.b_U is None else borders.b_U.detach().float()
        self.scale = float(borders.logit_scale)
        self.softcap = borders.softcap
        self.gemm_dtype = gemm_dtype
        self.V = int(W.shape[0])

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        """[..., d_model] float32 -> [..., d_emb] float32 (differentiable)."""
        h = h.float()
        if self.norm is not None:
            h = self.norm(h).float()
        if self.project_out is not None:
            h = self.project_out(h).float()
        return h

    def logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[R, d_emb] -> (logits [R, V] float32, tanh values for the softcap's derivative or None)."""
        z = (x.to(self.gemm_dtype) @ self.W.T).float()
        if self.b is not None:
            z += self.b
        if self.scale != 1.0:
            z *= self.scale
        t = None
        if self.softcap is not None:
            t = torch.tanh(z / self.softcap)
            z = t * self.softcap
        return z, t

    def backward_logits(self, dz: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
        """d loss / d logits [R, V] (overwritten) -> d loss / d x [R, d_emb] float32."""
        if t is not None:
            dz.mul_(1.0 - t * t)
        if self.scale != 1.0:
            dz.mul_(self.scale)
        return (dz.to(self.gemm_dtype) @ self.W).float()


def _loss_and_grad(head: _Head, X: torch.Tensor, final_lp: torch.Tensor | None, targets: torch.Tensor | None,
                   valid: torch.Tensor | None, grad_scale: float, chunk_rows: int, want_grad: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KL(final ‖ lens) (or CE to ``targets``) of L stacked layers, with its gradient.

    Args:
        X: [L, N, d_emb] float32 normed lens states (detached).
        final_lp: [N, V] float32 log-probabilities of the final layer (KL mode), or None (CE mode).
        targets: [N] int64 next tokens (CE mode).
        valid: [N] bool, positions that count (CE: those with a next token); None = all.
        grad_scale: factor on the gradient (1 / number of counted tokens).
        chunk_rows: at most this many (layer, token) rows per GEMM ([rows, V] float32 buffers).

    Returns:
        (loss summed over the counted tokens, per layer [L] float64; gradient [L, N, d_emb] or None).
    """
    L, N, _ = X.shape
    c = max(1, chunk_rows // L)
    losses = torch.zeros(L, dtype=torch.float64)
    G = torch.empty_like(X) if want_grad else None
    for s in range(0, N, c):
        e = min(N, s + c)
        n = e - s
        z, t = head.logits(X[:, s:e].reshape(L * n, -1))
        z3 = z.view(L, n, -1)
        vmask = None if valid is None else valid[s:e].to(z.dtype)
        if final_lp is not None:
            lp = final_lp[s:e]
            p = lp.exp()
            plogp = (p * lp).nan_to_num().sum(-1)  # [n]
            dot = torch.einsum("lnv,nv->ln", z3, p)  # Σ p·z
        else:
            y = targets[s:e]
            zy = z3.gather(2, y.view(1, n, 1).expand(L, n, 1))[..., 0]
        m = z.amax(-1, keepdim=True)
        z.sub_(m).exp_()
        ssum = z.sum(-1, keepdim=True)
        lse = (m + ssum.log()).view(L, n)
        z.div_(ssum)  # z is now q = softmax(lens logits)
        if final_lp is not None:
            loss = plogp[None] - dot + lse  # KL(p ‖ q) = Σ p log p - Σ p z + lse
            if want_grad:
                z3.sub_(p)
        else:
            loss = lse - zy
            if want_grad:
                z3.scatter_add_(2, y.view(1, n, 1).expand(L, n, 1),
                                torch.full((L, n, 1), -1.0, dtype=z.dtype))
        if vmask is not None:
            loss = loss * vmask
            if want_grad:
                z3.mul_(vmask.view(1, n, 1))
        losses += loss.double().sum(1)
        if want_grad:
            z.mul_(grad_scale)
            G[:, s:e] = head.backward_logits(z, t).view(L, n, -1)
    return losses, G


# ---------------------------------------------------------------------------------------- least-squares start
def regression_init(borders: Borders, rows: torch.Tensor, lens: TunedLens | None = None, ridge: float = 1e-3,
                    calib: torch.Tensor | None = None, alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
                    chunk_rows: int = 2048) -> tuple[TunedLens, list[float]]:
    """A least-squares starting point for the translators (a "linear shortcut", Din et al. 2023,
    "Jump to Conclusions: Short-Cutting Transformers With Linear Transformations", §2), made
    scale-free for the final norm, then shrunk per layer towards the logit lens by a line search on KL.

    The final norm only sees directions, so per token t and layer l we regress the normalised last
    layer ``h_L / rms(h_L)`` on the features ``[h_l / r_t, 1 / r_t]`` with ``r_t = rms(h_l)``
    (ordinary ridge least squares, float64 normal equations): the fit ``M h_l + c`` then satisfies
    ``(M h_l + c) / r_t ≈ h_L / rms(h_L)``, i.e. norm(M h_l + c) ≈ norm(h_L), tokens weighted equally.
    In residual form ``A = M - I``, ``b = c``. Each layer then takes ``h + α(A h + b)`` with the α in
    ``alphas`` of lowest KL(final ‖ lens) on ``calib`` rows (α = 0 is the logit lens, so the start is
    never worse than the logit lens on ``calib``).

    Cost: one frozen forward per row, 2·(d+1)²·L FLOPs per token for the normal equations, and
    len(alphas) LM-head forwards per layer on the calibration tokens.

    Args:
        borders: the model.
        rows: [N, T] int64 token chunks for the fit.
        lens: lens to write into (default: a new one for the model).
        ridge: Tikhonov term, relative to the mean diagonal of the normal matrix.
        calib: [M, T] int64 rows for the line search (default: the last row of ``rows``).
        alphas: candidate shrinkage factors.

    Returns:
        (lens, chosen α per layer).
    """
    if rows.dim() != 2 or rows.numel() == 0:
        raise BadInput(f"regression_init needs token rows [N, T]; got {list(rows.shape)}")
    L, d = borders.n_layers, borders.d_model
    lens = lens if lens is not None else TunedLens.for_model(borders)
    XtX = torch.zeros(L, d + 1, d + 1, dtype=torch.float64)
    XtY = torch.zeros(L, d + 1, d, dtype=torch.float64)
    with torch.no_grad():
        for r in range(rows.shape[0]):
            resid, _ = borders.residual_stream(rows[r: r + 1])
            R = resid[:, 0].double()  # [L+1, T, d]
            rms = R.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
            X = torch.cat([R[:L] / rms[:L], 1.0 / rms[:L]], dim=-1)  # [L, T, d+1]
            Y = (R[L] / rms[L])[None].expand(L, -1, -1)
            XtX += X.transpose(1, 2) @ X
            XtY += X.transpose(1, 2) @ Y
        lam = ridge * torch.diagonal(XtX, dim1=1, dim2=2).mean(-1)
        eye = torch.eye(d + 1, dtype=torch.float64)
        # symmetric positive definite: Cholesky per layer (batched LU fails in some MKL builds)
        coef = torch.stack([torch.cholesky_solve(XtY[i], torch.linalg.cholesky(XtX[i] + lam[i] * eye))
                            for i in range(L)])  # [L, d+1, d]
        A = coef[:, :d].transpose(1, 2) - torch.eye(d, dtype=torch.float64)
        bvec = coef[:, d]
        calib = rows[-1:] if calib is None else calib
        head = _Head(borders, torch.float32)
        best = torch.full((L,), float("inf"), dtype=torch.float64)
        chosen = [0.0] * L
        kls = torch.zeros(len(alphas), L, dtype=torch.float64)
        for r in range(calib.shape[0]):
            resid, logits = borders.residual_stream(calib[r: r + 1])
            H = resid[:L, 0].float()
            flp = torch.log_softmax(logits[0].float(), -1)
            for j, a in enumerate(alphas):
                Ht = H + a * (torch.einsum("lij,ltj->lti", A.float(), H) + bvec.float()[:, None, :])
                kl, _ = _loss_and_grad(head, head.normed(Ht), flp, None, None, 1.0, chunk_rows, want_grad=False)
                kls[j] += kl
        for i in range(L):
            j = int(torch.argmin(kls[:, i]))
            chosen[i] = float(alphas[j])
        alpha = torch.tensor(chosen, dtype=torch.float64)
        lens.weight.copy_((alpha[:, None, None] * A).float())
        lens.bias.copy_((alpha[:, None] * bvec).float())
    return lens, chosen


# ---------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainSettings:
    """Settings of :func:`train` (saved with the lens and in checkpoints).

    Attributes:
        steps: optimizer steps (>= 1).
        tokens_per_step: tokens per step over all processes (rounded to whole chunks).
        seq_len: tokens per packed chunk.
        lr: learning-rate scale (the reference's ``lr_scale``; torch lr = lr·(1-momentum)).
        momentum: Nesterov momentum.
        weight_decay: L2 on A and b (pulls towards the identity translator).
        grad_clip: max global gradient norm (0 = off).
        warmup_steps: linear warmup steps before the linear decay.
        loss: ``kl`` (to the final distribution) or ``ce`` (to the next token).
        seed: data order.
        chunk_rows: (layer, token) rows per LM-head GEMM (memory: ~3 · rows · V · 4 bytes).
        gemm_dtype: ``float32`` or ``bfloat16`` inputs of the training GEMMs (float32 accumulation
            of the softmax and loss either way).
        micro_batch: chunks per model forward.
    """

    steps: int = 250
    tokens_per_step: int = 4096
    seq_len: int = 512
    lr: float = 1.0
    momentum: float = 0.9
    weight_decay: float = 1e-3
    grad_clip: float = 1.0
    warmup_steps: int = 0
    loss: str = "kl"
    seed: int = 0
    chunk_rows: int = 2048
    gemm_dtype: str = "float32"
    micro_batch: int = 1

    def validate(self) -> None:
        """Raises BadInput for out-of-range settings."""
        if self.steps < 1:
            raise BadInput(f"--steps must be at least 1; got {self.steps}")
        if self.seq_len < 2:
            raise BadInput(f"--seq-len must be at least 2; got {self.seq_len}")
        if self.tokens_per_step < 1:
            raise BadInput(f"--tokens-per-step must be at least 1; got {self.tokens_per_step}")
        if self.loss not in ("kl", "ce"):
            raise BadInput(f"--loss must be kl or ce; got {self.loss!r}")
        if self.gemm_dtype not in ("float32", "bfloat16"):
            raise BadInput(f"--gemm-dtype must be float32 or bfloat16; got {self.gemm_dtype!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise BadInput(f"--lr must be a positive number; got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise BadInput(f"momentum must be in [0, 1); got {self.momentum}")
        if self.chunk_rows < 1 or self.micro_batch < 1 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise BadInput("chunk_rows and micro_batch must be >= 1, warmup_steps and weight_decay >= 0")

    def rows_per_step(self) -> int:
        return max(1, round(self.tokens_per_step / self.seq_len))

    def lr_at(self, step: int) -> float:
        """Torch learning rate at optimizer step ``step`` (0-based): warmup, then linear decay to 0."""
        base = self.lr * (1.0 - self.momentum) if self.momentum > 0 else self.lr
        if step < self.warmup_steps:
            return base * (step + 1) / (self.warmup_steps + 1)
        rest = max(1, self.steps - self.warmup_steps)
        return base * max(0.0, 1.0 - (step - self.warmup_steps) / rest)


@dataclass(frozen=True)
class StepInfo:
    """Progress of one optimizer step (for progress bars and logs).

    Attributes: step (1-based), steps, loss (sum over layers of mean per-token loss, nats),
    layer_loss ([L] floats, nats), tokens (seen so far, all processes), tokens_per_s (this run),
    lr, grad_norm (before clipping).
    """

    step: int
    steps: int
    loss: float
    layer_loss: list[float]
    tokens: int
    tokens_per_s: float
    lr: float
    grad_norm: float


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did. ``lens`` is trained; ``history`` holds one StepInfo per step run."""

    lens: TunedLens
    history: list[StepInfo]
    seconds: float
    tokens: int
    resumed_from: int = 0


def _dist():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(), dist.get_world_size()
    return None, 0, 1


def save_checkpoint(dirpath: str | Path, lens: TunedLens, opt: torch.optim.Optimizer, step: int,
                    settings: TrainSettings, data_info: dict, history: list[StepInfo]) -> None:
    """Write ``checkpoint.safetensors`` (lens + momentum buffers) and ``checkpoint.json`` atomically."""
    tensors = {"weight": lens.weight.detach().clone(), "bias": lens.bias.detach().clone()}
    for name, p in (("weight", lens.weight), ("bias", lens.bias)):
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            tensors[f"momentum.{name}"] = buf.detach().clone()
    meta = {"format": FORMAT + "-checkpoint", "step": step, "settings": asdict(settings),
            "data": data_info, "model": lens.identity, "d_model": lens.d_model, "n_layers": lens.n_layers,
            "history": [asdict(h) for h in history]}
    _atomic_save(Path(dirpath), tensors, meta, CKPT_FILE, CKPT_META)


def load_checkpoint(dirpath: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises:
        BadInput: no checkpoint there.
        CorruptModelFile: truncated / malformed files.
    """
    dirpath = Path(dirpath)
    if not (dirpath / CKPT_META).exists() or not (dirpath / CKPT_FILE).exists():
        raise BadInput(f"no checkpoint in {dirpath} (expected {CKPT_FILE} and {CKPT_META})")
    meta = _read_json(dirpath / CKPT_META)
    if meta.get("format") != FORMAT + "-checkpoint":
        raise CorruptModelFile(f"{dirpath / CKPT_META} is not a vocablens tuned-lens checkpoint")
    return _read_safetensors(dirpath / CKPT_FILE), meta


def lens_from_checkpoint(dirpath: str | Path, borders: Borders | None = None) -> TunedLens:
    """The lens held by a training checkpoint (e.g. of an interrupted run), with its settings,
    data provenance and ``stopped_at_step`` in ``settings``.

    Raises:
        BadInput: no checkpoint there.
        CorruptModelFile: truncated / malformed checkpoint.
        CheckpointMismatch: ``borders`` given and the checkpoint is for another model.
    """
    tensors, meta = load_checkpoint(dirpath)
    d, L = int(meta["d_model"]), int(meta["n_layers"])
    hist = meta.get("history") or []
    settings = {**(meta.get("settings") or {}), "data": meta.get("data") or {},
                "stopped_at_step": int(meta["step"]),
                "tokens": int(meta["step"]) * TrainSettings(**meta["settings"]).rows_per_step()
                * int(meta["settings"]["seq_len"]),
                "final_loss": hist[-1]["loss"] if hist else None}
    lens = TunedLens(d, L, meta.get("model") or {}, settings)
    with torch.no_grad():
        lens.weight.copy_(tensors["weight"].float())
        lens.bias.copy_(tensors["bias"].float())
    if borders is not None:
        lens.check_model(borders)
    return lens


def train(borders: Borders, rows: torch.Tensor, settings: TrainSettings = TrainSettings(),
          lens: TunedLens | None = None, checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, resume: bool = False, data_info: dict | None = None,
          on_step: Callable[[StepInfo], None] | None = None, name: str | None = None) -> TrainResult:
    """Train a tuned lens on a frozen model (Belrose et al. 2023, §3; defaults: module docstring).

    Per step: ``rows_per_step`` packed chunks [seq_len] are read (seeded order; with several
    torch.distributed processes, rank r takes chunks r, r+W, ...), the model runs once without
    gradients, the residual streams of layers 0..L-1 are translated and decoded, and the loss (sum
    over layers of the mean KL(final ‖ lens) per token, nats; or CE to the next token) is
    back-propagated into the translators only. Cost per token: one frozen forward plus, per layer,
    an LM-head forward and backward (2·V·d FLOPs each).

    Args:
        borders: the model (frozen; nothing of it is modified).
        rows: [N, seq_len] int64 packed token ids (:func:`vocablens.corpus.pack_tokens`).
        settings: :class:`TrainSettings`.
        lens: start from this lens (default: a zero lens = the logit lens).
        checkpoint_dir: where checkpoints go (rank 0 writes).
        checkpoint_every: write a checkpoint every N steps (0 = only at the end).
        resume: continue from ``checkpoint_dir``'s checkpoint (exactly: same data order, momentum).
        data_info: provenance of the data (corpus, token count), stored in checkpoints and settings.
        on_step: called after each step with a :class:`StepInfo` (rank 0 only).

    Returns:
        :class:`TrainResult`.

    Raises:
        BadInput: bad settings, rows of the wrong shape, resume without checkpoint.
        CheckpointMismatch: the checkpoint to resume is for another model or other settings.
        TrainingDiverged: a non-finite loss or gradient (names the layer); the last good checkpoint
            stays as it was.
    """
    settings.validate()
    if rows.dim() != 2 or rows.shape[0] < 1 or rows.shape[1] != settings.seq_len:
        raise BadInput(f"training rows must be [N >= 1, seq_len={settings.seq_len}]; got {list(rows.shape)}")
    dist, rank, world = _dist()
    L = borders.n_layers
    data_info = dict(data_info or {})
    data_info.setdefault("n_rows", int(rows.shape[0]))
    data_info.setdefault("rows_sha256", hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16])
    if lens is None:
        lens = TunedLens.for_model(borders, name)
    else:
        lens.check_model(borders)
    gemm_dtype = torch.bfloat16 if settings.gemm_dtype == "bfloat16" else torch.float32
    head = _Head(borders, gemm_dtype)
    opt = torch.optim.SGD([lens.weight, lens.bias], lr=settings.lr_at(0), momentum=settings.momentum,
                          nesterov=settings.momentum > 0, weight_decay=settings.weight_decay)
    start = 0
    history: list[StepInfo] = []
    if resume:
        if checkpoint_dir is None:
            raise BadInput("--resume needs a checkpoint directory")
        tensors, meta = load_checkpoint(checkpoint_dir)
        if meta.get("model", {}).get("unembed_sha256") != lens.identity.get("unembed_sha256"):
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} is for another model")
        if meta.get("settings") != asdict(settings):
            diff = {k: (v, asdict(settings).get(k)) for k, v in (meta.get("settings") or {}).items()
                    if asdict(settings).get(k) != v}
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made with other settings: {diff}")
        if meta.get("data", {}).get("rows_sha256") != data_info["rows_sha256"]:
            raise CheckpointMismatch(f"the checkpoint in {checkpoint_dir} was made on other data")
        with torch.no_grad():
            lens.weight.copy_(tensors["weight"])
            lens.bias.copy_(tensors["bias"])
        for nm, p in (("weight", lens.weight), ("bias", lens.bias)):
            if f"momentum.{nm}" in tensors:
                opt.state[p]["momentum_buffer"] = tensors[f"momentum.{nm}"].clone()
        start = int(meta["step"])
        history = [StepInfo(**h) for h in meta.get("history", [])]
        if start >= settings.steps:
            raise BadInput(f"the checkpoint in {checkpoint_dir} is already at step {start} of {settings.steps}")
    rps = settings.rows_per_step()
    n_rows = int(rows.shape[0])
    tokens_per_step = rps * settings.seq_len
    t0 = time.perf_counter()
    tokens_run = 0
    perm_cache: dict[int, torch.Tensor] = {}

    def step_rows(step: int) -> list[int]:
        out = []
        for g in range(step * rps, (step + 1) * rps):
            epoch, i = divmod(g, n_rows)
            if epoch not in perm_cache:
                perm_cache.clear()
                perm_cache[epoch] = torch.randperm(
                    n_rows, generator=torch.Generator().manual_seed(settings.seed * 1_000_003 + epoch))
            out.append(int(perm_cache[epoch][i]))
        return out

    for step in range(start, settings.steps):
        lr = settings.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        mine = step_rows(step)[rank::world]
        opt.zero_grad(set_to_none=False)
        layer_loss = torch.zeros(L, dtype=torch.float64)
        per_row = settings.seq_len if settings.loss == "kl" else settings.seq_len - 1
        scale = 1.0 / (rps * per_row)
        for mb in range(0, len(mine), settings.micro_batch):
            ids = rows[mine[mb: mb + settings.micro_batch]]
            ll = _train_microbatch(borders, lens, head, ids, settings, scale)
            layer_loss += ll
        if dist is not None:
            packed = torch.cat([lens.weight.grad.flatten(), lens.bias.grad.flatten(), layer_loss.float()])
            dist.all_reduce(packed)
            nW = lens.weight.numel()
            lens.weight.grad.copy_(packed[:nW].view_as(lens.weight))
            lens.bias.grad.copy_(packed[nW: nW + lens.bias.numel()].view_as(lens.bias))
            layer_loss = packed[nW + lens.bias.numel():].double()
        layer_mean = layer_loss * scale
        bad = [i for i in range(L) if not math.isfinite(float(layer_mean[i]))]
        if not bad:
            gfin = torch.isfinite(lens.weight.grad).flatten(1).all(1) & torch.isfinite(lens.bias.grad).all(1)
            bad = [i for i in range(L) if not bool(gfin[i])]
        if bad:
            where = f"; the last good checkpoint in {checkpoint_dir} is kept" if checkpoint_dir else ""
            raise TrainingDiverged(
                f"training diverged at step {step + 1}: non-finite loss or gradient at layer {bad[0]}"
                f" (layers {bad[:8]}); lower --lr{where}")
        if settings.grad_clip > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_([lens.weight, lens.bias], settings.grad_clip))
        else:
            gnorm = float(torch.sqrt(lens.weight.grad.pow(2).sum() + lens.bias.grad.pow(2).sum()))
        opt.step()
        if not (torch.isfinite(lens.weight).all() and torch.isfinite(lens.bias).all()):
            raise TrainingDiverged(f"training diverged at step {step + 1}: the translators became non-finite")
        tokens_run += tokens_per_step
        info = StepInfo(step=step + 1, steps=settings.steps, loss=float(layer_mean.sum()),
                        layer_loss=[float(x) for x in layer_mean], tokens=(step + 1) * tokens_per_step,
                        tokens_per_s=tokens_run / max(1e-9, time.perf_counter() - t0), lr=lr, grad_norm=gnorm)
        history.append(info)
        if rank == 0:
            last = step + 1 == settings.steps
            if checkpoint_dir is not None and (last or (checkpoint_every and (step + 1) % checkpoint_every == 0)):
                save_checkpoint(checkpoint_dir, lens, opt, step + 1, settings, data_info, history)
            if on_step is not None:
                on_step(info)
    lens.settings = {**asdict(settings), "data": data_info, "tokens": settings.steps * tokens_per_step,
                     "world_size": world, "final_loss": history[-1].loss if history else None}
    return TrainResult(lens=lens, history=history, seconds=time.perf_counter() - t0, tokens=tokens_run,
                       resumed_from=start)


def _train_microbatch(borders: Borders, lens: TunedLens, head: _Head, ids: torch.Tensor,
                      settings: TrainSettings, scale: float) -> torch.Tensor:
    """Accumulate gradients of one micro-batch into the lens; returns the summed loss per layer [L]."""
    L = borders.n_layers
    with torch.no_grad():
        resid, logits = borders.residual_stream(ids)
        B, T = ids.shape
        N = B * T
        H = resid[:L].reshape(L, N, -1).float()
        del resid
        final_lp = targets = valid = None
        if settings.loss == "kl":
            final_lp = torch.log_softmax(logits.reshape(N, -1).float(), dim=-1)
        else:
            targets = torch.zeros(B, T, dtype=torch.long)
            targets[:, :-1] = ids[:, 1:]
            targets = targets.reshape(N)
            valid = torch.ones(B, T, dtype=torch.bool)
            valid[:, -1] = False
            valid = valid.reshape(N)
        del logits
    with torch.enable_grad():
        X = head.normed(lens.translate_all(H))
        losses, G = _loss_and_grad(head, X.detach(), final_lp, targets, valid, scale, settings.chunk_rows)
        X.backward(G)
    return losses


# ---------------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class LensEval:
    """Per-layer quality of the logit lens and the tuned lens on held-out text (layers 0..L).

    All arrays are [L+1] float64 means over the counted positions; layer L is the model itself
    (KL 0, agreement 1) for both lenses.

    Attributes:
        n_layers: L.
        tokens: positions scored for KL / entropy / agreement.
        ce_tokens: positions scored for CE (those with a next token).
        n_bytes: UTF-8 bytes of the predicted text (for bits per byte), or 0 when unknown.
        logit_kl, tuned_kl: KL(final ‖ lens), nats.
        logit_ce, tuned_ce: cross-entropy against the actual next token, nats.
        logit_bpb, tuned_bpb: the same in bits per byte (nan when n_bytes is 0).
        logit_entropy, tuned_entropy: entropy of the lens distribution, nats.
        logit_top1, tuned_top1: fraction of positions whose top-1 equals the final layer's.
    """

    n_layers: int
    tokens: int
    ce_tokens: int
    n_bytes: int
    logit_kl: list[float]
    tuned_kl: list[float]
    logit_ce: list[float]
    tuned_ce: list[float]
    logit_bpb: list[float]
    tuned_bpb: list[float]
    logit_entropy: list[float]
    tuned_entropy: list[float]
    logit_top1: list[float]
    tuned_top1: list[float]

    def to_dict(self) -> dict:
        """JSON-ready: ``{"n_layers", "tokens", ..., "layers": [{"layer", "logit": {...}, "tuned": {...}}]}``."""
        layers = []
        for i in range(self.n_layers + 1):
            layers.append({"layer": i,
                           "logit": {"kl": self.logit_kl[i], "ce": self.logit_ce[i], "bpb": self.logit_bpb[i],
                                     "entropy": self.logit_entropy[i], "top1_agreement": self.logit_top1[i]},
                           "tuned": {"kl": self.tuned_kl[i], "ce": self.tuned_ce[i], "bpb": self.tuned_bpb[i],
                                     "entropy": self.tuned_entropy[i], "top1_agreement": self.tuned_top1[i]}})
        return {"n_layers": self.n_layers, "tokens": self.tokens, "ce_tokens": self.ce_tokens,
                "n_bytes": self.n_bytes,
                "tuned_below_logit_every_layer": all(self.tuned_kl[i] < self.logit_kl[i] for i in range(self.n_layers)),
                "layers": layers}


def _metrics(head: _Head, X: torch.Tensor, final_lp: torch.Tensor, final_top: torch.Tensor,
             targets: torch.Tensor, valid: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    """Sums over positions of [KL, CE, entropy, top-1 agreement] for L stacked layers -> [L, 4] float64."""
    L, N, _ = X.shape
    c = max(1, chunk_rows // L)
    out = torch.zeros(L, 4, dtype=torch.float64)
    for s in range(0, N, c):
        e = min(N, s + c)
        n = e - s
        z, _ = head.logits(X[:, s:e].reshape(L * n, -1))
        lq = torch.log_softmax(z, dim=-1).view(L, n, -1)
        del z
        lp = final_lp[s:e]
        p = lp.exp()
        kl = ((p * lp).nan_to_num().sum(-1))[None] - torch.einsum("lnv,nv->ln", lq.nan_to_num(neginf=-1e30), p)
        q = lq.exp()
        ent = -(q * lq).nan_to_num().sum(-1)
        del q
        ce = -lq.gather(2, targets[s:e].view(1, n, 1).expand(L, n, 1))[..., 0] * valid[s:e]
        agree = (lq.argmax(-1) == final_top[s:e][None]).double()
        out[:, 0] += kl.clamp_min(0).double().sum(1)
        out[:, 1] += ce.double().sum(1)
        out[:, 2] += ent.double().sum(1)
        out[:, 3] += agree.sum(1)
    return out


def evaluate(borders: Borders, lens: TunedLens, rows: torch.Tensor, n_bytes: int = 0,
             chunk_rows: int = 2048, real_vocab_only: bool = True) -> LensEval:
    """Score the logit lens and the tuned lens at every layer on held-out chunks (float32 throughout).

    Belrose et al. (2023, §4, Fig. 3 and 4): KL to the final distribution, cross-entropy, and
    agreement per layer. Each row is one forward pass; both lenses read the same residual stream.

    Args:
        borders: the model.
        lens: the tuned lens (checked against the model).
        rows: [N, T] int64 held-out token chunks.
        n_bytes: UTF-8 bytes of the text predicted (the tokens at positions 1..T-1 of each row), for
            bits per byte; 0 = unknown.
        chunk_rows: (layer, token) rows per LM-head GEMM.
        real_vocab_only: top-1 agreement over real tokens only (padding rows excluded).

    Returns:
        :class:`LensEval`.

    Raises:
        BadInput: empty rows.
        CheckpointMismatch: the lens belongs to another model.
    """
    if rows.dim() != 2 or rows.numel() == 0 or rows.shape[1] < 2:
        raise BadInput(f"evaluation needs token rows [N >= 1, T >= 2]; got {list(rows.shape)}")
    lens.check_model(borders)
    head = _Head(borders, torch.float32)
    L = borders.n_layers
    sums = {"logit": torch.zeros(L, 4, dtype=torch.float64), "tuned": torch.zeros(L, 4, dtype=torch.float64)}
    final_sum = torch.zeros(4, dtype=torch.float64)
    n_tok = n_ce = 0
    real = borders.real_vocab_size if real_vocab_only else borders.vocab_size
    with torch.no_grad():
        for r in range(rows.shape[0]):
            ids = rows[r: r + 1]
            T = ids.shape[1]
            resid, logits = borders.residual_stream(ids)
            H = resid[:L, 0].float()
            final_lp = torch.log_softmax(logits[0].float(), dim=-1)
            final_top = final_lp[:, :real].argmax(-1)
            targets = torch.zeros(T, dtype=torch.long)
            targets[:-1] = ids[0, 1:]
            valid = torch.ones(T)
            valid[-1] = 0
            for kind, Hk in (("logit", H), ("tuned", lens.translate_all(H))):
                sums[kind] += _metrics(head, head.normed(Hk), final_lp, final_top, targets, valid, chunk_rows)
            fp = final_lp.exp()
            final_sum[1] += float((-final_lp[torch.arange(T - 1), targets[:-1]]).double().sum())
            final_sum[2] += float((-(fp * final_lp).nan_to_num().sum(-1)).double().sum())
            n_tok += T
            n_ce += T - 1

    def col(kind: str, j: int, denom: int, final_value: float) -> list[float]:
        return [float(x) / denom for x in sums[kind][:, j]] + [final_value]

    final_ce = float(final_sum[1]) / n_ce
    final_ent = float(final_sum[2]) / n_tok
    to_bpb = (n_ce / n_bytes / math.log(2)) if n_bytes else float("nan")

    def bpb(ce: list[float]) -> list[float]:
        return [x * to_bpb for x in ce]

    logit_ce, tuned_ce = col("logit", 1, n_ce, final_ce), col("tuned", 1, n_ce, final_ce)
    return LensEval(
        n_layers=L, tokens=n_tok, ce_tokens=n_ce, n_bytes=int(n_bytes),
        logit_kl=col("logit", 0, n_tok, 0.0), tuned_kl=col("tuned", 0, n_tok, 0.0),
        logit_ce=logit_ce, tuned_ce=tuned_ce, logit_bpb=bpb(logit_ce), tuned_bpb=bpb(tuned_ce),
        logit_entropy=col("logit", 2, n_tok, final_ent), tuned_entropy=col("tuned", 2, n_tok, final_ent),
        logit_top1=col("logit", 3, n_tok, 1.0), tuned_top1=col("tuned", 3, n_tok, 1.0),
    )


def text_bytes(tokenizer, rows: torch.Tensor) -> int:
    """UTF-8 bytes of the text the rows' positions 1..T-1 spell (special tokens skipped)."""
    total = 0
    for r in rows:
        total += len(tokenizer.decode(r[1:].tolist(), skip_special_tokens=True).encode("utf-8"))
    return total


__all__ = [
    "LensEval", "StepInfo", "TrainResult", "TrainSettings", "TunedLens", "evaluate", "load_checkpoint",
    "lens_from_checkpoint", "load_for_model", "load_tuned_lens_library", "model_identity", "regression_init", "save_checkpoint",
    "shipped_lens_path", "text_bytes", "train",
]
