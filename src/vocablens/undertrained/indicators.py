"""Under-training indicators read off the two matrices (Land & Bartolo 2024, §3.2).

* ``unembedding_cosine``: remove the unembedding's first principal component (a direction nearly
  every row shares, which hides the rest), then the cosine distance of each row to the mean row of a
  reference set of known-unused tokens. Rows training never reached received only the softmax's
  "push down" gradient, the same for all of them, so they sit together: a small distance marks one.
* ``embedding_norm``: the input embedding's L2 norm (untied models only). An input row gets a
  gradient only when its token occurs; a never-seen row keeps its initial norm or decays.

Low values mark candidates for both. The paper picks per model; :func:`choose_indicator` does what
its public code does by default: the input norm when the model is untied, the unembedding cosine
distance when it is tied (the input side is then the same matrix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput

INDICATORS = ("unembedding_cosine", "embedding_norm")
#: rows of the matrix per GEMM block in the Gram matrix and the distances (float32 temporaries)
_BLOCK = 8192


def first_principal_component(W: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first principal component of the rows of ``W`` [V, d] (any float dtype).

    The centred Gram matrix C = Σ (w_i - μ)(w_i - μ)ᵀ [d, d] is accumulated block by block in
    float32 (2·V·d² FLOPs; the blocks are centred first, so no large cancellation) and its top
    eigenvector taken in float64 (``torch.linalg.eigh`` on [d, d]): O(V·d²) time and O(d²) extra
    memory, never an SVD of [V, d].

    Args:
        W: [V, d]. rows: optional bool [V], the rows that take part (default: all).

    Returns:
        ``(pc, mean)``: unit vector [d] float32 (sign fixed: largest |entry| positive) and the mean
        row μ [d] float32.
    """
    V, d = W.shape
    idx = None if rows is None else rows.nonzero().flatten()
    n = V if idx is None else int(idx.numel())
    if n < 2:
        raise BadInput("the principal component needs at least 2 rows")

    def block(a: int) -> torch.Tensor:
        sel = slice(a, min(a + _BLOCK, n))
        return (W[sel] if idx is None else W[idx[sel]]).float()

    mean = torch.zeros(d, dtype=torch.float64)
    for a in range(0, n, _BLOCK):
        mean += block(a).double().sum(0)
    mean = (mean / n).float()
    C = torch.zeros(d, d, dtype=torch.float64)
    for a in range(0, n, _BLOCK):
        X = block(a) - mean
        C += (X.T @ X).double()
    _, vecs = torch.linalg.eigh(C)
    pc = vecs[:, -1]
    pc = pc * torch.sign(pc[pc.abs().argmax()])
    return pc.float(), mean


def cosine_to_reference(W: torch.Tensor, reference: torch.Tensor, pc: torch.Tensor | None = None) -> torch.Tensor:
    """Cosine distance 1 - cos(w_i', m') of every row to the reference set's mean row.

    Args:
        W: [V, d]. reference: int64 [k] row ids (k >= 1). pc: unit [d]; when given, each row's
            component along it is removed first (w' = w - (w·pc) pc), as is the mean's.

    Returns:
        float32 [V] in [0, 2]; a zero row (no direction) gets distance 1.
    """
    V = W.shape[0]
    ref = W[reference].float()
    if pc is not None:
        ref = ref - (ref @ pc)[:, None] * pc
    m = ref.mean(0)
    m = m / m.norm().clamp_min(1e-30)
    out = torch.empty(V, dtype=torch.float32)
    for a in range(0, V, _BLOCK):
        X = W[a:a + _BLOCK].float()
        if pc is not None:
            X = X - (X @ pc)[:, None] * pc
        out[a:a + _BLOCK] = 1.0 - (X @ m) / X.norm(dim=1).clamp_min(1e-30)
    return out


def embedding_norm(W_E: torch.Tensor) -> torch.Tensor:
    """L2 norm of every input-embedding row, float32 [V] (float32 accumulation, block by block)."""
    return torch.cat([W_E[a:a + _BLOCK].float().norm(dim=1) for a in range(0, W_E.shape[0], _BLOCK)])


def choose_indicator(tied: bool, requested: str = "auto") -> tuple[str, str]:
    """``(indicator, why)``: the indicator used, and one sentence saying why.

    Raises:
        BadInput: ``requested`` not ``auto`` or one of :data:`INDICATORS`; ``embedding_norm`` asked
            for on a tied model (its input rows are the head's rows and do get gradient).
    """
    if requested not in ("auto", *INDICATORS):
        raise BadInput(f"indicator must be auto, {' or '.join(INDICATORS)}; got {requested!r}")
    if requested == "embedding_norm" and tied:
        raise BadInput("indicator embedding_norm needs an untied model: a tied model's input rows are its head's "
                       "rows, which every softmax step updates")
    if requested != "auto":
        return requested, "asked for"
    if tied:
        return "unembedding_cosine", ("tied embeddings: the input rows are the head's rows, so their norm says "
                                      "little; the head's rows with the first principal component removed, "
                                      "by cosine distance to the known-unused mean (the paper's choice)")
    return "embedding_norm", ("untied embeddings: an input row gets gradient only when its token occurs, so a "
                              "never-seen row keeps a small norm (the paper's default for untied models)")


@dataclass(frozen=True, eq=False)
class Indicators:
    """Indicator values for every row.

    Attributes:
        values: float32 [V], the indicator used (low = candidate).
        name: one of :data:`INDICATORS`. why: why it was chosen.
        unembedding_cosine: float32 [V]. embedding_norm: float32 [V], or None for tied models.
        reference: int64 [k], the rows whose mean is the reference. reference_kind: what they are.
        pc_seconds: wall time of the whole indicator step (seconds).
    """

    values: torch.Tensor
    name: str
    why: str
    unembedding_cosine: torch.Tensor
    embedding_norm: torch.Tensor | None
    reference: torch.Tensor
    reference_kind: str
    seconds: float


def fallback_reference(W: torch.Tensor, pc: torch.Tensor, usable: torch.Tensor, fraction: float = 0.001,
                       minimum: int = 16) -> torch.Tensor:
    """The stand-in reference when a vocabulary has no unreachable, reserved or padding rows: the
    ``fraction`` of usable rows (at least ``minimum``) with the smallest norm once the first principal
    component is removed — rows training barely moved from a small initialisation. Int64 [k]."""
    idx = usable.nonzero().flatten()
    X = W[idx].float()
    norms = (X - (X @ pc)[:, None] * pc).norm(dim=1)
    k = max(minimum, int(round(fraction * idx.numel())))
    k = min(k, int(idx.numel()))
    return idx[torch.topk(norms, k, largest=False).indices].sort().values


__all__ = ["INDICATORS", "Indicators", "first_principal_component", "cosine_to_reference", "embedding_norm",
           "choose_indicator", "fallback_reference"]
