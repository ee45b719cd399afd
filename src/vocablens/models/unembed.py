"""The unembedding: residual stream -> logits, as one object every analysis and op takes.

final norm -> project_out -> W_U (+ bias) -> logit scale -> softcap. :class:`Unembedding` holds those
pieces for any family (built by :meth:`Unembedding.from_borders`), the real-vocabulary mask and an
identity hash (what a tuned lens file must match). The scale and softcap go through
:func:`vocablens.logit_transform.transform_logits`, the one place that computes them; the chunked
paths of :mod:`vocablens.ops` take ``weight``, ``bias``, ``logit_scale`` and ``softcap`` from here.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vocablens.errors import BadInput
from vocablens.logit_transform import transform_logits
from vocablens.models.tensor_parallel import gathered_linear, is_dtensor


@dataclass(frozen=True, eq=False)
class Unembedding:
    """The LM head of one model and the path into it.

    Attributes:
        final_norm: the norm applied after the last block, or None (OPT-350m has none).
        project_out: OPT-style projection d_model -> d_emb after the final norm, or None.
        weight: W_U [V, d_emb], the model's own parameter (no copy; tied models share it with W_E).
        bias: b_U [V] or None.
        logit_scale: factor on the head output before the softcap (1.0 for most families).
        softcap: final-logit softcap c, or None.
        real_mask: bool [V], True for rows the tokenizer can produce (the rest are padding).
        d_model: width of the residual stream (differs from d_emb when project_out exists).
    """

    final_norm: nn.Module | None
    project_out: nn.Module | None
    weight: torch.Tensor
    bias: torch.Tensor | None
    logit_scale: float = 1.0
    softcap: float | None = None
    real_mask: torch.Tensor | None = None
    d_model: int | None = None
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_borders(cls, borders) -> "Unembedding":
        """The unembedding of a :class:`~vocablens.models.Borders` (shares its modules and weights)."""
        W_U, b_U = borders._head_tensors()
        return cls(final_norm=borders.final_norm, project_out=borders.project_out, weight=W_U,
                   bias=b_U, logit_scale=float(borders.logit_scale), softcap=borders.softcap,
                   real_mask=borders.real_token_mask(), d_model=int(borders.d_model))

    # ------------------------------------------------------------------ shapes
    @property
    def vocab_size(self) -> int:
        """V, rows of W_U (padding included)."""
        return int(self.weight.shape[0])

    @property
    def d_emb(self) -> int:
        """Width of W_U's rows (the head's input)."""
        return int(self.weight.shape[1])

    @property
    def device(self) -> torch.device:
        return self.weight.device

    # ------------------------------------------------------------------ the path
    def normed(self, resid: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Residual stream [..., d_model] -> head input [..., d_emb].

        Applies the final norm exactly once (when there is one) and ``project_out``, in the modules'
        own dtype (``dtype=None``: W_U's dtype, as the model computes it), on W_U's device (a model
        placed over several devices: where the last block's output goes). Differentiable.
        """
        h = resid.to(self.weight.device, dtype or self.weight.dtype)
        if self.final_norm is not None:
            h = self.final_norm(h)
        if self.project_out is not None:
            h = self.project_out(h)
        return h

    def transform(self, z: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
        """Raw head output [..., V] -> logits: softcap(logit_scale · z)."""
        return transform_logits(z, self.logit_scale, self.softcap, inplace=inplace)

    def logits(self, h: torch.Tensor, rows: torch.Tensor | list[int] | None = None, *,
               capped: bool = True) -> torch.Tensor:
        """Already-normed states [..., d_emb] -> float32 logits [..., V], or [..., len(rows)] for
        the given vocabulary rows only (the transform is elementwise, so a subset is exact).
        ``capped=False``: before the final-logit softcap (the logit scale still applied).

        Raises:
            BadInput: a row id outside [0, V).
        """
        W, b = self.weight, self.bias
        if rows is not None:
            r = torch.as_tensor(rows, dtype=torch.int64, device=W.device)
            if r.numel() and (int(r.min()) < 0 or int(r.max()) >= self.vocab_size):
                raise BadInput(f"vocabulary rows must lie in [0, {self.vocab_size}); got {r.tolist()[:8]}")
            W = W[r]
            b = None if b is None else b[r]
        if is_dtensor(W):  # tensor parallel: each rank's rows, the logits gathered (a probe's few rows)
            z = gathered_linear(h.to(W.dtype), W, b).float()
        else:
            z = nn.functional.linear(h.to(W.dtype), W, b).float()
        cap = self.softcap if capped else None
        return transform_logits(z, self.logit_scale, cap, inplace=not z.requires_grad)  # autograd needs the cap's output intact

    def __call__(self, resid: torch.Tensor, rows: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """Residual stream [..., d_model] -> float32 logits [..., V]: the model's own output at layer L."""
        return self.logits(self.normed(resid), rows)

    def readout(self, fold_norm_gain: bool = True, *, scaled: bool = False,
                rows: torch.Tensor | list[int] | slice | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The matrix that reads a direction of the stream in vocabulary space, [V, d] (or [R, d]).

        ``rows``: vocabulary ids (gathered), or a ``slice`` (a contiguous block of rows read as a view,
        so streaming the readout block by block never holds more than one block): the same float32
        operations per row as the whole matrix, hence the same rows bit for bit (with ``project_out``,
        a GEMM per block, equal up to the GEMM's rounding).

        Without ``project_out`` this is W_U, with the final norm's elementwise gain g folded in when
        ``fold_norm_gain`` (row v becomes W_U[v] ⊙ g, so ``readout() @ u`` = W_U (g ⊙ u): the
        direct effect of u up to the norm's per-position scale; Geva et al. 2022, §2; Dar et al. 2022,
        §3). With ``project_out`` (d_emb != d_model) it is W_U · P, so its width is d_model. With
        ``scaled`` the rows are also multiplied by ``logit_scale`` (the softcap, being nonlinear, is
        never folded in).
        """
        from vocablens.models.blocks.norms import norm_gain
        from vocablens.models.blocks.view import linear_weight

        W = self.weight.detach()
        if isinstance(rows, slice):
            W = W[rows]  # a view of the block, no gather
        elif rows is not None:
            W = W[torch.as_tensor(rows, dtype=torch.int64, device=W.device)]
        W = W.to(dtype)
        if self.project_out is not None:
            W = W @ linear_weight(self.project_out).detach().to(W.device, dtype)
        if scaled and self.logit_scale != 1.0:
            W = W * self.logit_scale
        if fold_norm_gain and self.final_norm is not None:
            gain, _, _ = norm_gain(self.final_norm, int(W.shape[1]))
            W = W * gain.to(W.device, dtype)
        return W

    def direction(self, v: torch.Tensor, fold_norm_gain: bool = True, *, scaled: bool = False) -> torch.Tensor:
        """Directions of the stream [..., d_model] -> head-input directions u [..., d_emb] float32 with
        ``readout(fold_norm_gain, scaled=scaled) @ v == W_U @ u`` (up to float32 rounding):
        u = logit_scale · P_out (g ⊙ v). [..., d] work, never the [V, d] readout."""
        from vocablens.models.blocks.norms import norm_gain
        from vocablens.models.blocks.view import linear_weight

        u = v.detach().to(self.device, torch.float32)
        if fold_norm_gain and self.final_norm is not None:
            gain, _, _ = norm_gain(self.final_norm, int(u.shape[-1]))
            u = u * gain.to(u.device, torch.float32)
        if self.project_out is not None:
            u = u @ linear_weight(self.project_out).detach().to(u.device, torch.float32).T
        if scaled and self.logit_scale != 1.0:
            u = u * self.logit_scale
        return u

    def scores(self, v: torch.Tensor, fold_norm_gain: bool = True, *, scaled: bool = False,
               rows: slice | torch.Tensor | list[int] | None = None, block_rows: int = 16384) -> torch.Tensor:
        """What directions of the stream write on each vocabulary row: ``readout(...) @ v``, streamed.

        Args:
            v: [d_model] or [M, d_model] directions (value vectors, neuron outputs, differences).
            fold_norm_gain: as :meth:`readout`.
            scaled: as :meth:`readout`.
            rows: a slice of rows (e.g. ``slice(0, real)``), vocabulary ids, or None (all V).
            block_rows: rows of W_U read (in float32) at a time.

        Returns:
            float32 [R] (or [M, R]) scores, R the rows asked for. Memory: one [block_rows, d_emb]
            float32 block and the result; neither the [V, d] readout nor anything [N, V] beyond it.
        """
        u = self.direction(v, fold_norm_gain, scaled=scaled)
        one = u.dim() == 1
        U2 = u[None] if one else u.reshape(-1, u.shape[-1])
        W = self.weight.detach()
        if rows is not None and not isinstance(rows, slice):
            W = W[torch.as_tensor(rows, dtype=torch.int64, device=W.device)]
        elif isinstance(rows, slice):
            W = W[rows]
        out = torch.empty(U2.shape[0], W.shape[0], dtype=torch.float32, device=W.device)
        for a in range(0, W.shape[0], block_rows):
            torch.mm(U2, W[a:a + block_rows].float().T, out=out[:, a:a + block_rows])
        return out[0] if one else out.reshape(*u.shape[:-1], W.shape[0])

    def readout_rows(self, rows: slice | torch.Tensor | list[int], fold_norm_gain: bool = True, *,
                     scaled: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Chosen rows of :meth:`readout` [R, d] (a slice: a view of W_U's block; ids: gathered), for
        callers that fit or average rows (alignment, concept directions, streamed blocks). Use
        :meth:`scores` to read a direction against the vocabulary.

        Raises:
            BadInput: ``rows`` is None (the whole [V, d] readout is not handed out here).
        """
        if rows is None:
            raise BadInput("readout_rows needs rows (a slice or ids); read directions with Unembedding.scores")
        return self.readout(fold_norm_gain, scaled=scaled, rows=rows, dtype=dtype)

    def constant(self, rows: torch.Tensor | list[int], norm_bias: torch.Tensor | None = None) -> torch.Tensor:
        """What the head adds to the pre-softcap logits of ``rows`` whatever the stream: float32 [R],
        ``logit_scale · (W_U[rows] (P β + b_P) + b_U[rows])``, with β [d_model] the final norm's bias when
        the norm is written as an affine map ``n(x) = linear part + β`` (e.g.
        :class:`~vocablens.models.blocks.NormLinearization`; None: no norm bias) and P, b_P
        ``project_out``'s weight and bias. Then ``logits(rows, capped=False) == readout_rows(rows,
        False, scaled=True) @ (linear part of n at x) + constant(rows, β)`` (direct logit attribution).

        Raises:
            BadInput: a row id outside [0, V).
        """
        from vocablens.models.blocks import linear_bias, linear_weight

        r = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        if r.numel() and (int(r.min()) < 0 or int(r.max()) >= self.vocab_size):
            raise BadInput(f"vocabulary rows must lie in [0, {self.vocab_size}); got {r.tolist()[:8]}")
        W = self.weight.detach()[r].float()  # [R, d_emb]
        u = torch.zeros(self.d_emb, dtype=torch.float32, device=self.device)  # P β + b_P, the head's input
        if norm_bias is not None:
            beta = norm_bias.detach().to(self.device, torch.float32)
            u = u + (beta if self.project_out is None
                     else beta @ linear_weight(self.project_out).detach().to(self.device, torch.float32).T)
        if self.project_out is not None and linear_bias(self.project_out) is not None:
            u = u + linear_bias(self.project_out).detach().to(self.device, torch.float32)
        z = W @ u
        if self.bias is not None:
            z = z + self.bias.detach()[r].float()
        return z * self.logit_scale

    def float32(self) -> "Unembedding":
        """A copy whose final norm and project_out run in float32 (the weight is shared as is); the
        object itself when they already are float32."""
        def f32(mod):
            if mod is None or all(p.dtype == torch.float32 for p in mod.parameters()):
                return mod
            return copy.deepcopy(mod).float()

        norm, proj = f32(self.final_norm), f32(self.project_out)
        if norm is self.final_norm and proj is self.project_out:
            return self
        return Unembedding(final_norm=norm, project_out=proj, weight=self.weight, bias=self.bias,
                           logit_scale=self.logit_scale, softcap=self.softcap, real_mask=self.real_mask,
                           d_model=self.d_model)

    def head_kwargs(self) -> dict[str, Any]:
        """``bias``, ``logit_scale`` and ``softcap`` as keyword arguments of the chunked ops
        (:func:`vocablens.ops.token_logprobs`, :func:`vocablens.ops.linear_cross_entropy` ...), which
        take ``weight`` positionally: ``token_logprobs(U.normed(resid), U.weight, t, **U.head_kwargs())``."""
        return {"bias": None if self.bias is None else self.bias.detach(), "logit_scale": self.logit_scale,
                "softcap": self.softcap}

    # ------------------------------------------------------------------ identity
    def identity_hash(self) -> str:
        """SHA-256 (hex) of the decoding path: W_U, b_U, the final norm's and project_out's
        parameters, each rounded to bfloat16 first (so float32 and bfloat16 loads agree). A tuned
        lens file records it and refuses another head."""
        if "sha" not in self._memo:
            h = hashlib.sha256()
            tensors: list[tuple[str, torch.Tensor]] = [("W_U", self.weight)]
            if self.bias is not None:
                tensors.append(("b_U", self.bias))
            for prefix, mod in (("final_norm", self.final_norm), ("project_out", self.project_out)):
                if mod is not None:
                    tensors += [(f"{prefix}.{n}", p) for n, p in sorted(mod.named_parameters())]
            from vocablens.models.tensor_parallel import whole

            for n, t in tensors:
                t = whole(t)  # a tensor-parallel head: the whole matrix (every rank hashes it together)
                h.update(n.encode())
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
            self._memo["sha"] = h.hexdigest()
        return self._memo["sha"]

    def describe(self) -> dict[str, Any]:
        """Plain-data summary (for JSON)."""
        return {"vocab_size": self.vocab_size, "d_emb": self.d_emb, "d_model": self.d_model,
                "final_norm": type(self.final_norm).__name__ if self.final_norm is not None else None,
                "project_out": self.project_out is not None, "bias": self.bias is not None,
                "logit_scale": self.logit_scale, "softcap": self.softcap}


__all__ = ["Unembedding"]
