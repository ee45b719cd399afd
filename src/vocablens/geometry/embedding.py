"""Geometry of the embedding and unembedding matrices: cosine neighbours and a 3-D PCA of chosen rows.

Trained embedding rows of tokens with related meanings point in similar directions (Mikolov et al.
2013 for word2vec; Press & Wolf 2016, §3, for an LM's output matrix). Neighbours are ranked by cosine
similarity over the *real* vocabulary only: padding rows beyond the tokenizer and never-trained rows
(:meth:`vocablens.models.Borders.real_token_mask` with ``exclude_untrained=True``) are never returned.
When the head is untied, its matrix gets its own neighbour list: the geometry that groups spellings
on the way in need not be the one that separates them on the way out.

``pca_3d`` projects chosen rows on their top three principal directions (the PCA is fitted on those
rows only) and, for comparison, on three random orthonormal directions: the figure that shows what PCA
is doing (random directions of a 576-d space spread unrelated words the same as related ones).

Layer 3: Borders / tensors in, frozen dataclasses out; no printing. All math is float32 (PCA float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from vocablens.errors import BadInput

#: ~60 common English words in semantic groups, each a single token (with a leading space) in the
#: default model (SmolLM2-135M); the report's 3-D figure.
DEFAULT_WORD_GROUPS: dict[str, tuple[str, ...]] = {
    "numbers": ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    "days": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "countries": ("France", "Germany", "Italy", "Spain", "Japan", "China", "India", "Canada", "Brazil",
                  "Russia"),
    "animals": ("dog", "cat", "horse", "cow", "pig", "sheep", "bird", "fish", "lion", "tiger"),
    "royalty": ("king", "queen", "prince", "princess", "royal", "throne", "crown"),
    "colours": ("red", "blue", "green", "yellow", "black", "white"),
    "family": ("mother", "father", "sister", "brother", "son", "daughter"),
    "food": ("bread", "cheese", "rice", "milk"),
}

_CHUNK = 16384  # rows of W normalised at a time (bounded float32 copies for large V·d)


# ---------------------------------------------------------------------------------------- neighbours
@dataclass(frozen=True)
class NeighborList:
    """Nearest rows of one matrix to one query.

    Attributes:
        matrix: ``input`` (the embedding W_E) or ``output`` (the untied LM head W_U).
        ids: [k] int64 token ids, most similar first.
        cosines: [k] float32 cosine similarities, descending.
    """

    matrix: str
    ids: torch.Tensor
    cosines: torch.Tensor


@dataclass(frozen=True)
class TokenNeighbors:
    """The neighbours of one query string.

    Attributes:
        query: the text asked for.
        query_ids: the tokens it is spelled with (one, or several).
        used: ``token`` (a single token), ``first token`` or ``mean of tokens``.
        note: what happened when the text is several tokens or its row is not a real token, or None.
        lists: one :class:`NeighborList` per matrix: input, then output when the head is untied.
    """

    query: str
    query_ids: tuple[int, ...]
    used: str
    note: str | None
    lists: tuple[NeighborList, ...]


@dataclass(frozen=True)
class Neighbors:
    """Cosine nearest neighbours of several queries.

    Attributes:
        k: neighbours per list.
        tied: the model's head is tied (then only the input matrix is searched).
        candidates: rows searched (real, trained tokens).
        excluded: rows never returned (padding beyond the tokenizer, never-trained rows).
        results: one :class:`TokenNeighbors` per query, in order.
    """

    k: int
    tied: bool
    candidates: int
    excluded: int
    results: tuple[TokenNeighbors, ...]


def cosine_neighbors(W: torch.Tensor, query: torch.Tensor, k: int, mask: torch.Tensor | None = None,
                     exclude: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The k rows of W with the highest cosine similarity to ``query``.

    Rows are normalised in float32 in chunks (no full float32 copy of W); zero rows have cosine 0.

    Args:
        W: [V, d] any float dtype.
        query: [d].
        k: number of neighbours, 1 <= k <= number of eligible rows.
        mask: [V] bool, rows that may be returned (default all).
        exclude: ids never returned (the query's own tokens).

    Returns:
        ``(ids [k] int64, cosines [k] float32)``, most similar first.

    Raises:
        ShapeMismatch: query width differs from W's.
        BadInput: k outside 1..eligible rows.
    """
    from vocablens.errors import ShapeMismatch

    V, d = W.shape
    if query.shape != (d,):
        raise ShapeMismatch(f"query has shape {tuple(query.shape)}; W is [{V}, {d}]")
    dev = W.device  # everything stays where W lives; only the [k] result is read by the caller
    eligible = torch.ones(V, dtype=torch.bool, device=dev) if mask is None else mask.clone().bool().to(dev)
    if exclude:
        eligible[torch.as_tensor(list(exclude), dtype=torch.long, device=dev)] = False
    n = int(eligible.sum())
    if not 1 <= k <= n:
        raise BadInput(f"`k` must be between 1 and {n} (the eligible rows); got {k}")
    q = query.detach().float().to(dev)
    q = q / q.norm().clamp_min(1e-12)
    sims = torch.empty(V, dtype=torch.float32, device=dev)
    for s in range(0, V, _CHUNK):
        rows = W[s:s + _CHUNK].detach().float()
        sims[s:s + _CHUNK] = (rows @ q) / rows.norm(dim=1).clamp_min(1e-12)
    sims[~eligible] = float("-inf")
    top = sims.topk(k)
    return top.indices, top.values


def _real_mask(borders) -> torch.Tensor:
    return borders.real_token_mask(exclude_untrained=True).to(borders.device)


def nearest_neighbors(borders, tokenizer, queries: Sequence[str], k: int = 10, use_mean: bool = False
                      ) -> Neighbors:
    """Cosine nearest neighbours of token strings in the embedding (and the untied head).

    A query that is several tokens uses its first token, or with ``use_mean`` the mean of its tokens'
    rows, and says so in ``note``. The query's own token(s) are left out of its list. Only real,
    trained tokens are candidates (``borders.real_token_mask(exclude_untrained=True)``).

    Args:
        borders: :class:`vocablens.models.Borders`.
        tokenizer: the model's tokenizer.
        queries: strings such as ``" king"`` (the leading space is part of the token); ``"id:N"``
            names token id N (:func:`~vocablens.models.token_input.resolve_token`).
        k: neighbours per list, >= 1.
        use_mean: average the rows of a multi-token string instead of taking its first token.

    Returns:
        :class:`Neighbors`.

    Raises:
        BadInput: no query, or k out of range.
        TokenNotInVocabulary: a string that encodes to no token or to an id with no row in the
            matrix (:func:`~vocablens.models.tokens.check_ids_fit`).
    """
    from vocablens.models.token_input import resolve_token
    from vocablens.models.tokens import quoted, token_str

    if not queries:
        raise BadInput("give at least one token string")
    if k < 1:
        raise BadInput(f"`k` must be at least 1; got {k}")
    mask = _real_mask(borders)
    V = borders.vocab_size
    mats = [("input", borders.input_embedding.weight)] + ([] if borders.tied else [("output", borders.unembedding.weight)])
    results = []
    for text in queries:
        ids, note = resolve_token(tokenizer, text, V, several="mean" if use_mean else "first")  # ids with rows
        used = "token" if len(ids) == 1 else ("mean of tokens" if use_mean else "first token")
        chosen = ids if (use_mean and len(ids) > 1) else ids[:1]
        unreal = [i for i in chosen if not bool(mask[i])]
        if unreal:
            extra = (f"{', '.join(f'{quoted(token_str(tokenizer, i))} ({int(i)})' for i in unreal)} is not a real trained "
                     f"token (padding or never-trained row)")
            note = f"{note}; {extra}" if note else extra
        lists = []
        for name, W in mats:
            qv = W[torch.as_tensor(chosen, device=W.device)].detach().float().mean(dim=0)
            nid, cos = cosine_neighbors(W, qv, k, mask=mask, exclude=chosen)
            lists.append(NeighborList(name, nid, cos))
        results.append(TokenNeighbors(text, tuple(int(i) for i in ids), used, note, tuple(lists)))
    n = int(mask.sum())
    return Neighbors(k=k, tied=bool(borders.tied), candidates=n, excluded=V - n, results=tuple(results))


# ---------------------------------------------------------------------------------------- PCA
@dataclass(frozen=True)
class PCA3D:
    """Chosen rows of a matrix seen along 3 principal directions and along 3 random ones.

    The PCA is fitted on the chosen rows only (centred on their mean), not on the whole vocabulary.

    Attributes:
        ids: [n] int64, the rows.
        mean: [d] float32, the rows' mean (subtracted before projecting).
        directions: [3, d] float32, orthonormal principal directions, largest variance first.
        coords: [n, 3] float32, centred rows on ``directions``.
        explained_variance: [3] float32, fraction of the rows' total variance along each direction
            (non-increasing, sums to <= 1).
        random_directions: [3, d] float32, orthonormal, drawn from N(0, I) with ``seed`` then QR.
        random_coords: [n, 3] float32.
        random_explained_variance: [3] float32, fraction of the total variance along each.
        seed: the random directions' seed.
    """

    ids: torch.Tensor
    mean: torch.Tensor
    directions: torch.Tensor
    coords: torch.Tensor
    explained_variance: torch.Tensor
    random_directions: torch.Tensor
    random_coords: torch.Tensor
    random_explained_variance: torch.Tensor
    seed: int


def pca_3d(W: torch.Tensor, ids, seed: int = 0) -> PCA3D:
    """Coordinates of rows ``W[ids]`` on their top-3 principal directions and on 3 random directions.

    PCA by SVD of the centred rows (float64): Xc = U S Vᵀ, directions = first 3 rows of Vᵀ, coords =
    Xc Vᵀ[:3]ᵀ, explained variance = S²/ΣS². Signs are fixed so that each direction's largest-|coord|
    row is positive (deterministic output). Random directions: QR of a seeded Gaussian [d, 3].

    Args:
        W: [V, d] any float dtype, d >= 3.
        ids: [n] ids (list or tensor), n >= 4 distinct rows.
        seed: seed of the random directions.

    Returns:
        :class:`PCA3D`.

    Raises:
        BadInput: fewer than 4 rows, d < 3, or ids out of range.
    """
    ids_t = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids, dtype=torch.long).flatten()
    V, d = W.shape
    if ids_t.numel() < 4:
        raise BadInput(f"PCA needs at least 4 rows; got {ids_t.numel()}")
    if d < 3:
        raise BadInput(f"PCA to 3 dimensions needs d >= 3; got {d}")
    if int(ids_t.min()) < 0 or int(ids_t.max()) >= V:
        raise BadInput(f"row ids must be in 0..{V - 1}")
    X = W[ids_t].detach().to("cpu", torch.float64)
    mean = X.mean(dim=0)
    Xc = X - mean
    U, S, Vh = torch.linalg.svd(Xc, full_matrices=False)
    dirs = Vh[:3]
    coords = Xc @ dirs.T
    # deterministic signs: the row with the largest |coordinate| on each axis is positive
    pick = coords.abs().argmax(dim=0)
    signs = torch.sign(coords[pick, torch.arange(3)])
    signs[signs == 0] = 1
    dirs = dirs * signs[:, None]
    coords = coords * signs
    total = (S ** 2).sum().clamp_min(1e-300)
    ev = (S[:3] ** 2) / total
    g = torch.Generator().manual_seed(int(seed))
    Q, R = torch.linalg.qr(torch.randn(d, 3, generator=g, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R))[None, :]
    rcoords = Xc @ Q
    rev = (rcoords ** 2).sum(dim=0) / total
    return PCA3D(ids=ids_t, mean=mean.float(), directions=dirs.float(), coords=coords.float(),
                 explained_variance=ev.float(), random_directions=Q.T.contiguous().float(),
                 random_coords=rcoords.float(), random_explained_variance=rev.float(), seed=int(seed))


@dataclass(frozen=True)
class WordPCA:
    """A 3-D PCA of word embeddings with their labels and groups (the report's figure).

    Attributes:
        words: n words plotted (as given, without the leading space).
        groups: n group names, parallel to ``words``.
        pca: :class:`PCA3D` of the input-embedding rows of the words' tokens.
        skipped: words left out because they are several tokens in this tokenizer.
        matrix: ``input`` (the embedding W_E).
    """

    words: tuple[str, ...]
    groups: tuple[str, ...]
    pca: PCA3D
    skipped: tuple[str, ...]
    matrix: str = "input"


def word_pca(borders, tokenizer, groups: dict[str, Sequence[str]] | None = None, prefix: str = " ",
             seed: int = 0) -> WordPCA:
    """3-D PCA (and random projection) of the embedding rows of grouped words.

    Each word is looked up as ``prefix + word`` (a leading space: the word-initial token of byte-level
    BPE); words that are several tokens are skipped and listed.

    Args:
        borders: :class:`vocablens.models.Borders`.
        tokenizer: the model's tokenizer.
        groups: ``{group: words}``; default :data:`DEFAULT_WORD_GROUPS` (60 words).
        prefix: prepended to each word.
        seed: seed of the random directions.

    Raises:
        BadInput: fewer than 4 single-token words.
    """
    groups = DEFAULT_WORD_GROUPS if groups is None else groups
    words, gs, ids, skipped = [], [], [], []
    for g, ws in groups.items():
        for w in ws:
            tid = tokenizer(prefix + w, add_special_tokens=False).input_ids
            if len(tid) != 1 or not 0 <= tid[0] < borders.vocab_size:
                skipped.append(w)
                continue
            words.append(w)
            gs.append(g)
            ids.append(tid[0])
    if len(ids) < 4:
        raise BadInput(f"only {len(ids)} of the words are single tokens; PCA needs at least 4")
    return WordPCA(tuple(words), tuple(gs), pca_3d(borders.input_embedding.weight, ids, seed=seed), tuple(skipped))


__all__ = [
    "DEFAULT_WORD_GROUPS", "NeighborList", "TokenNeighbors", "Neighbors", "PCA3D", "WordPCA",
    "cosine_neighbors", "nearest_neighbors", "pca_3d", "word_pca",
]
