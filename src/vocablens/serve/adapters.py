"""Every call the server makes into the library and into the ``--json`` builders, one function per endpoint.

Each function returns the same plain dict the matching CLI command prints with ``--json`` (the CLI
adds ``"model": provenance``; so do these), so a view in the browser can be reproduced on the command
line. This is the only module of :mod:`vocablens.serve` that imports analyses or renderers: when those
move, only the imports below change.

=================  ==========================================================================
endpoint           CLI equivalent
=================  ==========================================================================
``/api/lens``      ``vocablens lens PROMPT --positions all --kind KIND -k K [--chat] --json``
``/api/neighbors`` ``vocablens neighbors TOKEN -k K --json``
``/api/explain``   ``vocablens explain PROMPT -p POS -t TARGET [--chat] --json``
``/api/project``   ``vocablens project --token TOKEN -k K --json``
``/api/argmax``    one token's entries of ``vocablens argmax --json``
``/api/undertrained`` one token's class, indicator and (given ``--undertrained FILE``) verification of
                   ``vocablens undertrained --json``
``/api/trajectory`` the ``final_top1_rank`` / ``final_top1_prob`` columns of ``vocablens lens PROMPT
                   --positions POS --kind both --json`` when TOKEN is the final top-1, for any token
=================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import torch

from vocablens.errors import BadInput, TokenNotInVocabulary
from vocablens.lens import logit_lens
from vocablens.lens.logit import resolve_positions
from vocablens.lens.trajectory import layer_readout
from vocablens.models.tokens import adds_bos, token_str
from vocablens.render.argmax import argmax_to_dict
from vocablens.render.json import json_ready
from vocablens.render.lens import lens_json as _lens_json
from vocablens.render.lens import lens_record
from vocablens.render.vocab_space import search_to_dict


# ------------------------------------------------------------------------------------------ helpers
def clean(o: Any) -> Any:
    """JSON-ready copy of ``o``: NaN/inf -> None, tensors -> lists (the one conversion ``--json`` uses)."""
    return json_ready(o)


def _with_model(d: dict, lm) -> dict:
    return clean({**d, "model": lm.provenance.to_dict()})


def encode(lm, prompt: str, chat: bool, max_tokens: int) -> torch.Tensor:
    """Prompt text -> input ids [1, T] int64, as the CLI encodes it (chat template with ``chat``).

    Raises:
        BadInput: empty prompt, no chat template; PromptTooLong: over ``max_tokens`` or the context.
    """
    from vocablens.errors import PromptTooLong

    ids = lm.encode(prompt, chat=chat)
    if ids.shape[1] > max_tokens:
        raise PromptTooLong(f"the prompt has {ids.shape[1]} tokens; this server reads prompts of at most "
                            f"{max_tokens} tokens (start it with --max-tokens N for more)")
    return ids


def token_id(lm, token: str | int) -> int:
    """A single token given as its text (``" Paris"``) or its id -> the id: the one rule of every endpoint
    that takes a token (neighbors, project, trajectory, explain's target, argmax).

    A text that spells several tokens is refused (never silently replaced by its first token).

    Raises:
        TokenNotInVocabulary: empty, several tokens, or an id outside the real vocabulary.
    """
    real = lm.borders.real_vocab_size
    if isinstance(token, int):
        if not 0 <= token < real:
            raise TokenNotInVocabulary(f"token id {token} is outside the vocabulary 0..{real - 1}")
        return token
    ids, _ = lm.token_ids(token)
    if len(ids) != 1:
        shown = [token_str(lm.tokenizer, i) for i in ids[:6]] + (["..."] if len(ids) > 6 else [])
        raise TokenNotInVocabulary(f"{token[:40]!r}{'...' if len(token) > 40 else ''} is {len(ids)} tokens "
                                   f"{shown}; give a single token (its text with its leading space, or its id)")
    if not 0 <= int(ids[0]) < real:
        raise TokenNotInVocabulary(f"{token!r} is token {ids[0]}, outside the real vocabulary 0..{real - 1}")
    return int(ids[0])


def position(ids: torch.Tensor, position: int) -> int:
    """A position of the prompt ids [1, T] (negative counts from the end) -> 0..T-1.

    Raises:
        BadInput: outside [-T, T).
    """
    return int(resolve_positions(int(ids.shape[-1]), [position])[0])


def token_query(lm, token: str | int) -> str:
    """The string ``neighbors`` looks a token up by: the text itself, or for an id its vocabulary entry
    (exact). Checked by :func:`token_id` first (the same rule as every endpoint).

    Raises:
        TokenNotInVocabulary: as :func:`token_id`.
    """
    tid = token_id(lm, token)
    return lm.tokenizer.convert_ids_to_tokens(tid) if isinstance(token, int) else token


def load_tuned(lm, model_spec: str, path: str = ""):
    """The tuned lens (``path``, or the one shipped for ``model_spec``) or None when there is none."""
    from vocablens.lens.tuned import load_for_model

    return load_for_model(lm.borders, model_spec, path or None)


def forward(lm, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of one prompt (ids [1, T]): ``(resid [L+1, 1, T, d], logits [1, T, V] float32)``,
    what :meth:`Borders.residual_stream` returns; the server caches it per prompt."""
    with torch.no_grad():
        return lm.borders.residual_stream(ids)


class _Replayed:
    """``lm.borders`` with one prompt's forward pass already run: :meth:`residual_stream` of those ids
    answers the cached ``(resid, logits)``, any other call goes to the real Borders. The lens's readout
    (k, kind) then reads a cached forward; the lens itself is unchanged."""

    def __init__(self, borders, ids: torch.Tensor, stream: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._borders, self._ids, self._stream = borders, ids.reshape(1, -1), stream

    def residual_stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if attention_mask is None and torch.equal(input_ids.reshape(1, -1).cpu(), self._ids.cpu()):
            return self._stream
        return self._borders.residual_stream(input_ids, attention_mask)

    def __getattr__(self, name: str):
        return getattr(self._borders, name)


# ---------------------------------------------------------------------------------------- endpoints
def lens_json(lm, ids: torch.Tensor, kind: str, k: int, tuned,
              stream: tuple[torch.Tensor, torch.Tensor] | None = None, jacobian=None) -> dict:
    """``/api/lens``: every layer x every position; the dict of ``lens --positions all --json``.

    ``kind``: ``logit``, ``tuned``, ``jacobian``, ``both`` (= logit,tuned) or a comma list of them;
    ``tuned`` / ``jacobian``: those lenses (None when not asked for). ``stream``: the prompt's cached
    :func:`forward` (None: run it); every lens asked for reads the same forward pass.
    """
    kinds = ["logit", "tuned"] if kind == "both" else [x for x in str(kind).split(",") if x]
    if not kinds or any(x not in ("logit", "tuned", "jacobian") for x in kinds):
        raise BadInput(f"kind must be logit, tuned, jacobian, both or a comma list of them; got {kind!r}")
    b = _Replayed(lm.borders, ids, stream if stream is not None else forward(lm, ids))
    by_kind = {"logit": None, "tuned": tuned, "jacobian": jacobian}
    results = []
    for kd in kinds:
        jl = by_kind[kd] if kd == "jacobian" else None
        layers = None if jl is None or len(jl.layers) == lm.borders.n_layers else [*jl.layers, lm.borders.n_layers]
        results.append(logit_lens(b, ids, positions="all", k=k, translator=by_kind[kd], kind=kd, layers=layers))
    lenses = [lens_record(kd, by_kind[kd]) for kd in kinds if by_kind[kd] is not None]
    return _with_model(_lens_json(results, lm.tokenizer, lenses=lenses), lm)


def trajectory_json(lm, ids: torch.Tensor, resid: torch.Tensor, position: int, tid: int, tuned) -> dict:
    """``/api/trajectory``: rank (0 = top) and probability of token ``tid`` at every layer 0..L at one
    position, through the logit lens and the tuned lens (``tuned`` None: logit only).

    Uses the prompt's cached residual stream ``resid`` [L+1, T, d] (no forward pass); ranks count
    real tokens whose logit exceeds the token's, as ``lens``'s ``final_top1_rank`` does. Every layer
    is read in one streamed pass over the head (:func:`vocablens.lens.trajectory.layer_readout`; the tuned
    lens translates layers < L there, as the lens does).
    """
    T = int(ids.shape[-1])
    p = int(resolve_positions(T, [position])[0])
    b = lm.borders
    L = b.n_layers
    out: dict[str, Any] = {"tokens": [token_str(lm.tokenizer, i) for i in ids[0].tolist()], "position": p,
                           "token": token_str(lm.tokenizer, tid), "token_id": tid, "n_layers": L}
    with torch.no_grad():
        for name, tr in (("logit", None), ("tuned", tuned)):
            if name == "tuned" and tuned is None:
                out[name] = None
                continue
            r = layer_readout(b, resid[:, p], range(L + 1), torch.tensor(tid), k=1, translator=tr)  # [L+1]
            out[name] = {"rank": r.target_rank.tolist(), "prob": r.logprob.exp().tolist(),
                         "top1": [token_str(lm.tokenizer, i) for i in r.topk_ids[:, 0].tolist()]}
    return _with_model(out, lm)


def explain_json(lm, ids: torch.Tensor, position: int, tid: int | None) -> dict:
    """``/api/explain``: the dict of ``explain PROMPT -p POS -t TARGET --json`` (k=5, 5 sub-updates)."""
    return lm.explain(ids, position=position, target=tid, k=5, subs=5).to_json()


def neighbors_json(lm, query: str, k: int) -> dict:
    """``/api/neighbors``: the dict of ``neighbors TOKEN -k K --json`` (input and, untied, output rows)."""
    return lm.neighbors([query], k=k).to_json()


def project_json(lm, tid: int, k: int) -> dict:
    """``/api/project``: the dict of ``project --token TOKEN -k K --json``: the FFN value vectors that
    most promote / suppress the token, with what each promotes."""
    from vocablens import vocab_space as vs

    b = lm.borders
    res = vs.search_token(b, tid, k=k, apply_norm_gain=True)
    layers = res.promote_blocks.tolist() + res.suppress_blocks.tolist()
    neurons = res.promote_neurons.tolist() + res.suppress_neurons.tolist()
    tops = vs.project_vectors(b, layers, neurons, k=min(8, b.real_vocab_size), apply_norm_gain=True)
    return _with_model(search_to_dict(res, lm.tokenizer, tops), lm)


def argmax_scan(lm, progress=None):
    """The whole-vocabulary argmax scan of ``vocablens argmax`` (defaults): a ``ModelArgmax``.

    Starts from the verdicts ``vocablens argmax`` stored for the same head, bias, final norm and
    settings (:mod:`vocablens.argmax.stored`; then no scan runs), and stores a completed scan."""
    from vocablens.argmax.model import argmax_for_borders

    return argmax_for_borders(lm.borders, bias="auto", include_padding=False, include_untrained=False,
                              norm=True, verify="borderline", progress=progress, stored="readwrite")


_SCAN_KEYS = ("vocab_size", "bias", "counts", "padding_rows", "untrained_rows", "unique_rows", "rank",
              "tolerance", "interrupted", "settled", "verified_f64", "norm_note")


def argmax_full_json(lm, ma) -> dict:
    """The dict ``vocablens argmax --json`` prints (computed once per server from the cached scan)."""
    return _with_model(argmax_to_dict(ma, lm.tokenizer), lm)


def argmax_token_json(lm, ma, full: dict, tid: int) -> dict:
    """``/api/argmax``: one token's entries of ``argmax --json``: its verdict and margin (per_token), its
    full record when flagged (certificate's combination, reason), its duplicate group, its reachable
    probability under the final norm when probed, the stage that settled it, and the scan's summary."""
    from vocablens.argmax.exact import STAGES

    names = full["per_token"]["verdict_names"]
    flagged = {it["id"]: it for it in full["unargmaxable"] + full["undecided"]}
    st = int(ma.result.stage[tid])
    rec: dict[str, Any] = {"id": tid, "token": token_str(lm.tokenizer, tid),
                           "verdict": names[full["per_token"]["verdict"][tid]],
                           "stage": STAGES[st] if st >= 0 else None,
                           "margin": full["per_token"]["margin"][tid]}
    rec.update(flagged.get(tid, {}))
    rec["duplicates"] = next((g for g in full["duplicates"] if tid in g["ids"]), None)
    norm = full["norm"]
    rec["norm"] = None if norm is None else next((t for t in norm["tokens"] if t["id"] == tid), None)
    rec["scan"] = {k: full[k] for k in _SCAN_KEYS}
    rec["status"] = "done"
    rec["model"] = full["model"]
    return rec


def undertrained_index(lm):
    """The cheap part of ``vocablens undertrained`` (tokenizer classes and the indicator, no prompting):
    an :class:`~vocablens.undertrained.analysis.UndertrainedResult` whose candidates are the paper's
    lowest 2% of the testable tokens (seconds on the default model: the server computes it once)."""
    from vocablens.undertrained import undertrained

    return undertrained(lm.borders, lm.tokenizer, verify=False)


def undertrained_verified(source, vocab_size: int) -> dict[int, dict]:
    """Token id -> ``{"max_prob", "verdict"}`` of the tokens an earlier verification prompted: from an
    :class:`~vocablens.undertrained.analysis.UndertrainedResult` or the dict ``vocablens undertrained
    --json`` prints (its ``tokens``).

    Raises:
        BadInput: not such a result, or one of another vocabulary size.
    """
    if source is None:
        return {}
    if isinstance(source, dict):
        if "tokens" not in source or "vocab_size" not in source or "verification" not in source:
            raise BadInput("not an under-trained result: expected the JSON of `vocablens undertrained --json`")
        if int(source["vocab_size"]) != vocab_size:
            raise BadInput(f"the under-trained result is of a vocabulary of {source['vocab_size']} rows, "
                           f"the model has {vocab_size}")
        rows = source["tokens"] if source["verification"].get("ran") else []
    else:
        if source.vocab_size != vocab_size:
            raise BadInput(f"the under-trained result has {source.vocab_size} rows, the model {vocab_size}")
        rows = source.rows()
    return {int(r["id"]): {"max_prob": r["max_prob"], "verdict": r["verdict"]} for r in rows
            if r["max_prob"] is not None}


def undertrained_token_json(lm, index, verified: dict[int, dict], tid: int) -> dict:
    """``/api/undertrained``: one token's under-training figures: its tokenizer ``class``, the
    ``indicator`` (name, value, ``rank`` among the testable tokens from the lowest, 0-based, and
    ``candidate``: within the paper's lowest 2%), ``verification`` (``max_prob``, ``verdict``) when an
    earlier run prompted it (else null), ``verdict`` (``under-trained``, ``trained``, ``not tested``),
    and the vocabulary's ``counts`` per class."""
    from vocablens.undertrained.analysis import testable

    ind = index.indicators
    ok = testable(index.classes)
    value = float(ind.values[tid])
    is_testable = bool(ok[tid])
    rank = int((ind.values[ok] < value).sum()) if is_testable else None
    ver = verified.get(tid)
    return _with_model({
        "id": tid, "token": token_str(lm.tokenizer, tid), "class": index.classes.name(tid),
        "testable": is_testable,
        "indicator": {"name": ind.name, "value": value, "rank": rank, "of": int(ok.sum()),
                      "candidate": bool((index.candidates == tid).any()),
                      "threshold": index.indicator_threshold, "reference": ind.reference_kind},
        "verification": ver, "verdict": "not tested" if ver is None else ver["verdict"],
        "verified_run": bool(verified), "counts": index.counts()}, lm)


def health_json(lm, tuned_note: str) -> dict:
    """``GET /api/health``: the model's name and provenance, its sizes, whether a tuned lens is loaded, and
    whether the tokenizer puts BOS in front of a text by itself (``adds_bos``; without it the first
    position of every map is an attention sink, not a reading of the text)."""
    b = lm.borders
    return clean({"model": lm.provenance.name, "provenance": lm.provenance.to_dict(),
                  "n_layers": b.n_layers, "vocab_size": b.vocab_size, "real_vocab_size": b.real_vocab_size,
                  "d_model": b.d_emb, "tuned": tuned_note, "adds_bos": adds_bos(lm.tokenizer)})
