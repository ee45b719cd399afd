"""``vocablens.undertrained``: the three steps of Land & Bartolo (2024) in one call.

1. :func:`~vocablens.undertrained.classes.classify_tokens` — every row's class;
2. an indicator from the matrices (:mod:`~vocablens.undertrained.indicators`), its reference set the
   known-unused rows: unreachable and reserved/unused-named tokens, and padding rows beyond the
   tokenizer (never a token, so never trained); with none, the stand-in of
   :func:`~vocablens.undertrained.indicators.fallback_reference`;
3. the lowest-indicator candidates among the tokens text can produce (``normal`` and round-tripping
   ``single_byte``), verified by prompting (:func:`~vocablens.undertrained.verify.verify_tokens`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

import torch

from vocablens.errors import BadInput
from vocablens.undertrained.classes import CLASSES, NORMAL, SINGLE_BYTE, TokenClasses, classify_tokens
from vocablens.undertrained.indicators import (
    Indicators, choose_indicator, cosine_to_reference, embedding_norm, fallback_reference, first_principal_component,
)
from vocablens.undertrained.verify import THRESHOLD, Verification, pick_examples, verify_tokens

#: the paper's default share of candidate tokens verified: the lowest 2% of the indicator
DEFAULT_FRACTION = 0.02
VERDICTS = ("under-trained", "trained", "not tested")
_UNUSED_NAME = re.compile(r"unused|reserved", re.IGNORECASE)


@dataclass(frozen=True, eq=False)
class UndertrainedResult:
    """Under-trained tokens of one model.

    Attributes:
        classes: the tokenizer analysis (:class:`~vocablens.undertrained.classes.TokenClasses`).
        indicators: :class:`~vocablens.undertrained.indicators.Indicators` (low = candidate).
        candidates: int64 [n], the rows verified, lowest indicator first.
        indicator_threshold: the indicator value of the last candidate (nan when none).
        verification: :class:`~vocablens.undertrained.verify.Verification` of the candidates, or None
            when verification was not run.
        seconds: wall time per step (``classes``, ``indicators``, ``verification``).
    """

    classes: TokenClasses
    indicators: Indicators
    candidates: torch.Tensor
    indicator_threshold: float
    verification: Verification | None
    seconds: dict

    @property
    def vocab_size(self) -> int:
        return int(self.classes.cls.numel())

    def counts(self) -> dict[str, int]:
        """Rows per tokenizer class."""
        return self.classes.counts()

    @property
    def verified(self) -> torch.Tensor:
        """Int64 [k]: candidates whose highest repeat probability stays below 0.01, lowest indicator
        first (empty when verification did not run)."""
        if self.verification is None:
            return torch.zeros(0, dtype=torch.int64)
        return self.candidates[self.verification.verified]

    def max_prob(self) -> torch.Tensor:
        """Float32 [V]: each row's verification probability (nan for rows not tested)."""
        p = torch.full((self.vocab_size,), float("nan"))
        if self.verification is not None:
            p[self.candidates] = self.verification.max_prob
        return p

    def verdict(self, token_id: int) -> str:
        """``under-trained``, ``trained`` (tested, repeated with p >= 0.01) or ``not tested``."""
        if self.verification is None:
            return "not tested"
        hit = (self.candidates == int(token_id)).nonzero().flatten()
        if not hit.numel():
            return "not tested"
        return "under-trained" if bool(self.verification.verified[int(hit[0])]) else "trained"

    def rows(self) -> list[dict]:
        """One plain dict per candidate, lowest indicator first: ``id``, ``class``, ``indicator``,
        ``max_prob`` (None when not verified), ``verdict``."""
        out = []
        for q, t in enumerate(self.candidates.tolist()):
            v = self.verification
            out.append({"id": t, "class": self.classes.name(t),
                        "indicator": float(self.indicators.values[t]),
                        "max_prob": None if v is None else float(v.max_prob[q]),
                        "verdict": "not tested" if v is None else
                        ("under-trained" if bool(v.verified[q]) else "trained")})
        return out


def reference_rows(classes: TokenClasses, tokenizer, known_unused=None) -> tuple[torch.Tensor, str]:
    """``(ids, kind)``: the known-unused rows the indicator measures against (int64 [k]) and a phrase
    naming them; empty when the vocabulary has none (then the caller uses the fallback)."""
    V = int(classes.cls.numel())
    if known_unused is not None:
        ids = torch.as_tensor(list(known_unused), dtype=torch.int64).flatten()
        if not ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= V:
            raise BadInput(f"known_unused must be a non-empty list of ids in [0, {V})")
        return ids.unique(), f"{int(ids.unique().numel())} known-unused ids given"
    mask = classes.cls == CLASSES.index("unreachable")
    mask |= classes.cls == CLASSES.index("padding")
    names = tokenizer.convert_ids_to_tokens(classes.ids("special").tolist()) if tokenizer is not None else []
    for i, s in zip(classes.ids("special").tolist(), names):
        if isinstance(s, str) and _UNUSED_NAME.search(s):
            mask[i] = True
    parts = [f"{int(n)} {what}" for what, n in (
        ("unreachable", int((classes.cls == CLASSES.index("unreachable")).sum())),
        ("reserved/unused-named", int(mask.sum()) - int(((classes.cls == CLASSES.index("unreachable"))
                                                          | (classes.cls == CLASSES.index("padding"))).sum())),
        ("padding", int((classes.cls == CLASSES.index("padding")).sum()))) if n]
    return mask.nonzero().flatten(), " + ".join(parts)


def idle_specials(classes: TokenClasses, tokenizer) -> torch.Tensor:
    """Int64 [k]: special tokens no role uses — not the tokenizer's BOS, EOS, PAD or UNK, and not
    written in its chat template (SmolLM2: ``<repo_name>`` ... ``<empty_output>``, 14 code-metadata
    markers its training data never had)."""
    roles = {getattr(tokenizer, f"{r}_token_id", None) for r in ("bos", "eos", "pad", "unk")}
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    ids = classes.ids("special").tolist()
    names = tokenizer.convert_ids_to_tokens(ids)
    keep = [i for i, s in zip(ids, names) if i not in roles and not (isinstance(s, str) and s in template)]
    return torch.tensor(keep, dtype=torch.int64)


def compute_indicators(borders, classes: TokenClasses, tokenizer=None, *, indicator: str = "auto",
                       known_unused=None) -> Indicators:
    """Both indicators (the input norm only for untied models) and the one chosen.

    O(V·d) memory traffic plus one [d, d] Gram matrix (2·V·d² FLOPs): about a second for 49,152 × 576.
    """
    t0 = time.perf_counter()
    name, why = choose_indicator(bool(borders.tied), indicator)
    W = borders.unembedding.weight.detach()
    usable = classes.cls != CLASSES.index("padding")
    pc, _ = first_principal_component(W, rows=usable)
    ref, kind = reference_rows(classes, tokenizer, known_unused)
    if not ref.numel() and tokenizer is not None:
        ref = idle_specials(classes, tokenizer)
        kind = (f"no unreachable, reserved or padding rows: the {int(ref.numel())} special tokens no role uses "
                "(not BOS/EOS/PAD/UNK, not in the chat template)")
    if not ref.numel():
        ref = fallback_reference(W, pc, usable)
        kind = (f"no unreachable, reserved or padding rows: the {int(ref.numel())} rows of smallest norm once "
                "the first principal component is removed (a stand-in)")
    cos = cosine_to_reference(W, ref, pc)
    norm = None if borders.tied else embedding_norm(borders.input_embedding.weight.detach())
    values = cos if name == "unembedding_cosine" else norm
    return Indicators(values=values, name=name, why=why, unembedding_cosine=cos, embedding_norm=norm,
                      reference=ref, reference_kind=kind, seconds=time.perf_counter() - t0)


def testable(classes: TokenClasses) -> torch.Tensor:
    """Bool [V]: rows a text can produce and verification may test (``normal`` tokens and
    single bytes that round-trip)."""
    return (classes.cls == NORMAL) | ((classes.cls == SINGLE_BYTE) & classes.round_trips)


def undertrained(borders, tokenizer, *, candidates: int | None = None, fraction: float = DEFAULT_FRACTION,
                 indicator: str = "auto", known_unused=None, verify: bool = True, batch_size: int = 64,
                 progress: Callable[[str, int, int], None] | None = None, reuse: UndertrainedResult | None = None,
                 time_budget_s: float | None = None) -> UndertrainedResult:
    """Find and verify the under-trained tokens of a model (Land & Bartolo 2024, §3).

    Args:
        borders: a :class:`~vocablens.models.Borders` (whole model when ``verify``).
        tokenizer: its tokenizer.
        candidates: how many lowest-indicator tokens to verify; None: the lowest ``fraction`` of the
            testable tokens (the paper verifies the lowest 2%).
        fraction: in (0, 1], used when ``candidates`` is None.
        indicator: ``auto`` (:func:`~vocablens.undertrained.indicators.choose_indicator`),
            ``unembedding_cosine`` or ``embedding_norm``.
        known_unused: token ids known to be unused (the reference set), default: found by the
            tokenizer analysis.
        verify: prompt the model (False: candidates and indicators only).
        batch_size: candidates per forward in verification.
        progress: ``(stage, done, total)``: stages ``tokenizer classes`` and ``indicators`` (0 of V
            tokens when each starts, V when it ends; skipped with ``reuse``), then ``verification``
            (prompts: candidates x templates, 0 when it starts, then after each batch).
        reuse: an earlier result of the same model (e.g. ``verify=False``): its classes and
            indicators are taken as they are (``indicator`` and ``known_unused`` are then ignored).
        time_budget_s: wall seconds for verification (None: no limit). Candidates are verified
            lowest indicator first, a batch at a time; when the budget runs out the result holds
            the candidates verified so far (``candidates`` is that prefix, never an unverified row).

    Returns:
        :class:`UndertrainedResult`.

    Raises:
        BadInput: candidates < 0, fraction outside (0, 1], a bad indicator or known_unused.
    """
    if candidates is not None and (isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 0):
        raise BadInput(f"candidates must be an int >= 0 or None; got {candidates!r}")
    if not 0.0 < float(fraction) <= 1.0:
        raise BadInput(f"fraction must lie in (0, 1]; got {fraction}")
    classes, ind, seconds = _classes_and_indicators(borders, tokenizer, indicator, known_unused, progress, reuse)
    ok = testable(classes)
    order, n = _lowest_first(ind.values, ok, candidates, fraction)
    cand = order[:n]
    thr = float(ind.values[cand[-1]]) if n else float("nan")
    ver = None
    if verify and n:
        examples = pick_examples(tokenizer, order.flip(0), ok)
        cb = None if progress is None else (lambda d, t: progress("verification", d, t))
        ver = verify_tokens(borders, tokenizer, cand, examples=examples, batch_size=batch_size, progress=cb,
                            time_budget_s=time_budget_s)
        seconds["verification"] = ver.seconds
        if ver.ids.numel() < n:                  # the budget ran out: the candidates are those verified
            cand = ver.ids
            thr = float(ind.values[cand[-1]]) if cand.numel() else float("nan")
    return UndertrainedResult(classes=classes, indicators=ind, candidates=cand, indicator_threshold=thr,
                              verification=ver, seconds=seconds)



def _classes_and_indicators(borders, tokenizer, indicator: str, known_unused, progress, reuse):
    """The tokenizer classes and the indicator of every row, and their seconds: taken from ``reuse``, or
    computed with the stages ``tokenizer classes`` and ``indicators`` reported to ``progress``."""
    if reuse is not None:
        return reuse.classes, reuse.indicators, {k: reuse.seconds[k] for k in ("classes", "indicators")}
    t0 = time.perf_counter()
    V = int(borders.vocab_size)
    say = (lambda *_: None) if progress is None else progress
    say("tokenizer classes", 0, V)
    classes = classify_tokens(tokenizer, borders.vocab_size)
    seconds = {"classes": time.perf_counter() - t0}
    say("tokenizer classes", V, V)
    say("indicators", 0, V)
    ind = compute_indicators(borders, classes, tokenizer, indicator=indicator, known_unused=known_unused)
    seconds["indicators"] = ind.seconds
    say("indicators", V, V)
    return classes, ind, seconds


def _lowest_first(values: torch.Tensor, ok: torch.Tensor, candidates: int | None, fraction: float):
    """The testable ids (``ok`` [V] bool) by rising indicator ``values`` [V] (ties by id), and how many of
    the first are candidates: ``candidates``, or ``fraction`` of the testable ids, at most all of them."""
    pool = ok.nonzero().flatten()
    n = int(round(fraction * pool.numel())) if candidates is None else candidates
    n = min(n, int(pool.numel()))
    return pool[torch.argsort(values[pool], stable=True)], n


__all__ = ["DEFAULT_FRACTION", "THRESHOLD", "VERDICTS", "UndertrainedResult", "undertrained", "compute_indicators",
           "reference_rows", "testable"]
