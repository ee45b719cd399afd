"""Verification by prompting (Land & Bartolo 2024, §3.3): can the model repeat the token at all?

Each template is a few-shot prompt in which the model repeats example tokens, then the candidate;
the model's probability of the candidate at the place where the repetition goes is read. A token
whose highest probability over the templates stays below :data:`THRESHOLD` (0.01, the paper's) is
verified under-trained: given the token and asked for it back, the model does not produce it.

Speed: the few-shot part of a template is the same for every candidate, so it runs once and its KV
cache is repeated over a batch of candidates; per candidate only the query's few tokens run, then
the chunked head of :func:`vocablens.ops.token_logprobs` gives log p(candidate) at the last position
(one logsumexp over V, one target logit; no [B, V] logits are kept).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch

from vocablens.errors import BadInput

#: the paper's verification threshold on the highest probability of the token
THRESHOLD = 0.01
#: marks the candidate's place in a template's query
SLOT = -1

# A template: (name, preamble, before, between, after, repeats). One shot is
# before + X + (between + X) * repeats + after; the prefix holds the preamble, one shot per example
# and the last ``before``; the query is X + (between + X) * (repeats - 1) + between, and the model
# should say X next. The query stays short (3-4 tokens): it is what runs per candidate.
TEMPLATES = (
    ("arrow", "Each item is copied exactly:\n", "«", "»→«", "»\n", 1),
    ("quote", "The echo repeats every word it hears.\n", "'", "' - '", "'\n", 1),
    ("repeat", "One text, repeated over and over:\n", "", "", "", 3),
)


@dataclass(frozen=True, eq=False)
class Verification:
    """Highest probability the model gives each candidate when asked to repeat it.

    Attributes:
        ids: int64 [n] the candidates. max_prob: float32 [n], the highest over templates.
        per_template: float32 [n, t] probabilities per template (:attr:`templates` names them).
        templates: template names. examples: token ids of the few-shot examples.
        seconds: wall time. threshold: the verification threshold (0.01).
    """

    ids: torch.Tensor
    max_prob: torch.Tensor
    per_template: torch.Tensor
    templates: tuple[str, ...]
    examples: tuple[int, ...]
    seconds: float
    threshold: float = THRESHOLD

    @property
    def verified(self) -> torch.Tensor:
        """Bool [n]: max_prob < threshold."""
        return self.max_prob < self.threshold


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def template_ids(tokenizer, template: tuple, examples: list[int]) -> tuple[list[int], list[int]]:
    """``(prefix, query)`` token ids of one template (:data:`TEMPLATES`): the prefix (BOS when the
    tokenizer adds one, the preamble, one shot per example, the query's opening) is shared; the
    query holds :data:`SLOT` where the candidate goes and ends where the model should say it."""
    from vocablens.models.tokens import adds_bos

    _, preamble, before, between, after, repeats = template
    pre, mid, post = _enc(tokenizer, before), _enc(tokenizer, between), _enc(tokenizer, after)
    bos = [int(tokenizer.bos_token_id)] if adds_bos(tokenizer) else []
    prefix = bos + _enc(tokenizer, preamble)
    for ex in examples:
        prefix += pre + [int(ex)] + (mid + [int(ex)]) * repeats + post
    prefix += pre
    query = [SLOT] + (mid + [SLOT]) * (repeats - 1) + mid
    return prefix, query


def pick_examples(tokenizer, candidates_order: torch.Tensor, usable: torch.Tensor, n: int = 4) -> list[int]:
    """Few-shot example tokens: usable tokens (normal, round-trip) read in ``candidates_order`` (most
    trained first), preferring alphabetic words of 4+ letters; ``n`` of them."""
    from vocablens.models.tokens import token_str

    chosen: list[int] = []
    fallback: list[int] = []
    for i in candidates_order.tolist():
        if not bool(usable[i]):
            continue
        s = token_str(tokenizer, i).strip()
        if len(s) >= 4 and s.isalpha() and s.isascii():
            chosen.append(i)
        elif len(fallback) < n:
            fallback.append(i)
        if len(chosen) >= n:
            break
    return (chosen + fallback)[:n]


def _decoder_and_kw(borders):
    from vocablens.generate.loop import cache_kwarg, base_decoder

    dec = base_decoder(borders)
    return dec, cache_kwarg(dec)


@torch.no_grad()
def verify_tokens(borders, tokenizer, ids, *, examples: list[int], batch_size: int = 64,
                  progress: Callable[[int, int], None] | None = None, time_budget_s: float | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> Verification:
    """The highest probability the model gives each token of ``ids`` when asked to repeat it.

    Args:
        borders: a :class:`~vocablens.models.Borders` of a whole model (blocks loaded).
        tokenizer: its tokenizer (templates are encoded with it).
        ids: int64 [n] or a list: the candidate token ids.
        examples: token ids shown as the few-shot examples (:func:`pick_examples`).
        batch_size: candidates per forward (the prefix's KV cache is repeated that many times).
        progress: called ``(done, total)`` before the few-shot prefixes run (done = 0) and after
            each template of each batch (total = n · templates).
        time_budget_s: wall seconds (None: no limit). Candidates are taken a batch at a time, all
            templates for each batch, so a budget that runs out leaves the first ``k`` candidates
            verified completely and the rest not at all: the result then holds those ``k`` (its
            ``ids`` are ``ids[:k]``). The first batch always runs; the clock is read before each other.
        clock: seconds, monotonic (tests pass a fake one).

    Returns:
        :class:`Verification`. Cost per candidate and template: the query's few tokens through the
        blocks plus one pass over the head (2·V·d FLOPs).

    Raises:
        BadInput: an id outside the vocabulary, batch_size < 1, no examples, a negative budget.
    """
    cand = torch.as_tensor(ids, dtype=torch.int64).flatten()
    _check_arguments(cand, borders.vocab_size, batch_size, examples, time_budget_s)
    U, dev = borders.unembedding, borders.device
    dec, kw = _decoder_and_kw(borders)
    n, T = int(cand.numel()), len(TEMPLATES)
    probs = torch.zeros(n, T, dtype=torch.float32)
    t0 = time.perf_counter()
    start = clock()
    if progress is not None:            # the stage starts before the prefixes' forwards
        progress(0, n * T)
    prefixes = _read_prefixes(borders, dec, kw, tokenizer, examples)
    done = verified = 0
    for a in range(0, n, batch_size):
        if a and time_budget_s is not None and clock() - start >= time_budget_s:
            break
        c = cand[a:a + batch_size]
        B = int(c.numel())
        for t, prefix in enumerate(prefixes):
            probs[a:a + B, t] = _repeat_probs(dec, kw, U, dev, prefix, c)
            done += B
            if progress is not None:
                progress(done, n * T)
        verified = a + B
    probs = probs[:verified]
    return Verification(ids=cand[:verified], max_prob=probs.amax(1) if T else torch.zeros(verified),
                        per_template=probs, templates=tuple(x[0] for x in TEMPLATES),
                        examples=tuple(int(e) for e in examples), seconds=time.perf_counter() - t0)


def _check_arguments(cand: torch.Tensor, V: int, batch_size, examples, time_budget_s) -> None:
    """Raise BadInput for a candidate id outside [0, V), a batch size that is not an int >= 1, no
    examples, or a budget that is not None or seconds >= 0."""
    if cand.numel() and (int(cand.min()) < 0 or int(cand.max()) >= V):
        raise BadInput(f"candidate ids must lie in [0, {V})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadInput(f"batch_size must be an int >= 1; got {batch_size!r}")
    if not examples:
        raise BadInput("verification needs at least one example token for its few-shot prompts")
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not time_budget_s >= 0):
        raise BadInput(f"time_budget_s must be None or a number of seconds >= 0; got {time_budget_s!r}")


def _read_prefixes(borders, dec, kw: str, tokenizer, examples: list[int]) -> list[tuple]:
    """Each template's few-shot prefix run once through the decoder: ``(KV cache, query [q] int64,
    slots [q] bool)`` per template, the slots marking where the candidate goes in the query."""
    from vocablens.generate.loop import new_cache

    prefixes = []
    for tpl in TEMPLATES:
        prefix, query = template_ids(tokenizer, tpl, examples)
        cache = new_cache(borders.model)
        dec(input_ids=torch.tensor([prefix], device=borders.device), **{kw: cache}, use_cache=True)
        q = torch.tensor(query, dtype=torch.int64)
        prefixes.append((cache, q, q == SLOT))
    return prefixes


def _repeat_probs(dec, kw: str, U, dev, prefix: tuple, c: torch.Tensor) -> torch.Tensor:
    """float32 [B] on the host: the probability under the head ``U`` of each candidate of ``c`` [B]
    where one template asks for it back, the template's prefix cache copied and repeated B times;
    ``dev`` is the model's device (Land & Bartolo 2024, §3.3)."""
    from vocablens.ops import token_logprobs

    cache, q, slots = prefix
    B = int(c.numel())
    x = q.repeat(B, 1)
    x[:, slots] = c[:, None]
    batch_cache = copy.deepcopy(cache)
    if B > 1:
        batch_cache.batch_repeat_interleave(B)
    h = dec(input_ids=x.to(dev), **{kw: batch_cache}, use_cache=True).last_hidden_state[:, -1]
    return token_logprobs(h, U.weight, c.to(dev), **U.head_kwargs()).logprob.float().exp().cpu()


__all__ = ["THRESHOLD", "TEMPLATES", "Verification", "verify_tokens", "pick_examples", "template_ids"]
