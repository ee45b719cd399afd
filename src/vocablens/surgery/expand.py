"""Add tokens to a causal LM: tokenizer, embedding and LM head together.

The method, in order:

1. Tokenize every new string with the OLD tokenizer (after adding, it maps to its own id).
2. Add the strings to a copy of the tokenizer (``AddedToken(normalized=False)``, so they match the
   raw text whatever the normalizer does), as normal or special tokens.
3. Grow the matrices only when a new id is beyond the rows (never shrink). A new id that lands
   in an existing padding row initialises that row too (LlamaFactory PR #10547 review).
4. Initialise each new row, separately for the input embedding and for an untied head:

   - ``subtoken-mean`` (default): the mean of the rows of the string's old tokenization (FVT-style;
     Unsloth ``add_new_tokens``). A string that tokenizes to nothing falls back to the global mean
     and the result says so.
   - ``mean``: the mean of all trained rows (padding and never-trained rows excluded). Hewitt,
     "Initializing New Word Embeddings for Pretrained Language Models" (2021): the new token's logit
     is then the mean logit, at most logsumexp − log V by Jensen, so k new tokens take at most
     k/(V+k) of the probability and KL(old ‖ new) ≤ log(1 + k/V).
   - ``interpolate``: ``(1 − w)·mean + w·subtoken-mean`` (Unsloth's ``interpolation``).
   - ``zeros`` / ``random`` (N(0, initializer_range), what ``resize_token_embeddings`` does without
     ``mean_resizing``): for comparison only.

   Means are computed in float32 and cast back to the weight dtype. A head bias gets the same
   average over the same rows, so the new token's logit is exactly the chosen average of logits.
5. A tied model stays tied: one new Parameter, set on both modules, asserted by identity.
   The config's vocab size is set to the new row count.

The returned model shares every parameter other than the embedding/head with the input model (no
copy of the blocks); the input model and tokenizer are not modified.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from vocablens.errors import BadInput, UnsupportedArchitecture
from vocablens.models.borders import Borders
from vocablens.models.files.quantized import refuse_edit
from vocablens.models.weight_checks import untrained_rows
from vocablens.models.tokens import check_ids_fit, token_str

INIT_METHODS = ("subtoken-mean", "mean", "interpolate", "zeros", "random")


@dataclass(frozen=True)
class NewToken:
    """One added token.

    Attributes:
        token: the string added.
        id: its new token id.
        old_ids: its tokenization by the old tokenizer (may be empty).
        old_pieces: those tokens, readable.
        init: the init method used for its rows (``mean`` when a zero-piece string fell back).
        fallback: True when the string tokenized to nothing and the global mean was used.
        in_padding_row: True when its id landed in an existing padding row.
    """

    token: str
    id: int
    old_ids: tuple[int, ...]
    old_pieces: tuple[str, ...]
    init: str
    fallback: bool
    in_padding_row: bool


@dataclass(frozen=True)
class ExpandResult:
    """What :func:`expand_vocab` did.

    Attributes:
        new_tokens: one :class:`NewToken` per added string, in order.
        init: the requested method; ``interpolation`` its weight (for ``interpolate``).
        special: whether the tokens were added as special tokens.
        rows_before / rows_after: rows of the matrices (V) before and after.
        tokenizer_size_before / tokenizer_size_after: ``len(tokenizer)``.
        tied: whether the model ties W_U to W_E (unchanged by the expansion; asserted).
        trained_rows_embedding / trained_rows_head: rows averaged by the global mean (V in the
            k/(V+k) bound).
        has_bias: whether the head has a bias (a new entry was initialised).
        notes: sentences for the user (fallbacks, padding rows used).
    """

    new_tokens: tuple[NewToken, ...]
    init: str
    interpolation: float
    special: bool
    rows_before: int
    rows_after: int
    tokenizer_size_before: int
    tokenizer_size_after: int
    tied: bool
    trained_rows_embedding: int
    trained_rows_head: int
    has_bias: bool
    notes: tuple[str, ...]

    @property
    def new_ids(self) -> list[int]:
        return [t.id for t in self.new_tokens]

    def to_dict(self) -> dict[str, Any]:
        return {
            "init": self.init,
            "interpolation": self.interpolation if self.init == "interpolate" else None,
            "special": self.special,
            "rows_before": self.rows_before,
            "rows_after": self.rows_after,
            "tokenizer_size_before": self.tokenizer_size_before,
            "tokenizer_size_after": self.tokenizer_size_after,
            "tied": self.tied,
            "trained_rows_embedding": self.trained_rows_embedding,
            "trained_rows_head": self.trained_rows_head,
            "head_bias": self.has_bias,
            "new_tokens": [
                {"token": t.token, "id": t.id, "old_ids": list(t.old_ids), "old_tokenization": list(t.old_pieces),
                 "init": t.init, "fallback_to_mean": t.fallback, "in_padding_row": t.in_padding_row}
                for t in self.new_tokens
            ],
            "notes": list(self.notes),
        }


@dataclass
class Expansion:
    """:func:`expand_vocab`'s output: the new model and tokenizer, and the frozen result."""

    model: Any
    tokenizer: Any
    result: ExpandResult


def init_rows(W: torch.Tensor, pieces: Sequence[Sequence[int]], method: str, trained: torch.Tensor,
              interpolation: float = 0.5, std: float = 0.02, generator: torch.Generator | None = None
              ) -> tuple[torch.Tensor, list[bool]]:
    """New rows for one matrix (or a bias seen as [V, 1]).

    Args:
        W: [V, d] the existing matrix, any float dtype.
        pieces: per new row, the ids of the string's old tokenization (may be empty).
        method: one of :data:`INIT_METHODS`.
        trained: bool [V], rows that count in the global mean (real, trained rows).
        interpolation: w in ``(1 − w)·mean + w·subtoken-mean``.
        std: standard deviation for ``random``.

    Returns:
        ``(rows, fallback)``: rows [k, d] in ``W.dtype``, computed in float32; ``fallback[i]`` is
        True when row i used the global mean because its tokenization was empty.

    Raises:
        BadInput: unknown method, no trained row, or a piece id outside W.
    """
    if method not in INIT_METHODS:
        raise BadInput(f"unknown init method {method!r}; use one of {', '.join(INIT_METHODS)}")
    k, d = len(pieces), W.shape[1]
    if not bool(trained.any()):
        raise BadInput("no trained row to average: every row is padding or never trained")
    Wf = W.detach().float()
    gmean = Wf[trained.to(W.device)].mean(dim=0)  # [d] float32
    rows = torch.empty(k, d, dtype=torch.float32, device=W.device)
    fallback = []
    for i, ids in enumerate(pieces):
        ids = list(ids)
        if any(j < 0 or j >= W.shape[0] for j in ids):
            raise BadInput(f"token ids {ids} outside the matrix rows ({W.shape[0]})")
        fb = method in ("subtoken-mean", "interpolate") and not ids
        fallback.append(fb)
        if method == "zeros":
            rows[i] = 0.0
        elif method == "random":
            rows[i] = torch.randn(d, generator=generator).to(W.device) * std
        elif method == "mean" or fb:
            rows[i] = gmean
        else:
            sub = Wf[torch.tensor(ids, device=W.device)].mean(dim=0)
            rows[i] = sub if method == "subtoken-mean" else (1 - interpolation) * gmean + interpolation * sub
    return rows.to(W.dtype), fallback


def _existing_token(tokenizer, s: str) -> int | None:
    """The id of ``s`` when it is already one token (a vocab key, or one token that decodes to it)."""
    vocab = tokenizer.get_vocab()
    if s in vocab:
        return int(vocab[s])
    ids = tokenizer(s, add_special_tokens=False).input_ids
    if len(ids) == 1 and tokenizer.decode(ids, clean_up_tokenization_spaces=False) == s:
        return int(ids[0])
    return None


def other_vocab_tensors(model: nn.Module, rows: int, known: list[torch.Tensor]) -> list[str]:
    known_ids = {id(t) for t in known if t is not None}
    return [n for n, p in model.named_parameters() if id(p) not in known_ids and p.dim() >= 1 and p.shape[0] == rows]


def shallow_copy(model: nn.Module) -> nn.Module:
    """A structural copy of ``model`` sharing all parameters and buffers (nothing large is copied)."""
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        memo[id(t)] = t
    return copy.deepcopy(model, memo)


def set_vocab_size(model: nn.Module, rows: int) -> None:
    """Set the config's vocab size (text config too) and the model's own ``vocab_size`` attribute."""
    cfg = model.config
    cfg.vocab_size = rows
    get_text = getattr(cfg, "get_text_config", None)
    if callable(get_text):
        tc = get_text()
        if tc is not None and hasattr(tc, "vocab_size"):
            tc.vocab_size = rows
    if isinstance(getattr(model, "vocab_size", None), int):
        model.vocab_size = rows


def replace_matrices(model: nn.Module, W_E: torch.Tensor, W_U: torch.Tensor | None, b_U: torch.Tensor | None,
                     tied: bool) -> None:
    """Install new embedding / head tensors on ``model`` (in place), keeping a tied model tied.

    Args:
        W_E: [V', d] new embedding weight. W_U: [V', d] new head weight (ignored when tied).
        b_U: [V'] new head bias or None.

    Raises:
        UnsupportedArchitecture: tying did not hold afterwards.
    """
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    rows = int(W_E.shape[0])
    rg = emb.weight.requires_grad
    emb.weight = nn.Parameter(W_E, requires_grad=rg)
    if hasattr(emb, "num_embeddings"):
        emb.num_embeddings = rows
    if tied:
        head.weight = emb.weight  # one Parameter for both ends: the tie is storage, not a copy
    else:
        head.weight = nn.Parameter(W_U, requires_grad=rg)
    if b_U is not None:
        head.bias = nn.Parameter(b_U, requires_grad=rg)
    if hasattr(head, "out_features"):
        head.out_features = rows
    set_vocab_size(model, rows)
    if tied and not (model.get_output_embeddings().weight is model.get_input_embeddings().weight):
        raise UnsupportedArchitecture(str(model.config.model_type), "lm_head", "the head did not stay tied")


def _checked_request(tokenizer, tokens: Sequence[str], init: str, interpolation: float) -> list[str]:
    """The tokens as a list, checked: a known init, interpolation in [0, 1], at least one token, none
    empty, none twice, none already in the vocabulary (else BadInput, nothing changed)."""
    if init not in INIT_METHODS:
        raise BadInput(f"unknown `init` {init!r}; use one of {', '.join(INIT_METHODS)}")
    if not 0.0 <= interpolation <= 1.0:
        raise BadInput(f"`interpolation` must be in [0, 1]; got {interpolation}")
    tokens = list(tokens)
    if not tokens:
        raise BadInput("no tokens to add: give at least one token string in `tokens`")
    seen: set[str] = set()
    for s in tokens:
        if not isinstance(s, str) or s == "":
            raise BadInput("an empty string cannot be a token")
        if s in seen:
            raise BadInput(f"{s!r} is given twice; each token can be added once")
        seen.add(s)
        old = _existing_token(tokenizer, s)
        if old is not None:
            raise BadInput(f"{s!r} is already token {old} of the vocabulary; nothing changed")
    return tokens


def _tokenizer_with(tokenizer, tokens: list[str], special: bool):
    """A copy of the tokenizer with ``tokens`` added (never normalized): -> (it, their new ids).
    Raises BadInput when it takes fewer of them or gives an id below its old length."""
    from tokenizers import AddedToken

    new_tok = copy.deepcopy(tokenizer)
    added = [AddedToken(s, special=special, normalized=False) for s in tokens]
    n = new_tok.add_tokens(added, special_tokens=special)
    if n != len(tokens):
        raise BadInput(f"the tokenizer accepted {n} of {len(tokens)} new tokens; nothing changed")
    new_ids = [int(new_tok.convert_tokens_to_ids(s)) for s in tokens]
    if len(set(new_ids)) != len(new_ids) or min(new_ids) < len(tokenizer):
        raise BadInput(f"the tokenizer gave ids {new_ids} that clash with existing tokens; nothing changed")
    return new_tok, new_ids


def _grown(W: torch.Tensor, new_rows: torch.Tensor, new_ids: list[int], rows_after: int) -> torch.Tensor:
    """W [V, ...] grown to [rows_after, ...] in its dtype and device: its rows as they are, ``new_rows``
    at ``new_ids``, zeros in any other row past V."""
    rows_before = W.shape[0]
    out = torch.empty((rows_after, *W.shape[1:]), dtype=W.dtype, device=W.device)
    with torch.no_grad():
        out[:rows_before] = W.detach()
        if rows_after > rows_before:
            # rows between the old end and the new ids (none unless ids skip): keep them defined
            out[rows_before:] = 0
        out[torch.tensor(new_ids, device=W.device)] = new_rows
    return out


def _records(tokenizer, tokens, new_ids, old_ids, fallback, rows_before: int, init: str):
    """-> (a :class:`NewToken` per added token, the notes: fallbacks to the global mean, padding rows taken)."""
    notes, new_tokens = [], []
    for s, i, ids, f in zip(tokens, new_ids, old_ids, fallback):
        pad = i < rows_before
        if f:
            notes.append(f"{s!r} tokenizes to nothing with the old tokenizer; its rows use the global mean")
        if pad:
            notes.append(f"{s!r} took id {i}, an existing padding row; that row was initialised")
        new_tokens.append(NewToken(
            token=s, id=i, old_ids=tuple(int(j) for j in ids),
            old_pieces=tuple(token_str(tokenizer, j) for j in ids),
            init="mean" if f else init, fallback=f, in_padding_row=pad,
        ))
    return new_tokens, notes


def expand_vocab(model: nn.Module, tokenizer, tokens: Sequence[str], init: str = "subtoken-mean",
                 special: bool = False, interpolation: float = 0.5, seed: int = 0) -> Expansion:
    """Add ``tokens`` to a copy of the model and tokenizer, initialising their rows.

    Args:
        model: a transformers causal LM (not modified).
        tokenizer: its fast tokenizer (not modified).
        tokens: the strings to add (a leading space matters for byte-level BPE: ``" vocablens"``).
        init: one of :data:`INIT_METHODS` (see the module docstring; sources there).
        special: add as special tokens (never split, skipped by ``decode(skip_special_tokens=True)``).
        interpolation: weight w of the subtoken mean for ``init="interpolate"``, in [0, 1].
        seed: seed for ``init="random"``.

    Returns:
        :class:`Expansion` (new model sharing the blocks with ``model``, new tokenizer, result).
        Embedding rows [V', d] and head rows [V', d] (+ bias [V']) keep the input dtype and device;
        rows below the old size are bit-identical to the input's.

    Raises:
        BadInput: no tokens, an empty string, a string given twice, a string that is already a
            token (nothing is changed), an unknown init method, interpolation outside [0, 1].
        TokenNotInVocabulary (a BadInput): the tokenizer is already longer than the matrices (a
            token with no row: :func:`~vocablens.models.tokens.check_ids_fit`).
        UnsupportedQuantization: a quantized model (an edit would not reach its stored weights).
        UnsupportedArchitecture: another parameter is indexed by the vocabulary (e.g. per-layer
            embeddings) and would be left at the old size; or the tie did not survive.
    """
    refuse_edit(model, "expand")
    tokens = _checked_request(tokenizer, tokens, init, interpolation)
    borders = Borders.from_model(model, tokenizer)
    tied = borders.tied
    rows_before = borders.vocab_size
    size_before = len(tokenizer)
    check_ids_fit(range(rows_before, size_before), rows_before, tokenizer)  # a tokenizer longer than the rows
    W_E, W_U, b_U = borders.input_embedding.weight, borders.unembedding.weight, borders.unembedding.bias
    others = other_vocab_tensors(model, rows_before, [W_E, W_U, b_U])
    if others:
        raise UnsupportedArchitecture(borders.family, others,
                                      "these parameters are indexed by the vocabulary too; expanding only "
                                      "the embedding and the head would leave them at the old size")

    old_ids = [list(tokenizer(s, add_special_tokens=False).input_ids) for s in tokens]

    new_tok, new_ids = _tokenizer_with(tokenizer, tokens, special)
    size_after = len(new_tok)
    rows_after = max(rows_before, max(new_ids) + 1)

    real = torch.arange(rows_before) < min(size_before, rows_before)
    trained_E = real & ~untrained_rows(W_E)
    trained_U = trained_E if tied else real & ~untrained_rows(W_U)
    g = torch.Generator().manual_seed(seed)
    std = float(getattr(model.config, "initializer_range", 0.02) or 0.02)
    E_rows, fb = init_rows(W_E, old_ids, init, trained_E, interpolation, std, g)
    U_rows = None if tied else init_rows(W_U, old_ids, init, trained_U, interpolation, std, g)[0]
    b_rows = None
    if b_U is not None:
        b_init = "zeros" if init == "random" else init
        b_rows = init_rows(b_U[:, None], old_ids, b_init, trained_U, interpolation)[0][:, 0]

    def grown(W: torch.Tensor, new_rows: torch.Tensor) -> torch.Tensor:
        return _grown(W, new_rows, new_ids, rows_after)

    new_model = shallow_copy(model)
    replace_matrices(new_model, grown(W_E, E_rows), None if tied else grown(W_U, U_rows),
                     None if b_U is None else grown(b_U, b_rows), tied)
    nb = Borders.from_model(new_model, new_tok)
    if nb.tied != tied:
        raise UnsupportedArchitecture(borders.family, "lm_head", "tying changed during the expansion")

    new_tokens, notes = _records(tokenizer, tokens, new_ids, old_ids, fb, rows_before, init)
    res = ExpandResult(
        new_tokens=tuple(new_tokens), init=init, interpolation=float(interpolation), special=special,
        rows_before=rows_before, rows_after=rows_after, tokenizer_size_before=size_before,
        tokenizer_size_after=size_after, tied=tied, trained_rows_embedding=int(trained_E.sum()),
        trained_rows_head=int(trained_U.sum()), has_bias=b_U is not None, notes=tuple(notes),
    )
    return Expansion(new_model, new_tok, res)
