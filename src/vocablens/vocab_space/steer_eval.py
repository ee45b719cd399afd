"""What a :class:`~vocablens.vocab_space.steer.Steering` does: concept mass, fluency cost, greedy continuations.

* Concept mass: at each position of a text, the next-token probability the model puts on a token set,
  sum_{t in T} exp(logit_t - logsumexp(logits)) — the set's logits from
  :meth:`~vocablens.models.unembed.Unembedding.logits` (rows of the set only) and the logsumexp from
  the chunked :func:`vocablens.ops.token_logprobs`; nothing [T, V] is kept.
* Fluency cost: the perplexity of held-out text, exp(mean negative log-likelihood), from
  :func:`vocablens.ops.token_logprobs` (Geva et al. 2022, §5.1 measure it the same way).
* Greedy continuations of a prompt, unsteered and steered (transformers' ``generate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from vocablens.errors import BadInput


def _stream(borders, ids: torch.Tensor) -> torch.Tensor:
    """Head inputs [T, d_emb] (final norm applied once) of one sequence ids [T]."""
    from vocablens.models.blocks_forward import blocks_forward

    return borders.unembedding.normed(blocks_forward(borders, ids[None])[0])  # no LM head in the forward


def concept_mass(borders, ids: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """[T] float32: the probability the model puts on ``token_ids`` as the next token, at each position.

    Raises:
        BadInput: empty ``ids`` or no tokens.
    """
    from vocablens.ops import token_logprobs

    if ids.numel() == 0 or not token_ids:
        raise BadInput("concept mass needs a non-empty text and at least one token")
    U = borders.unembedding
    with torch.no_grad():
        h = _stream(borders, ids)
        lse = token_logprobs(h, U.weight, **U.head_kwargs()).lse              # [T]
        sel = U.logits(h, rows=list(token_ids))                                 # [T, |set|]
        return (sel - lse[:, None]).exp().sum(-1)


def nll(borders, ids: torch.Tensor) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of ids[1:] given their prefixes, and the token count."""
    from vocablens.ops import token_logprobs

    if ids.numel() < 2:
        return 0.0, 0
    U = borders.unembedding
    with torch.no_grad():
        h = _stream(borders, ids)[:-1]
        lp = token_logprobs(h, U.weight, ids[1:].to(h.device), **U.head_kwargs()).logprob
    return float(-lp.double().sum()), int(lp.numel())


def perplexity(borders, texts_ids: Sequence[torch.Tensor]) -> float:
    """exp(total NLL / tokens) over several sequences (each scored from its second token).

    Raises:
        BadInput: fewer than one scored token in all.
    """
    tot, n = 0.0, 0
    for ids in texts_ids:
        a, b = nll(borders, ids)
        tot, n = tot + a, n + b
    if n == 0:
        raise BadInput("perplexity needs at least one text of two tokens or more")
    return math.exp(tot / n)


def greedy(model, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy continuation [max_new_tokens] (fewer at EOS) of ids [T] with transformers' generate."""
    with torch.no_grad():
        out = model.generate(ids[None], max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             attention_mask=torch.ones_like(ids[None]), pad_token_id=0)
    return out[0, ids.numel():]


@dataclass(frozen=True)
class SteerEffect:
    """Before/after measurements of one steering.

    Attributes:
        mass_before, mass_after: {"promote"|"suppress": [T] float32} concept mass at each position of
            the probe text (only the sets given).
        mean_mass_before, mean_mass_after: the same, averaged over probe positions (and texts).
        ppl_before, ppl_after: perplexity of the held-out texts (None when none given).
        continuation_before, continuation_after: greedy token ids of the probe prompt (None when
            ``max_new_tokens`` is 0).
    """

    mass_before: dict[str, torch.Tensor]
    mass_after: dict[str, torch.Tensor]
    mean_mass_before: dict[str, float]
    mean_mass_after: dict[str, float]
    ppl_before: float | None
    ppl_after: float | None
    continuation_before: torch.Tensor | None
    continuation_after: torch.Tensor | None


def measure(borders, steering, probes: Sequence[torch.Tensor], sets: dict[str, Sequence[int]],
            heldout: Sequence[torch.Tensor] = (), max_new_tokens: int = 0,
            progress: Callable[[str, int, int], None] | None = None) -> SteerEffect:
    """Run every probe and held-out sequence without and with ``steering``.

    Args:
        probes: token id sequences [T] whose concept mass is measured (the first is also continued).
        sets: ``{"promote": ids, "suppress": ids}`` (either may be missing).
        heldout: sequences for the perplexity (fluency cost).
        max_new_tokens: length of the greedy continuation of ``probes[0]`` (0: none).
        progress: ``progress(stage, done, total)`` after each forward pass (stages ``unsteered`` and
            ``steered``; one unit per probe text and set, per held-out text, and the continuation).

    Raises:
        BadInput: no probe.
    """
    if not probes:
        raise BadInput("give a prompt or a corpus to measure the steering on")
    used = {k: ids for k, ids in sets.items() if ids}
    total = len(used) * len(probes) + len(heldout) + (1 if max_new_tokens else 0)

    def run(stage: str):
        done = 0

        def step(value):
            nonlocal done
            done += 1
            if progress is not None:
                progress(stage, done, total)
            return value

        if progress is not None:
            progress(stage, 0, total)
        mass = {k: [step(concept_mass(borders, p, ids)) for p in probes] for k, ids in used.items()}
        ppl = None
        if heldout:
            scored = [step(nll(borders, ids)) for ids in heldout]
            n = sum(c for _, c in scored)
            if n == 0:
                raise BadInput("perplexity needs at least one text of two tokens or more")
            ppl = math.exp(sum(t for t, _ in scored) / n)
        cont = step(greedy(borders.model, probes[0], max_new_tokens)) if max_new_tokens else None
        return mass, ppl, cont

    mb, pb, cb = run("unsteered")
    with steering:
        ma, pa, ca = run("steered")

    def mean(d):
        return {k: float(torch.cat(v).mean()) for k, v in d.items()}

    return SteerEffect(mass_before={k: v[0] for k, v in mb.items()}, mass_after={k: v[0] for k, v in ma.items()},
                       mean_mass_before=mean(mb), mean_mass_after=mean(ma), ppl_before=pb, ppl_after=pa,
                       continuation_before=cb, continuation_after=ca)


__all__ = ["SteerEffect", "concept_mass", "greedy", "measure", "nll", "perplexity"]
