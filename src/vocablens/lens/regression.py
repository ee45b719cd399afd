"""A least-squares start for the tuned lens's translators (``vocablens lens train --init regression``)."""

from __future__ import annotations

import torch

from vocablens.errors import BadInput
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders
from vocablens.ops.kl_train import linear_kl


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
    f64 = {"dtype": torch.float64, "device": borders.read_device}
    XtX = torch.zeros(L, d + 1, d + 1, **f64)
    XtY = torch.zeros(L, d + 1, d, **f64)
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
        eye = torch.eye(d + 1, **f64)
        # symmetric positive definite: Cholesky per layer (batched LU fails in some MKL builds)
        coef = torch.stack([torch.cholesky_solve(XtY[i], torch.linalg.cholesky(XtX[i] + lam[i] * eye))
                            for i in range(L)])  # [L, d+1, d]
        A = coef[:, :d].transpose(1, 2) - torch.eye(d, **f64)
        bvec = coef[:, d]
        calib = rows[-1:] if calib is None else calib
        U = borders.unembedding.float32()
        W = U.weight.detach().float()
        kls = torch.zeros(len(alphas), L, **f64)
        for r in range(calib.shape[0]):
            resid, logits = borders.residual_stream(calib[r: r + 1])
            H = resid[:L, 0].float()
            for j, a in enumerate(alphas):
                Ht = H + a * (torch.einsum("lij,ltj->lti", A.float(), H) + bvec.float()[:, None, :])
                kls[j] += linear_kl(U.normed(Ht, torch.float32), W, logits[0], **U.head_kwargs(),
                                    want_grad=False, chunk_rows=chunk_rows).loss
        chosen = [float(alphas[j]) for j in kls.argmin(0).tolist()]  # one host transfer
        alpha = torch.tensor(chosen, **f64)
        lens.weight.copy_((alpha[:, None, None] * A).float())
        lens.bias.copy_((alpha[:, None] * bvec).float())
    return lens, chosen


__all__ = ["regression_init"]
