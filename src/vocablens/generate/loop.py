"""The generation loop: prefill with the head at the last position only, then one token per step
through the model's KV cache, each token read through :attr:`Borders.unembedding`.

Prefill runs the base decoder (``model.get_decoder()``, not the ``*ForCausalLM`` wrapper, so no
[T, V] logits are made) over the prompt, filling a transformers ``DynamicCache``, and applies the
unembedding to the last hidden state only: (T-1)·2·V·d head FLOPs are never spent (vLLM's
``logits_indices``, transformers' ``logits_to_keep``). Each decode step feeds one token.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from vocablens.models.flops import block_flops
from vocablens.models.blocks_forward import locate_nonfinite, nonfinite_message
from vocablens.models.tokens import check_ids_fit

from vocablens.errors import BadInput, NonFiniteActivations, UnsupportedArchitecture
from vocablens.generate.early_exit import ExitController, ExitRule, StepRecord
from vocablens.ops.sampling import check_sampling_args, sample
from vocablens.ops.rows import row_logprobs


@dataclass(frozen=True)
class GeneratedToken:
    """One new token: ``id``, its ``logprob`` (nats) under the distribution that emitted it (the
    model's, or the exit layer's lens; temperature 1, before any filter), the ``top`` alternatives
    [(id, logprob)] of that distribution, and ``exit_layer`` (None without early exit)."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    exit_layer: int | None = None


@dataclass(frozen=True)
class GenerationResult:
    """What :func:`generate` returns.

    Attributes:
        prompt_ids: [T] int64; tokens: the new tokens, in order.
        prefill_head_flops_saved: 2·V·d·(T-1), the head FLOPs a full-position prefill would add.
        time_s: wall time of prefill plus decoding (seconds); prefill_s: the prefill's part.
        n_layers: L of the model.
        steps: per decode step, what the early exit did (empty without one).
        flops: estimated forward FLOPs spent (``blocks``, ``kv_fill``, ``lens``, ``head``, ``total``)
            and ``full_model`` for the same tokens without early exit (only with early exit).
    """

    prompt_ids: torch.Tensor
    tokens: tuple[GeneratedToken, ...]
    prefill_head_flops_saved: int
    time_s: float
    prefill_s: float
    n_layers: int = 0
    rule: ExitRule | None = None
    steps: tuple[StepRecord, ...] = ()
    flops: dict = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.time_s if self.time_s > 0 else float("inf")


def base_decoder(borders):
    """The module that runs embedding + blocks + final norm and returns hidden states (no head)."""
    model = borders.model
    dec = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    if not isinstance(dec, torch.nn.Module) or dec is model or not any(
            m is borders.blocks[0] for m in dec.modules()):
        raise UnsupportedArchitecture(borders.family, [type(model).__name__],
                                      "no base decoder holding the blocks (get_decoder)")
    return dec


def new_cache(model):
    """An empty transformers ``DynamicCache`` for ``model``."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def cache_kwarg(decoder) -> str:
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def kv_fill_flops(borders) -> float:
    """FLOPs of one skipped block's K/V fill for one token (2 per weight of k_proj and v_proj)."""
    attn = getattr(borders.blocks[0], "self_attn", None)
    n = sum(getattr(attn, m).weight.numel() for m in ("k_proj", "v_proj") if hasattr(attn, m)) if attn else 0
    return 2.0 * n if n else block_flops(borders, 0)


def _step_flops(borders, rule: ExitRule | None, steps, contexts) -> dict:
    V, d, L = borders.vocab_size, borders.d_emb, borders.n_layers
    head = 2.0 * V * d
    read = head + (2.0 * borders.d_model ** 2 if rule is not None and rule.lens == "tuned" else 0.0)
    k = rule.candidates if rule is not None else 0
    kv = kv_fill_flops(borders)
    tot = {"blocks": 0.0, "kv_fill": 0.0, "lens": 0.0, "head": 0.0}
    full = 0.0
    for rec, ctx in zip(steps, contexts):
        bf = block_flops(borders, ctx)
        tot["blocks"] += rec.exit_layer * bf
        tot["kv_fill"] += rec.kv_fills * kv
        tot["lens"] += rec.full_reads * read + rec.row_reads * 2.0 * k * d
        tot["head"] += head if rec.exit_layer == L else 0.0
        full += L * bf + head
    tot["total"] = sum(tot.values())
    tot["full_model"] = full
    return tot


def _emit(logits: torch.Tensor, tok: int, top_n: int, exit_layer) -> GeneratedToken:
    lp = row_logprobs(logits, dtype=torch.float32)
    n = min(top_n, lp.shape[-1])
    tv, ti = torch.topk(lp, n) if n else (lp[:0], lp[:0].long())
    # one host transfer per token: the token's logprob, the top values and their ids (exact in float64)
    row = torch.cat([lp[tok].reshape(1).double(), tv.double(), ti.double()]).tolist()
    return GeneratedToken(id=tok, logprob=row[0],
                          top=tuple((int(i), v) for i, v in zip(row[1 + n:], row[1: 1 + n])),
                          exit_layer=exit_layer)


def _checked_prompt(borders, input_ids, max_new_tokens) -> torch.Tensor:
    """The prompt as [1, T] int64 on the model's device. Raises BadInput: an empty prompt, an id with
    no embedding row (TokenNotInVocabulary), prompt plus ``max_new_tokens`` beyond the model's context."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64, device=borders.device).reshape(1, -1)
    if ids.shape[1] == 0:
        raise BadInput("empty prompt: no tokens to continue")
    check_ids_fit(ids, borders.vocab_size)  # V: under vocab-parallel ranks W_E holds [0, d] after the split
    ctx = getattr(borders.config, "max_position_embeddings", None)
    if isinstance(ctx, int) and ids.shape[1] + max_new_tokens > ctx:
        raise BadInput(f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                       f"model's context of {ctx}")
    return ids


def _check_finite(borders, logits: torch.Tensor, ids: torch.Tensor, tokens: list[GeneratedToken]) -> None:
    """Raise NonFiniteActivations (naming the first layer that holds inf or NaN) when the logits [1, V]
    hold NaN or +inf; -inf is a masked row, fine."""
    if bool(torch.isnan(logits).any() | torch.isposinf(logits).any()):
        so_far = torch.cat([ids, torch.tensor([[t.id for t in tokens]], dtype=ids.dtype, device=ids.device)], 1)
        locate_nonfinite(borders, so_far)  # names the first layer holding inf or NaN
        raise NonFiniteActivations(nonfinite_message(borders, f"the logits of new token {len(tokens) + 1}"))


def _early_exit_step(ctl, dec, kw: dict, step_in: torch.Tensor, U, mask, candidates: int):
    """One decoding step under the exit controller: -> (logits [1, V], its :class:`StepRecord`). The
    logits are the exit layer's lens read, or the head's (padding masked) when no layer exited."""
    ctl.begin()
    h = dec(input_ids=step_in, **kw).last_hidden_state[:, -1]
    logits = ctl.logits if ctl.logits is not None else U.logits(h)
    if ctl.logits is None and mask is not None:
        logits = logits.masked_fill(~mask.to(logits.device), float("-inf"))
    cand = torch.topk(logits[0], min(candidates, logits.shape[-1])).indices
    return logits, ctl.end(cand)


def _check_counts(max_new_tokens, top_n) -> None:
    """Raise BadInput unless ``max_new_tokens`` is an int >= 1 and ``top_n`` an int >= 0 (bools refused)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BadInput(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise BadInput(f"top_n must be an int >= 0; got {top_n!r}")


def _padding_mask(U) -> torch.Tensor | None:
    """``U.real_mask`` [V] bool (False on padding rows), or None when every row is real."""
    mask = U.real_mask
    return None if mask is not None and bool(mask.all()) else mask


class _CachedDecoder:
    """The base decoder over one KV cache, read through the head ``U``: :meth:`prefill` the prompt, then
    :meth:`step` one token at a time; ``ctl`` is the early exit's controller (None for the full model)."""

    def __init__(self, borders, U, mask, rule: ExitRule | None) -> None:
        self.dec, self.U, self.mask, self.rule = base_decoder(borders), U, mask, rule
        self.kw = {cache_kwarg(self.dec): new_cache(borders.model), "use_cache": True}
        self.ctl = ExitController(borders, rule, mask) if rule is not None else None

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """The prompt [1, T] through the decoder, the head at the last position only: -> logits [1, V]."""
        return self.U.logits(self.dec(input_ids=ids, **self.kw).last_hidden_state[:, -1])  # h [1, d_emb], normed

    def step(self, step_in: torch.Tensor) -> tuple[torch.Tensor, StepRecord | None]:
        """One new token [1, 1] through the cache: -> (logits [1, V], the early exit's record or None)."""
        if self.ctl is None:
            return self.U.logits(self.dec(input_ids=step_in, **self.kw).last_hidden_state[:, -1]), None
        return _early_exit_step(self.ctl, self.dec, self.kw, step_in, self.U, self.mask, self.rule.candidates)


def _decode(borders, run: _CachedDecoder, ids: torch.Tensor, logits: torch.Tensor, draw, *, stop: set[int],
            max_new_tokens: int, top_n: int, on_token) -> tuple[list[GeneratedToken], list[StepRecord], list[int]]:
    """Draw a token from ``logits`` [1, V], emit it, feed it back, until a ``stop`` id or ``max_new_tokens``:
    -> (tokens, the early exit's step records, each step's context length in tokens)."""
    tokens: list[GeneratedToken] = []
    steps: list[StepRecord] = []
    contexts: list[int] = []
    exit_layer = borders.n_layers if run.ctl else None
    while True:
        _check_finite(borders, logits, ids, tokens)
        tok = int(draw(logits)[0])
        t = _emit(logits[0], tok, top_n, exit_layer)
        tokens.append(t)
        if on_token is not None:
            on_token(t)
        if tok in stop or len(tokens) >= max_new_tokens:
            return tokens, steps, contexts
        logits, rec = run.step(torch.tensor([[tok]], device=ids.device))
        if rec is not None:
            steps.append(rec)
            contexts.append(ids.shape[1] + len(tokens))
            exit_layer = rec.exit_layer


def generate(borders, input_ids: torch.Tensor, *, max_new_tokens: int = 32, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             seed: int | None = None, stop_ids=(), top_n: int = 5, early_exit: ExitRule | None = None,
             on_token: Callable[[GeneratedToken], None] | None = None, head=None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (one sequence).

    Args:
        borders: the model's :class:`~vocablens.models.Borders`.
        input_ids: [T] or [1, T] int64 prompt ids.
        temperature: see :func:`vocablens.ops.sample`; 0 is greedy (equal to transformers'
            ``generate(do_sample=False)`` token for token).
        top_k: see :func:`vocablens.ops.sample`.
        top_p: see :func:`vocablens.ops.sample`.
        min_p: see :func:`vocablens.ops.sample`.
        seed: seeds the sampling generator (same seed, same tokens).
        stop_ids: ids that end generation once emitted (e.g. the tokenizer's EOS).
        top_n: alternatives recorded per token.
        early_exit: an :class:`~vocablens.generate.early_exit.ExitRule`, or None for the full model.
        on_token: called with each :class:`GeneratedToken` as soon as it exists (streaming).
        head: what turns the decoder's last hidden state [1, d_emb] into float32 logits [1, V]: an
            object with ``logits(h)``, ``vocab_size``, ``d_emb`` and ``real_mask`` (default
            ``borders.unembedding``; :class:`vocablens.parallel.processes.VocabParallelModel` splits it over
            ranks). Not combined with ``early_exit``.

    Returns:
        :class:`GenerationResult`. Memory: the KV cache, 2·L·(T+N)·kv_dim floats, and one [V] row.

    Raises:
        BadInput: empty prompt, max_new_tokens < 1, bad sampling or exit arguments, a prompt plus new
            tokens longer than the model's context, ``head`` given with ``early_exit``.
        TokenNotInVocabulary (a BadInput): a prompt id with no row in the embedding.
        NonFiniteActivations: the logits hold NaN or +inf (the message names the first layer that does).
    """
    _check_counts(max_new_tokens, top_n)
    check_sampling_args(temperature, top_k, top_p, min_p)
    ids = _checked_prompt(borders, input_ids, max_new_tokens)
    if head is not None and early_exit is not None:
        raise BadInput("early exit reads the full LM head at every layer: it does not run with a split head")
    U = borders.unembedding if head is None else head
    mask = _padding_mask(U)
    gen = torch.Generator(device=borders.device).manual_seed(int(seed)) if seed is not None else None
    draw = functools.partial(sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                             generator=gen, mask=mask)
    run = _CachedDecoder(borders, U, mask, early_exit)
    t0 = time.perf_counter()
    with torch.no_grad(), (run.ctl.installed() if run.ctl else _null()):
        logits = run.prefill(ids)
        prefill_s = time.perf_counter() - t0
        tokens, steps, contexts = _decode(borders, run, ids, logits, draw, stop={int(s) for s in stop_ids},
                                          max_new_tokens=max_new_tokens, top_n=top_n, on_token=on_token)
    T = ids.shape[1]
    flops = _step_flops(borders, early_exit, steps, contexts) if run.ctl else {}
    return GenerationResult(prompt_ids=ids[0].cpu(), tokens=tuple(tokens),  # cpu: the result, once
                            prefill_head_flops_saved=int(2 * U.vocab_size * U.d_emb * (T - 1)),
                            time_s=time.perf_counter() - t0, prefill_s=prefill_s, n_layers=borders.n_layers,
                            rule=early_exit,
                            steps=tuple(steps), flops=flops)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


__all__ = ["GeneratedToken", "GenerationResult", "base_decoder", "block_flops", "generate", "kv_fill_flops",
           "new_cache"]
