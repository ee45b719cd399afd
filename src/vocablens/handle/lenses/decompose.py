"""``m.decompose``: a stream vector written as a few nonnegative Jacobian-lens token directions
(:mod:`vocablens.lens.decompose`; ``vocablens lens decompose``)."""

from __future__ import annotations

from vocablens.errors import BadInput
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsDecomposition


class LensDecomposition:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsDecomposition`)."""

    def decompose(self: NeedsDecomposition, text, layer: int, position: int = -1, k: int = 10,
                  lens=None) -> R.Decomposition:
        """The residual stream of ``text`` at ``layer`` and ``position`` as at most ``k`` nonnegative
        Jacobian-lens token directions (nonnegative OMP + NNLS; :func:`vocablens.lens.decompose.decompose`),
        with the residual and the fraction of its squared norm explained.

        Args:
            text: a prompt, or ids [T] / [1, T]. layer: a stream layer the Jacobian lens has a matrix for.
            position: the position read (negative from the end). k: tokens at most.
            lens: a Jacobian lens folder or file (``--lens``), a lens already read, or None (this model's).

        Raises:
            BadInput: a position or layer out of range, no matrix at that layer, k < 1, no Jacobian lens.
        """
        import torch

        from vocablens.lens.decompose import decompose

        jl = self.translator("jacobian", lens)
        ids = self.encode(text)[0] if isinstance(text, str) else torch.as_tensor(text, dtype=torch.int64).reshape(-1)
        T, L = int(ids.numel()), self.borders.n_layers
        if not -T <= position < T:
            raise BadInput(f"`position` {position} is outside the prompt's {T} tokens")
        if not 0 <= layer < L:
            raise BadInput(f"`layer` must be a stream layer 0..{L - 1} (layer {L} is the output itself); got {layer}")
        with torch.no_grad():
            resid, _ = self.borders.residual_stream(ids[None].to(self.borders.device))
        h = resid[layer, 0, position % T]
        res = decompose(self.borders, jl, layer, h, k)
        from vocablens.render.lens import lens_record

        return self._result(R.Decomposition, res, position=position % T, ids=ids.tolist(),
                            lens=lens_record("jacobian", jl))


__all__ = ["LensDecomposition"]
