"""Prove a vocabulary edit left the model unharmed, on held-out text.

Every statistic here is float64 (beyond the float32 minimum) over the tokenizer's real tokens only:
rows at or beyond ``len(tokenizer)`` (padding) are left out of the normalizer. The changes measured
(KL, mass, perplexity change of 1e-7) are below float32's resolution of a log-probability
(ulp(3.0) = 2.4e-7). The model's own [T, V] logits are read through :mod:`vocablens.ops.rows`, one
block of rows widened to float64 at a time (no [T, V] float64 log-probabilities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models.tokens import token_strs
from vocablens.ops.rows import row_kl, row_logprobs_at, row_logsumexp, row_max_abs_logprob_diff

F64 = torch.float64


@torch.no_grad()
def _logits(model, ids: Sequence[int]) -> torch.Tensor:
    """[T, rows] float32 logits of one sequence: the model's blocks without its LM head
    (:func:`~vocablens.models.blocks_forward.blocks_forward`), then its own unembedding read once."""
    from vocablens.models import Borders
    from vocablens.models.blocks_forward import blocks_forward

    b = Borders.from_model(model)
    U = b.unembedding
    return U(blocks_forward(b, torch.tensor([list(ids)], dtype=torch.long))[0]).cpu()  # [T, rows]


def _encode(tok, text: str, max_tokens: int) -> list[int]:
    return list(tok(text, add_special_tokens=False).input_ids)[:max_tokens]


@dataclass(frozen=True)
class ExpandVerification:
    """What an expansion did to held-out text.

    Attributes:
        k: number of new tokens; V: rows averaged by the global mean (Hewitt's V).
        positions: held-out positions read (old tokenization).
        new_token_mass: mean over positions of the total probability of the new tokens.
        new_token_mass_max: its maximum over positions.
        mass_bound: k/(V+k), Hewitt's bound on the mass for ``init="mean"``.
        kl_old_new: mean over positions of KL(p_old ‖ p_new), nats.
        kl_bound: log(1 + k/V), the bound on that KL for ``init="mean"``.
        perplexity_before: old model, old tokenization (per token).
        perplexity_after: new model, new tokenization (per token).
        perplexity_relative_change: after/before − 1.
        old_logits_max_abs_diff: max |new − old| logit over the old real vocabulary on the old
            tokenization (0 up to float error when old rows were untouched).
        tokens_before / tokens_after: held-out token counts under each tokenizer.
        new_tokens_in_text: occurrences of the new tokens in the new tokenization of the text.
        sample_text, sample_before, sample_after: a sentence and its tokens under each tokenizer.
    """

    k: int
    V: int
    positions: int
    new_token_mass: float
    new_token_mass_max: float
    mass_bound: float
    kl_old_new: float
    kl_bound: float
    perplexity_before: float
    perplexity_after: float
    perplexity_relative_change: float
    old_logits_max_abs_diff: float
    tokens_before: int
    tokens_after: int
    new_tokens_in_text: int
    sample_text: str
    sample_before: tuple[str, ...]
    sample_after: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k, "V": self.V, "positions": self.positions,
            "new_token_mass": self.new_token_mass, "new_token_mass_max": self.new_token_mass_max,
            "mass_bound": self.mass_bound, "kl_old_new": self.kl_old_new, "kl_bound": self.kl_bound,
            "perplexity_before": self.perplexity_before, "perplexity_after": self.perplexity_after,
            "perplexity_relative_change": self.perplexity_relative_change,
            "old_logits_max_abs_diff": self.old_logits_max_abs_diff,
            "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
            "new_tokens_in_text": self.new_tokens_in_text,
            "sample": {"text": self.sample_text, "before": list(self.sample_before),
                       "after": list(self.sample_after)},
        }


def _nll(logits: torch.Tensor, lse: torch.Tensor, ids: Sequence[int]) -> tuple[float, int]:
    """Sum of −log p(next token) over the sequence (nats, float64) and the count of predicted tokens,
    from the logits [T, rows] and their float64 log-normalizer lse [T]."""
    if len(ids) < 2:
        return 0.0, 0
    tgt = torch.tensor(list(ids[1:]), dtype=torch.long)
    return float(-row_logprobs_at(logits[:-1], tgt[:, None], lse[:-1]).sum()), len(ids) - 1


def verify_expansion(old_model, old_tokenizer, new_model, new_tokenizer, new_ids: Sequence[int],
                     texts: Sequence[str], V: int, sample: str, max_tokens: int = 256) -> ExpandVerification:
    """Compare the old and the expanded model on held-out texts.

    Both models read the OLD tokenization of each text (so positions align): the new-token mass
    and KL(old ‖ new) are measured there. Perplexity after uses the NEW tokenization with the
    new model. Float64 statistics over real tokens only (padding rows left out of the normalizer).

    Args:
        new_ids: ids of the added tokens. texts: held-out texts (each cut to ``max_tokens``).
        V: rows the global mean averaged (for the bounds k/(V+k) and log(1+k/V)).
        sample: a sentence shown tokenized before and after.

    Returns:
        :class:`ExpandVerification`.

    Raises:
        BadInput: no text with at least 2 tokens.
    """
    n_old, n_new = len(old_tokenizer), len(new_tokenizer)
    nid = torch.tensor(list(new_ids), dtype=torch.long)
    masses, kls, diffs = [], [], []
    nll_b = nll_a = 0.0
    cnt_b = cnt_a = tok_b = tok_a = in_text = 0
    for text in texts:
        ids_o = _encode(old_tokenizer, text, max_tokens)
        ids_n = _encode(new_tokenizer, text, max_tokens)
        if len(ids_o) < 2 or len(ids_n) < 2:
            continue
        lo = _logits(old_model, ids_o)                          # [T, rows_old]
        ln = _logits(new_model, ids_o)                          # [T, rows_new]
        lse_o = row_logsumexp(lo, n_old, dtype=F64)             # [T] over the old real tokens
        lse_n = row_logsumexp(ln, n_new, dtype=F64)             # [T] over the new real tokens
        masses.append(row_logprobs_at(ln, nid.expand(len(ids_o), -1), lse_n).exp().sum(-1))  # [T]
        kls.append(row_kl(lo[:, :n_old], ln[:, :n_old], ref_lse=lse_o, lse=lse_n, dtype=F64))  # [T] nats
        diffs.append(float((ln[:, :n_old] - lo[:, :n_old]).abs().max()))
        s, c = _nll(lo, lse_o, ids_o)
        nll_b, cnt_b, tok_b = nll_b + s, cnt_b + c, tok_b + len(ids_o)
        if ids_n == ids_o:
            la, lse_a = ln, lse_n
        else:
            la = _logits(new_model, ids_n)
            lse_a = row_logsumexp(la, n_new, dtype=F64)
        s, c = _nll(la, lse_a, ids_n)
        nll_a, cnt_a, tok_a = nll_a + s, cnt_a + c, tok_a + len(ids_n)
        in_text += sum(1 for i in ids_n if i in set(new_ids))
    if not masses or cnt_b == 0 or cnt_a == 0:
        raise BadInput("held-out text too short: give text of at least 2 tokens")
    mass = torch.cat(masses)
    kl = torch.cat(kls)
    k = len(new_ids)
    ppl_b = math.exp(nll_b / cnt_b)
    ppl_a = math.exp(nll_a / cnt_a)
    return ExpandVerification(
        k=k, V=int(V), positions=int(mass.numel()),
        new_token_mass=float(mass.mean()), new_token_mass_max=float(mass.max()),
        mass_bound=k / (V + k), kl_old_new=float(kl.mean()), kl_bound=math.log1p(k / V),
        perplexity_before=ppl_b, perplexity_after=ppl_a, perplexity_relative_change=ppl_a / ppl_b - 1.0,
        old_logits_max_abs_diff=max(diffs), tokens_before=tok_b, tokens_after=tok_a,
        new_tokens_in_text=in_text, sample_text=sample,
        sample_before=tuple(token_strs(old_tokenizer, _encode(old_tokenizer, sample, 10_000))),
        sample_after=tuple(token_strs(new_tokenizer, _encode(new_tokenizer, sample, 10_000))),
    )


@dataclass(frozen=True)
class TrimVerification:
    """The trimmed model against the original on texts from the corpus.

    Attributes:
        texts / positions: texts and positions compared.
        tokenization_identical: the trimmed tokenizer gives ``old_to_new[old ids]`` on every text.
        logits_max_abs_diff: max |trimmed − original| logit over the kept tokens.
        logprobs_max_abs_diff: max |trimmed log-prob − original log-prob renormalised over the
            kept tokens| (the trimmed model's distribution is the original's conditioned on them).
        dropped_mass: mean over positions of the original's probability on dropped tokens.
        perplexity_before / perplexity_after: per token, on these texts.
    """

    texts: int
    positions: int
    tokenization_identical: bool
    logits_max_abs_diff: float
    logprobs_max_abs_diff: float
    dropped_mass: float
    perplexity_before: float
    perplexity_after: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def verify_trim(old_model, old_tokenizer, new_model, new_tokenizer, kept_old_ids: Sequence[int],
                texts: Sequence[str], max_tokens: int = 256) -> TrimVerification:
    """Compare the trimmed model with the original on ``texts`` (ids mapped old -> new).

    Args:
        kept_old_ids: sorted old ids kept; new id i is old id ``kept_old_ids[i]``.

    Returns:
        :class:`TrimVerification`.

    Raises:
        BadInput: no text with at least 2 tokens.
    """
    kept = torch.tensor(list(kept_old_ids), dtype=torch.long)
    kept_real = kept[kept < len(old_tokenizer)]  # the kept tokens the original can emit
    old_to_new = {int(o): i for i, o in enumerate(kept_old_ids)}
    n_old, n_new = len(old_tokenizer), len(new_tokenizer)
    same = True
    dl = dp = 0.0
    dropped, nb, na, cnt, npos, nt = [], 0.0, 0.0, 0, 0, 0
    for text in texts:
        ids_o = _encode(old_tokenizer, text, max_tokens)
        ids_n = _encode(new_tokenizer, text, max_tokens)
        if len(ids_o) < 2:
            continue
        mapped = [old_to_new.get(i, -1) for i in ids_o]
        if mapped != ids_n:
            same = False
            continue
        nt += 1
        lo = _logits(old_model, ids_o)
        ln = _logits(new_model, ids_n)
        lse_o = row_logsumexp(lo, n_old, dtype=F64)             # [T] the original, over its real tokens
        lse_n = row_logsumexp(ln, n_new, dtype=F64)             # [T] the trimmed model
        lse_k = row_logsumexp(lo, kept, dtype=F64)              # [T] the original conditioned on the kept
        dl = max(dl, float((ln[:, :n_new] - lo[:, kept]).abs().max()))
        dp = max(dp, float(row_max_abs_logprob_diff(ln[:, :n_new], lo, a_lse=lse_n, b_lse=lse_k, b_cols=kept).max()))
        lse_kr = lse_k if len(kept_real) == len(kept) else row_logsumexp(lo, kept_real, dtype=F64)
        dropped.append(-torch.expm1(lse_kr - lse_o))            # 1 - p(kept) under the original
        s, c = _nll(lo, lse_o, ids_o)
        nb, cnt = nb + s, cnt + c
        na += _nll(ln, lse_n, ids_n)[0]
        npos += len(ids_o)
    if cnt == 0:
        if not same:
            return TrimVerification(len(texts), 0, False, float("nan"), float("nan"), float("nan"),
                                    float("nan"), float("nan"))
        raise BadInput("no corpus text of at least 2 tokens to verify the trimmed model on")
    return TrimVerification(
        texts=nt, positions=npos, tokenization_identical=same, logits_max_abs_diff=dl,
        logprobs_max_abs_diff=dp, dropped_mass=float(torch.cat(dropped).mean()),
        perplexity_before=math.exp(nb / cnt), perplexity_after=math.exp(na / cnt),
    )


#: the largest |Δ log-prob| (nats) a trimmed model may differ from the original by (float32 rounding)
TRIM_LOGPROB_TOLERANCE = 1e-5


def accept_trim(v: TrimVerification, documents_tokenized_differently: int,
                tol: float = TRIM_LOGPROB_TOLERANCE) -> None:
    """The acceptance rule of a trim: the trimmed model must reproduce the original.

    Accepted when every corpus document tokenizes the same (ids mapped), the check texts tokenize
    the same, and the log-probabilities over the kept tokens (renormalised) differ by at most
    ``tol`` nats. A NaN difference is a rejection.

    Raises:
        VocabLensError: the rule fails; the message says by how much (the caller writes nothing).
    """
    from vocablens.errors import VocabLensError

    if documents_tokenized_differently or not v.tokenization_identical or not v.logprobs_max_abs_diff <= tol:
        raise VocabLensError(
            f"the trimmed model does not reproduce the original ({documents_tokenized_differently} corpus "
            f"documents tokenized differently; max |Δ log-prob| {v.logprobs_max_abs_diff:.2e}); nothing written")
