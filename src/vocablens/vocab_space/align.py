"""Align the parameters of two models through a shared vocabulary, with no forward pass.

Dar et al. (2022), "Analyzing Transformers in Embedding Space", §5: once parameters are read in
vocabulary space they live in a space that does not depend on the model, so the units of two models
that share a tokenizer can be compared and matched directly.

* FFN value vectors (``what="ffn"``): value vector v of model A is read as the scores p_a = R_A v
  over the shared tokens (R_A: the readout of :meth:`~vocablens.models.unembed.Unembedding.readout`,
  final-norm gain folded in). Two vectors are compared by the Pearson correlation of their scores
  over the shared vocabulary. With R_c the readout centred over tokens, that correlation is
  ``v_a C v_b / sqrt(v_a G_A v_a · v_b G_B v_b)`` with C = R_Acᵀ R_Bc [d_A, d_B] and G = R_cᵀ R_c, so
  no [n, V] score matrix is ever formed: each layer pair costs one [n_A, d] x [d, n_B] product.
* Attention heads (``what="heads"``): head h's OV circuit read in vocabulary space is
  X_h = E_c W_V W_O R_cᵀ [S, S] (E: input embedding as it enters the stream). Two heads are compared
  by the cosine of those token-centred matrices, tr(X_aᵀ X_b) / (|X_a| |X_b|), computed from the
  factors and the [d, d] cross-Gram matrices of E and R (again no [S, S] matrix).

For every layer of A the layer-to-layer map gives each layer of B the mean, over A's units, of their
best correlation there; the best layer is then matched one-to-one with the Hungarian algorithm
(``scipy.optimize.linear_sum_assignment``, maximizing total correlation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from vocablens.errors import BadInput



@dataclass(frozen=True)
class SharedVocabulary:
    """Rows of the two vocabularies that hold the same token string.

    Attributes:
        ids_a, ids_b: [S] int64, row ids in model A and model B (same order, same token).
        identical: both tokenizers map every real token to the same id.
    """

    ids_a: torch.Tensor
    ids_b: torch.Tensor
    identical: bool

    @property
    def size(self) -> int:
        return int(self.ids_a.numel())


@dataclass(frozen=True)
class LayerMatch:
    """One layer of model A matched one-to-one into its most similar layer of model B.

    Attributes:
        block_a, block_b: block indices (0-based).
        partner: [n_A] int64, the unit of ``block_b`` matched to each unit of ``block_a`` (-1: none,
            when B's layer has fewer units).
        corr: [n_A] float32, the correlation of each matched pair (NaN for unmatched units).
    """

    block_a: int
    block_b: int
    partner: torch.Tensor
    corr: torch.Tensor

    @property
    def mean_corr(self) -> float:
        c = self.corr[~torch.isnan(self.corr)]
        return float(c.mean()) if c.numel() else float("nan")


@dataclass(frozen=True)
class Alignment:
    """Result of :func:`align_models`.

    Attributes:
        what: ``"ffn"`` (units are FFN neurons) or ``"heads"`` (units are attention heads).
        blocks_a, blocks_b: the block indices compared.
        block_similarity: [len(blocks_a), len(blocks_b)] float32: mean over A's units of their best
            correlation in B's layer.
        matches: one :class:`LayerMatch` per layer of A, into its most similar layer of B.
        shared: the shared vocabulary used.
    """

    what: str
    blocks_a: list[int]
    blocks_b: list[int]
    block_similarity: torch.Tensor
    matches: list[LayerMatch]
    shared: SharedVocabulary


def shared_vocabulary(tokenizer_a, tokenizer_b, real_a: int, real_b: int, min_shared: int = 2
                      ) -> SharedVocabulary:
    """Pair the rows of two vocabularies by token string (``get_vocab()``), real rows only.

    Args:
        real_a: rows of A's matrix that are real tokens (rows at or beyond are padding).
        real_b: the same for B.
        min_shared: fewest tokens in common that make the readouts comparable (:func:`align_models`
            asks for more than the wider model's d, so that its readout has full rank).

    Raises:
        BadInput: fewer than ``min_shared`` tokens in common.
    """
    va = {t: i for t, i in tokenizer_a.get_vocab().items() if i < real_a}
    vb = {t: i for t, i in tokenizer_b.get_vocab().items() if i < real_b}
    common = sorted(set(va) & set(vb), key=lambda t: va[t])
    if len(common) < min_shared:
        raise BadInput(f"the two models share {len(common)} token strings (need at least {min_shared}): "
                       "their parameters cannot be compared through the vocabulary")
    ids_a = torch.tensor([va[t] for t in common], dtype=torch.int64)  # cpu: row indices
    ids_b = torch.tensor([vb[t] for t in common], dtype=torch.int64)  # cpu: row indices
    identical = len(common) == len(va) == len(vb) and bool(torch.equal(ids_a, ids_b))
    return SharedVocabulary(ids_a=ids_a, ids_b=ids_b, identical=identical)


#: shared tokens whose readout (or embedding) rows are read at a time when the Grams are summed
ROW_BLOCK = 4096


def _centred_grams(rows_a: Callable[[torch.Tensor], torch.Tensor], rows_b: Callable[[torch.Tensor], torch.Tensor],
                   shared: "SharedVocabulary", block: int | None = None,
                   progress: Callable[[int, int], None] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 Grams of two token-centred row sets read block by block over the S shared tokens:
    with X = rows_a(ids_a) [S, d_A], Y = rows_b(ids_b) [S, d_B] and X_c, Y_c centred over tokens,
    ``(X_cᵀ Y_c [d_A, d_B], X_cᵀ X_c, Y_cᵀ Y_c)``. Two passes (the means, then the centred blocks), so
    neither [S, d] matrix is ever whole (S is about V: the readout of the shared vocabulary).
    ``progress(done, 2 S)`` after each block of either pass."""
    S, block = shared.size, int(block or ROW_BLOCK)
    spans = [(a, min(S, a + block)) for a in range(0, S, block)]
    tell = progress or (lambda *_: None)
    mean_a = mean_b = 0
    for a, b in spans:
        mean_a = mean_a + rows_a(shared.ids_a[a:b]).double().sum(0)
        mean_b = mean_b + rows_b(shared.ids_b[a:b]).double().sum(0)
        tell(b, 2 * S)
    mean_a, mean_b = mean_a / S, mean_b / S
    C = torch.zeros(mean_a.numel(), mean_b.numel(), dtype=torch.float64, device=mean_a.device)
    Ga = torch.zeros(mean_a.numel(), mean_a.numel(), dtype=torch.float64, device=mean_a.device)
    Gb = torch.zeros(mean_b.numel(), mean_b.numel(), dtype=torch.float64, device=mean_b.device)
    for a, b in spans:
        X = rows_a(shared.ids_a[a:b]).double() - mean_a
        Y = rows_b(shared.ids_b[a:b]).double().to(X.device) - mean_b.to(X.device)
        C.addmm_(X.t(), Y)
        Ga.addmm_(X.t(), X)
        Gb.addmm_(Y.t(), Y)
        tell(S + b, 2 * S)
    return C, Ga, Gb


def _input_embedding(borders, rows: torch.Tensor) -> torch.Tensor:
    """Embedding rows as they enter the stream (input scale, input norm, project_in) [S, d_model] float64."""
    return borders.input_embedding.rows(rows, torch.float64)


def _units(borders, what: str, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]] | torch.Tensor:
    from vocablens.models.blocks import block_view

    view = block_view(borders, layer)
    if what == "ffn":
        return view.W_out.detach().double()  # [d_ff, d]
    return [tuple(f.detach().double() for f in view.W_OV(h)) for h in range(view.n_heads)]


def _ffn_sides(Va: torch.Tensor, Vb: torch.Tensor, C: torch.Tensor, Ga: torch.Tensor, Gb: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 factors (A' [n_A, d_B], B' [n_B, d_B]) with A' B'ᵀ = the Pearson correlations [n_A, n_B] of
    value vectors' vocabulary scores, v_a C v_b / sqrt(v_a G_A v_a · v_b G_B v_b) (module docstring)."""
    na = torch.einsum("id,de,ie->i", Va, Ga, Va).clamp_min(1e-300).sqrt()
    nb = torch.einsum("id,de,ie->i", Vb, Gb, Vb).clamp_min(1e-300).sqrt()
    return ((Va @ C) / na[:, None]).float(), (Vb / nb[:, None]).float()


def _head_sides(H: list[tuple[torch.Tensor, torch.Tensor]], left: torch.Tensor, right: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack a layer's OV factors: (W_Vᵀ · left) [H·k, d'] and (right · W_Oᵀ) [d', H·k] for the traces below."""
    X = torch.cat([v.t() @ left for v, _ in H])          # [H·k, d']
    Y = torch.cat([right @ o.t() for _, o in H], dim=1)  # [d', H·k]
    return X, Y


def _block_traces(M: torch.Tensor, N: torch.Tensor, ka: int, kb: int) -> torch.Tensor:
    """[H_A, H_B] of tr(M_ab N_ba) for the k_a x k_b blocks of M [H_A·k_a, H_B·k_b] and N [H_B·k_b, H_A·k_a]."""
    P = M * N.t()
    Ha, Hb = M.shape[0] // ka, M.shape[1] // kb
    return P.reshape(Ha, ka, Hb, kb).sum(dim=(1, 3))


def _head_corr(Ha, Hb, KE, KR, EAA, RAA, EBB, RBB) -> torch.Tensor:
    """Cosines [H_A, H_B] of token-centred vocabulary-space OV matrices X = E_c W_V W_O R_cᵀ.

    tr(X_aᵀ X_b) = tr((W_Vaᵀ K_E W_Vb)(W_Ob K_Rᵀ W_Oaᵀ)) with K_E = E_Acᵀ E_Bc, K_R = R_Acᵀ R_Bc, all
    heads of a layer pair in two GEMMs.
    """
    ka, kb = Ha[0][0].shape[1], Hb[0][0].shape[1]
    XA, YA = _head_sides(Ha, KE, KR.t())                   # [H_A k, d_B], [d_B, H_A k]
    VB = torch.cat([v for v, _ in Hb], dim=1)              # [d_B, H_B k]
    OB = torch.cat([o for _, o in Hb])                     # [H_B k, d_B]
    cross = _block_traces(XA @ VB, OB @ YA, ka, kb)
    XAs, YAs = _head_sides(Ha, EAA, RAA)
    VA, OA = torch.cat([v for v, _ in Ha], dim=1), torch.cat([o for _, o in Ha])
    na = _block_traces(XAs @ VA, OA @ YAs, ka, ka).diagonal()
    XBs, YBs = _head_sides(Hb, EBB, RBB)
    nb = _block_traces(XBs @ VB, OB @ YBs, kb, kb).diagonal()
    return cross / (na.clamp_min(1e-300)[:, None] * nb.clamp_min(1e-300)[None, :]).sqrt()


def _hungarian(corr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from scipy.optimize import linear_sum_assignment

    c = corr.double().cpu().numpy()  # cpu: scipy's Hungarian solver runs on the host
    rows, cols = linear_sum_assignment(c, maximize=True)
    partner = np.full(corr.shape[0], -1, dtype=np.int64)
    got = np.full(corr.shape[0], np.nan, dtype=np.float32)
    partner[rows] = cols
    got[rows] = c[rows, cols]
    return torch.from_numpy(partner).to(corr.device), torch.from_numpy(got).to(corr.device)


def _check_layers(layers: Sequence[int] | None, L: int, which: str) -> list[int]:
    if layers is None:
        return list(range(L))
    out = [int(x) for x in layers]
    bad = [x for x in out if not 0 <= x < L]
    if bad or not out:
        raise BadInput(f"blocks of model {which} must lie in 0..{L - 1}; got {list(layers)}")
    return out


def _shared_grams(borders_a, borders_b, shared, what: str, fold_norm_gain: bool, say) -> tuple:
    """``(C, Ga, Gb, KE, EAA, EBB)``: the centred Gram matrices of the shared tokens' readout rows
    (:func:`_centred_grams`), and for ``heads`` those of their input embeddings (else None), streamed
    block by block (never the [S, d] readout)."""
    say("readout Grams", 0, 2 * shared.size)
    C, Ga, Gb = _centred_grams(lambda r: borders_a.unembedding.readout_rows(r, fold_norm_gain),
                               lambda r: borders_b.unembedding.readout_rows(r, fold_norm_gain), shared,
                               progress=lambda a, b: say("readout Grams", a, b))
    KE = EAA = EBB = None
    if what == "heads":
        say("embedding Grams", 0, 2 * shared.size)
        KE, EAA, EBB = _centred_grams(lambda r: _input_embedding(borders_a, r),
                                      lambda r: _input_embedding(borders_b, r), shared,
                                      progress=lambda a, b: say("embedding Grams", a, b))
    return C, Ga, Gb, KE, EAA, EBB


def _block_corrs(ua, what: str, lb: Sequence[int], units_b: dict, sides_b: dict, grams: tuple) -> dict:
    """Correlations [n_A, n_B] of one block's units ``ua`` of A with the units of each block ``m`` of
    B in ``lb`` (``units_b[m]``); B's FFN sides are computed once and kept in ``sides_b``."""
    C, Ga, Gb, KE, EAA, EBB = grams
    corrs = {}
    for j, m in enumerate(lb):
        if what == "ffn":
            if m not in sides_b:
                _, sides_b[m] = _ffn_sides(units_b[m][:1], units_b[m], C, Ga, Gb)
            if j == 0:
                side_a, _ = _ffn_sides(ua, units_b[m][:1], C, Ga, Gb)
            corrs[m] = side_a @ sides_b[m].t()
        else:
            corrs[m] = _head_corr(ua, units_b[m], KE, C, EAA, Ga, EBB, Gb).float()
    return corrs


def align_models(borders_a, tokenizer_a, borders_b, tokenizer_b, what: str = "ffn",
                 blocks_a: Sequence[int] | None = None, blocks_b: Sequence[int] | None = None,
                 fold_norm_gain: bool = True, progress: Callable[[str, int, int], None] | None = None) -> Alignment:
    """Match the FFN neurons (or attention heads) of model A to those of model B through the vocabulary.

    Args:
        borders_a: :class:`~vocablens.models.Borders` of model A (dense blocks).
        tokenizer_a: A's tokenizer (the shared vocabulary is found by token string).
        borders_b: the same for model B.
        tokenizer_b: B's tokenizer.
        what: ``"ffn"`` (value vectors, rows of W_out [d_ff, d]) or ``"heads"`` (OV circuits).
        blocks_a: block indices of A to compare (default: all).
        blocks_b: the same for B.
        fold_norm_gain: read through the final norm's gain (Geva et al. 2022, §2).
        progress: ``progress(stage, done, total)``: stage ``readout Grams`` (rows read, two passes
            over the S shared tokens: 2 S; ``embedding Grams`` too for heads), then ``blocks`` after
            each block of A.

    Returns:
        :class:`Alignment`: the [|A|, |B|] layer map of mean best correlations, and for each layer of
        A a one-to-one matching (Hungarian) into its most similar layer of B. Correlations are
        dimensionless in [-1, 1]; everything is computed in float64 from the [d, d] Gram matrices
        (cost O(L_A · L_B · n_A · n_B · d) FLOPs, memory O(ROW_BLOCK · d + d² + n_A · n_B): the shared
        tokens' readout rows are read block by block).

    Raises:
        BadInput: ``what`` not ffn|heads, a block out of range, or no shared vocabulary.
        UnsupportedArchitecture: a block without a dense MLP (mixture of experts).
    """
    if what not in ("ffn", "heads"):
        raise BadInput(f"`what` must be ffn or heads; got {what!r}")
    la = _check_layers(blocks_a, borders_a.n_layers, "A")
    lb = _check_layers(blocks_b, borders_b.n_layers, "B")
    shared = shared_vocabulary(tokenizer_a, tokenizer_b, borders_a.real_vocab_size, borders_b.real_vocab_size,
                               min_shared=max(borders_a.d_model, borders_b.d_model) + 1)
    say = progress or (lambda *_: None)
    with torch.no_grad():
        grams = _shared_grams(borders_a, borders_b, shared, what, fold_norm_gain, say)
        say("blocks", 0, len(la))
        units_b = {m: _units(borders_b, what, m) for m in lb}
        sides_b = {}
        sim = torch.empty(len(la), len(lb), dtype=torch.float32, device=borders_a.device)
        matches: list[LayerMatch] = []
        for i, l in enumerate(la):
            corrs = _block_corrs(_units(borders_a, what, l), what, lb, units_b, sides_b, grams)
            for j, m in enumerate(lb):
                sim[i, j] = corrs[m].max(1).values.mean()  # stays on the device: one sync per layer of A, below
            best = lb[int(sim[i].argmax())]
            partner, got = _hungarian(corrs[best])
            matches.append(LayerMatch(block_a=l, block_b=best, partner=partner, corr=got))
            del corrs
            say("blocks", i + 1, len(la))
    return Alignment(what=what, blocks_a=la, blocks_b=lb, block_similarity=sim, matches=matches, shared=shared)


def unit_top_tokens(borders, what: str, layer: int, unit: int, k: int = 5, fold_norm_gain: bool = True
                    ) -> list[int]:
    """The ``k`` real tokens a unit writes most: for a value vector, the top of its scores R v; for a
    head, the top of R u with u the output side of the largest singular direction of W_V W_O (its
    sign chosen so that the largest score is positive).

    Returns:
        Token ids [k], highest score first.
    """
    from vocablens.models.blocks import block_view

    real = borders.real_vocab_size
    with torch.no_grad():
        view = block_view(borders, layer)
        if what == "ffn":
            v = view.W_out[unit].detach().float()
        else:
            Wv, Wo = view.W_OV(unit)
            _, _, Vh = torch.linalg.svd(Wv.detach().float() @ Wo.detach().float(), full_matrices=False)
            v = Vh[0]
        scores = borders.unembedding.scores(v, fold_norm_gain, rows=slice(0, real))  # streamed, no [V, d]
        if what != "ffn" and float(scores.max()) < -float(scores.min()):
            scores = -scores
        return [int(t) for t in torch.topk(scores, min(k, real)).indices]


__all__ = ["Alignment", "LayerMatch", "SharedVocabulary", "align_models", "shared_vocabulary", "unit_top_tokens"]
