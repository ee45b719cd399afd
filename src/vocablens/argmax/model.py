"""The thin ``Borders``-taking wrappers: a model's LM head through :mod:`vocablens.argmax`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.argmax.exact import (
    ARGMAXABLE, DUPLICATE, UNARGMAXABLE, ArgmaxResult, Progress, find_unargmaxable,
)
from vocablens.argmax.norm import NormReach, norm_reachability, probe_norm
from vocablens.errors import BadInput


@dataclass(frozen=True, eq=False)
class ModelArgmax:
    """Argmax geometry of one model's LM head.

    Attributes:
        result: the exact verdicts (:class:`~vocablens.argmax.exact.ArgmaxResult`).
        reach: reachability under the final norm for selected tokens, or None.
        norm_note: why ``reach`` is None, or what was probed.
        bias_mode: ``"on"`` or ``"off"`` as applied.
        vocab_size: V; padding_rows / untrained_rows: rows flagged (excluded unless included).
    """

    result: ArgmaxResult
    reach: NormReach | None
    norm_note: str
    bias_mode: str
    vocab_size: int
    padding_rows: int
    untrained_rows: int


def argmax_for_borders(borders, bias: str = "auto", include_padding: bool = False,
                       include_untrained: bool = False, norm: bool = True, norm_tokens: int = 24,
                       progress: Progress | None = None, **kwargs) -> ModelArgmax:
    """Run :func:`~vocablens.argmax.exact.find_unargmaxable` on ``borders.W_U`` (+ ``b_U``).

    Args:
        borders: a :class:`~vocablens.models.Borders`.
        bias: ``"auto"`` (use the head's bias when it has one), ``"on"`` (require it), ``"off"``.
        include_padding: let rows beyond the tokenizer take part (excluded by default).
        include_untrained: let never-trained rows (all-zero rows, groups of >= 8 bit-identical rows)
            take part (excluded by default).
        norm: also bound what the final norm lets each selected token reach (flagged tokens first,
            then the argmaxable tokens with the smallest margins; ``norm_tokens`` in all).
        kwargs: passed to ``find_unargmaxable`` (``reflect_iters``, ``tol``, ``verify`` ...).

    Raises:
        BadInput: ``bias="on"`` for a head without bias, or an unknown ``bias`` mode.
    """
    from vocablens.models.borders import untrained_rows

    if bias not in ("auto", "on", "off"):
        raise BadInput(f"--bias must be auto, on or off; got {bias!r}")
    b = borders.b_U
    if bias == "on" and b is None:
        raise BadInput("--bias on: this model's LM head has no bias (use --bias auto or off)")
    use_b = b if bias in ("auto", "on") else None
    W = borders.W_U.detach()
    real = borders.real_token_mask()
    padding = ~real
    untrained = untrained_rows(W) & real
    res = find_unargmaxable(W, use_b, padding=padding, untrained=untrained,
                            include_padding=include_padding, include_untrained=include_untrained,
                            progress=progress, **kwargs)
    reach, note = None, "not requested"
    if norm:
        reach, note = _reach(borders, W, use_b, res, norm_tokens)
    return ModelArgmax(result=res, reach=reach, norm_note=note,
                       bias_mode="on" if use_b is not None else "off", vocab_size=int(W.shape[0]),
                       padding_rows=int(padding.sum()), untrained_rows=int(untrained.sum()))


def _reach(borders, W, bias, res: ArgmaxResult, n_tokens: int):
    if borders.final_norm is None:
        return None, "the model has no final norm: the hidden vector is not bounded"
    if borders.project_out is not None:
        return None, "a projection follows the final norm: reachability is not computed"
    model = probe_norm(borders.final_norm, int(W.shape[1]))
    if model is None:
        return None, f"the final norm ({type(borders.final_norm).__name__}) does not act as gain*x/rms+shift"
    flagged = [int(t) for t in torch.cat([res.ids("unargmaxable"), res.ids("undecided")])]
    reps = [int(t) for t in res.ids("duplicate") if not torch.isnan(res.margin[t])]
    chosen = (flagged + reps)[: max(0, n_tokens // 2)] if n_tokens else []
    arg = res.ids("argmaxable")
    if len(arg) and n_tokens - len(chosen) > 0:
        order = torch.argsort(res.margin[arg])
        chosen += [int(t) for t in arg[order[: n_tokens - len(chosen)]]]
    if not chosen:
        return None, "no tokens selected"
    homog = {int(t): int(res.verdict[t]) == ARGMAXABLE for t in chosen
             if int(res.verdict[t]) in (ARGMAXABLE, UNARGMAXABLE)}
    reach = norm_reachability(W, chosen, model, bias=bias, competitors=res.in_play,
                              logit_scale=float(borders.logit_scale), homogeneous_verdicts=homog)
    for q, t in enumerate(chosen):
        if int(res.verdict[t]) in (DUPLICATE, UNARGMAXABLE):
            reach.argmaxable[q] = 0          # a tie or a dominated row never wins strictly
    return reach, f"{model.kind}, radius sqrt(d) = {model.radius:.2f}, probe error {model.max_error:.2g}"
