"""The thin ``Borders``-taking wrappers: a model's LM head through :mod:`vocablens.argmax`.

The head is read through ``borders.unembedding`` (:class:`~vocablens.models.unembed.Unembedding`):
its ``weight``, ``bias``, ``real_mask``, ``final_norm``, ``project_out`` and ``logit_scale``. The
softcap is monotone and the logit scale positive, so neither changes which token is the argmax.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from vocablens.argmax.exact import find_unargmaxable
from vocablens.argmax.norm import NormReach, norm_reachability, probe_norm
from vocablens.argmax.result import ARGMAXABLE, DUPLICATE, UNARGMAXABLE, ArgmaxResult, Progress
from vocablens.errors import BadInput
from vocablens.models.files.pages import PageRelease

#: names of reserved / unused special tokens: ``<|reserved_special_token_12|>`` (Llama 3),
#: ``<unused17>`` (Gemma), ``[unused3]`` (BERT), ``<|reserved_0|>``, ``<reserved_5>`` ...
RESERVED_NAME = re.compile(r"^(<\|?|\[)(reserved|unused)[A-Za-z_\- ]*\d+(\|?>|\])$", re.IGNORECASE)


@dataclass(frozen=True, eq=False)
class ModelArgmax:
    """Argmax geometry of one model's LM head.

    Attributes:
        result: the exact verdicts (:class:`~vocablens.argmax.result.ArgmaxResult`).
        reach: reachability under the final norm for selected tokens, or None.
        norm_note: why ``reach`` is None, or what was probed.
        bias_mode: ``"on"`` or ``"off"`` as applied.
        vocab_size: V; padding_rows / untrained_rows: rows flagged (excluded unless included).
        reserved: int64 [k], ids of reserved / unused special tokens (by name,
            :data:`RESERVED_NAME`), reported as their own group and proved last.
    """

    result: ArgmaxResult
    reach: NormReach | None
    norm_note: str
    bias_mode: str
    vocab_size: int
    padding_rows: int
    untrained_rows: int
    reserved: torch.Tensor | None = None


def reserved_tokens(tokenizer, V: int) -> torch.Tensor:
    """Bool [V]: tokens whose name marks them reserved or unused (:data:`RESERVED_NAME`); all
    False without a tokenizer. Such rows are usually barely trained and sit at the top of the id
    range (Llama 3: 250 ``<|reserved_special_token_N|>``; Gemma 3: 6,000+ ``<unusedN>``)."""
    mask = torch.zeros(V, dtype=torch.bool)
    if tokenizer is None or not hasattr(tokenizer, "convert_ids_to_tokens"):
        return mask
    n = min(V, len(tokenizer))
    names = tokenizer.convert_ids_to_tokens(list(range(n)))
    for i, s in enumerate(names):
        if isinstance(s, str) and RESERVED_NAME.match(s):
            mask[i] = True
    return mask


def argmax_for_borders(borders, bias: str = "auto", include_padding: bool = False,
                       include_untrained: bool = False, norm: bool = True, norm_tokens: int = 24,
                       progress: Progress | None = None, time_budget_s: float | None = None,
                       tokenizer=None, reserved: torch.Tensor | None = None, stored: str = "off",
                       **kwargs) -> ModelArgmax:
    """Run :func:`~vocablens.argmax.exact.find_unargmaxable` on the model's unembedding.

    Args:
        borders: a :class:`~vocablens.models.Borders`; its ``unembedding`` is read.
        bias: ``"auto"`` (use the head's bias when it has one), ``"on"`` (require it), ``"off"``.
        include_padding: let rows beyond the tokenizer take part (excluded by default).
        include_untrained: let never-trained rows (all-zero rows, groups of >= 8 bit-identical rows)
            take part (excluded by default).
        norm: also bound what the final norm lets each selected token reach (flagged tokens first,
            then the argmaxable tokens with the smallest margins; ``norm_tokens`` in all).
        time_budget_s: wall seconds for the whole analysis (None: no limit). Tokens left open when
            it runs out are ``undecided`` with reason ``"budget"``; the result's ``cut_short``
            names the stages cut short; the norm bounds are skipped once it is spent.
        tokenizer: optional; names the reserved / unused special tokens (their own group).
        reserved: bool [V], those tokens already found (:func:`reserved_tokens`); overrides
            ``tokenizer`` (a caller can then free the tokenizer before the scan).
        stored: ``"off"``, ``"read"`` (reuse a stored scan of the same head and settings, and the
            final norm's form a head-only load's family module gave before:
            :mod:`~vocablens.argmax.stored`) or ``"readwrite"`` (also store a completed scan, and
            that form).
        progress: ``(stage, done, total)``: the scan's stages (``find_unargmaxable``); with
            ``stored``, ``stored verdicts`` (0 then V rows around hashing the head and reading the
            store) and ``reusing the stored verdicts`` when one matched; with ``norm``,
            ``final-norm reach`` (gradient iterations).
        kwargs: passed to ``find_unargmaxable`` (``reflect_iters``, ``tol``, ``verify`` ...).

    Raises:
        BadInput: ``bias="on"`` for a head without bias, or an unknown ``bias`` mode.
    """
    from vocablens.models.weight_checks import untrained_rows

    t0 = time.perf_counter()
    if bias not in ("auto", "on", "off"):
        raise BadInput(f"`bias` must be auto, on or off; got {bias!r}")
    if stored not in ("off", "read", "readwrite"):
        raise BadInput(f"stored must be off, read or readwrite; got {stored!r}")
    U = borders.unembedding
    b = U.bias
    if bias == "on" and b is None:
        raise BadInput("`bias` on: this model's LM head has no bias (use `bias` auto or off)")
    use_b = None if b is None or bias == "off" else b.detach()
    W = U.weight.detach()
    V = int(W.shape[0])
    real = U.real_mask if U.real_mask is not None else torch.ones(V, dtype=torch.bool)
    padding = ~real
    untrained = untrained_rows(W) & real
    reserved = reserved_tokens(tokenizer, V) if reserved is None else reserved.bool().cpu()
    if reserved.shape != (V,):
        raise BadInput(f"reserved must be a bool mask of shape [V] = [{V}]; got {tuple(reserved.shape)}")
    left = None if time_budget_s is None else max(0.0, time_budget_s - (time.perf_counter() - t0))
    res = _verdicts(U, W, use_b, padding, untrained, reserved, stored, progress,
                    dict(kwargs, include_padding=include_padding, include_untrained=include_untrained,
                         time_budget_s=left))
    reach, note = None, "not requested"
    if norm:
        if time_budget_s is not None and time.perf_counter() - t0 >= time_budget_s:
            note = "skipped: the time budget ran out"
        else:
            reach, note = _reach(U, W, use_b, res, norm_tokens, progress, stored)
    return ModelArgmax(result=res, reach=reach, norm_note=note,
                       bias_mode="on" if use_b is not None else "off", vocab_size=V,
                       padding_rows=int(padding.sum()), untrained_rows=int(untrained.sum()),
                       reserved=reserved.nonzero().flatten())


def _verdicts(U, W, use_b, padding, untrained, reserved, stored: str, progress, scan: dict) -> ArgmaxResult:
    """The exact verdicts: a stored scan of this head and settings when ``stored`` reads one, else
    :func:`~vocablens.argmax.exact.find_unargmaxable` with the ``scan`` keywords (kept when
    ``stored="readwrite"``)."""
    key = None
    if stored in ("read", "readwrite"):
        from vocablens.argmax.stored import load_verdicts

        V = int(W.shape[0])
        say = progress or (lambda *_: None)
        say("stored verdicts", 0, V)           # hashing the head: about a second per 100 MB
        key = _stored_key(U, W, use_b, padding, untrained, scan["include_padding"], scan["include_untrained"], scan)
        res = load_verdicts(key)
        say("stored verdicts", V, V)
        if res is not None:
            say("reusing the stored verdicts", V, V)
            return res
    res = find_unargmaxable(W, use_b, padding=padding, untrained=untrained,
                            defer=reserved if bool(reserved.any()) else None, progress=progress, **scan)
    if stored == "readwrite":
        from vocablens.argmax.stored import store_verdicts

        store_verdicts(res, key)
    return res


def _stored_key(U, W, use_b, padding, untrained, include_padding: bool, include_untrained: bool,
                kwargs: dict) -> str:
    """The stored-verdicts key of a scan of this head (:func:`~vocablens.argmax.stored.verdict_key`):
    what decides a completed scan's verdicts (the reserved rows only change the order of the proofs;
    a stored scan is complete): the exact head, bias, norm, masks and these settings."""
    from vocablens.argmax.stored import verdict_key

    normp = {} if U.final_norm is None else {f"norm.{n}": p for n, p in U.final_norm.named_parameters()}
    settings = {"tol": kwargs.get("tol", 1e-9), "verify": kwargs.get("verify", "borderline"),
                "include_padding": include_padding, "include_untrained": include_untrained}
    return verdict_key(W, use_b, normp, {"padding": padding, "untrained": untrained}, settings)


def expected_scan_seconds(borders) -> float:
    """Seconds :func:`argmax_for_borders` (default settings, ``stored="read"``) is expected to take
    on this machine now: 0 when a stored scan of this head answers it
    (:mod:`~vocablens.argmax.stored`), else the measured estimate
    (:func:`~vocablens.argmax.estimate.scan_seconds`: a timed slice of the fp32 all-pairs pass x
    the benchmarked ratio). Costs one SHA-256 of the head's bytes and that slice's product."""
    from vocablens.argmax.estimate import scan_seconds
    from vocablens.argmax.stored import load_verdicts
    from vocablens.models.weight_checks import untrained_rows

    U = borders.unembedding
    W = U.weight.detach()
    V = int(W.shape[0])
    real = U.real_mask if U.real_mask is not None else torch.ones(V, dtype=torch.bool)
    b = None if U.bias is None else U.bias.detach()
    if load_verdicts(_stored_key(U, W, b, ~real, untrained_rows(W) & real, False, False, {})) is not None:
        return 0.0
    return scan_seconds(W)


def _norm_model(norm: torch.nn.Module, d: int, stored: str):
    """The final norm's probed form (:func:`~vocablens.argmax.norm.probe_norm`), or None when it is not
    ``gain * x / rms + shift``. A head-only load's norm builds the family's module at its first call,
    importing the family's modeling code; with ``stored`` reading, the form that module gave in an
    earlier run is read back instead (:func:`~vocablens.argmax.stored.load_norm_model`: the same
    float64 numbers), and ``readwrite`` keeps a form probed now."""
    from vocablens.argmax.stored import load_norm_model, norm_key, store_norm_model

    key = norm_key(norm) if stored in ("read", "readwrite") else None
    model = load_norm_model(key) if key else None
    if model is None:
        model = probe_norm(norm, d)
        if model is not None and key and stored == "readwrite":
            store_norm_model(model, key)
    return model


def _reach(U, W, bias, res: ArgmaxResult, n_tokens: int, progress=None, stored: str = "off"):
    if U.final_norm is None:
        return None, "the model has no final norm: the hidden vector is not bounded"
    if U.project_out is not None:
        return None, "a projection follows the final norm: reachability is not computed"
    # the scan is over: W's mapped pages go back before the norm is probed (the bounds read W again by
    # blocks; a head-only load may import the family's modeling code for the probe)
    PageRelease(W.numpy() if W.dtype in (torch.float32, torch.float64) else None).release_all()
    model = _norm_model(U.final_norm, int(W.shape[1]), stored)
    if model is None:
        return None, f"the final norm ({type(U.final_norm).__name__}) does not act as gain*x/rms+shift"
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
    tell = None if progress is None else (lambda a, b: progress("final-norm reach", a, b))
    reach = norm_reachability(W, chosen, model, bias=bias, competitors=res.in_play,
                              logit_scale=float(U.logit_scale), homogeneous_verdicts=homog, progress=tell)
    for q, t in enumerate(chosen):
        if int(res.verdict[t]) in (DUPLICATE, UNARGMAXABLE):
            reach.argmaxable[q] = 0          # a tie or a dominated row never wins strictly
    return reach, f"{model.kind}, radius sqrt(d) = {model.radius:.2f}, probe error {model.max_error:.2g}"
