"""Every call the server makes into the library and into the ``--json`` builders, one function per endpoint.

Each function returns the same plain dict the matching CLI command prints with ``--json`` (the CLI
adds ``"model": provenance``; so do these), so a view in the browser can be reproduced on the command
line. Each calls one :class:`vocablens.Model` method and hands back its result's ``.to_json()`` (the
explorer's own per-token JSON: :mod:`vocablens.render.explorer`); none imports an analysis.

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
``/api/patch``     the patch of ``serve --image``'s image the model saw at an image position (no CLI twin)
=================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import torch

from vocablens.errors import BadInput
from vocablens.render.explorer import argmax_token_to_dict, health_to_dict, lens_response, undertrained_token_to_dict
from vocablens.render.json import json_ready
from vocablens.models.files.spec import DEFAULT_MODEL


# ------------------------------------------------------------------------------------------ helpers
def clean(o: Any) -> Any:
    """JSON-ready copy of ``o``: NaN/inf -> None, tensors -> lists (the one conversion ``--json`` uses)."""
    return json_ready(o)


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


def encode_with_images(lm, prompt: str, images: list, max_tokens: int) -> tuple[torch.Tensor, dict]:
    """Prompt text and the server's images -> ``(input ids [1, T] int64, the forward's further inputs)``
    through the model's own processor (:meth:`vocablens.Model.image_prompt`).

    Raises:
        BadInput: empty prompt, an image the processor refuses; PromptTooLong: over ``max_tokens``.
    """
    from vocablens.errors import PromptTooLong

    ids, inputs = lm.image_prompt(prompt, images)
    if ids.shape[1] > max_tokens:
        raise PromptTooLong(f"the prompt and its image have {ids.shape[1]} tokens; this server reads prompts of at "
                            f"most {max_tokens} tokens (start it with --max-tokens N for more)")
    return ids, inputs


def patch_json(lm, ids: torch.Tensor, inputs: dict, pos: int) -> dict:
    """``/api/patch``: the patch of the image the model saw at an image position, outlined on the image
    as the model read it (:meth:`vocablens.Model.image_patch`, :func:`~vocablens.render.explorer.patch_to_dict`).

    Raises:
        BadInput: not an image position, or image tokens that are not a square grid of patches.
    """
    from vocablens.render.explorer import patch_to_dict

    p = lm.position(ids, pos)
    img, box, label = lm.image_patch(ids, inputs, p)
    return patch_to_dict(img, box, label, p)


def token_id(lm, token: str | int) -> int:
    """A single token given as its text (``" Paris"``; ``"4"`` is the text "4") or its id (a JSON integer,
    or the string ``"id:N"``) -> the id: the one rule of every endpoint that takes a token (neighbors,
    project, trajectory, explain's target, argmax; :meth:`vocablens.Model.token_id`, the rule of the
    handle and the CLI too). A text that spells several tokens is refused (never silently replaced by
    its first token).

    Raises:
        TokenNotInVocabulary: empty, several tokens, or an id outside the real vocabulary.
    """
    from vocablens.handle import Model

    return Model.of(lm).token_id(token)


def position(lm, ids: torch.Tensor, position: int) -> int:
    """A position of the prompt ids [1, T] (negative counts from the end) -> 0..T-1 (:meth:`Model.position`).

    Raises:
        BadInput: outside [-T, T).
    """
    return lm.position(ids, position)


def token_query(lm, token: str | int) -> str:
    """The string ``neighbors`` looks a token up by: the text itself, or for an id ``"id:N"``. Checked by
    :func:`token_id` first (the same rule as every endpoint).

    Raises:
        TokenNotInVocabulary: as :func:`token_id`.
    """
    tid = token_id(lm, token)
    return f"id:{tid}" if isinstance(token, int) else token


def load_tuned(lm, path: str = ""):
    """The tuned lens (``path``, or the one shipped for the model's spec), from now on the model's ``tuned``
    lens (:meth:`Model.load_lens`, :attr:`Model.tuned_lens`).

    Raises:
        BadInput: no lens there / none shipped. CheckpointMismatch: a lens of another model.
    """
    return lm.load_lens(path) if path else lm.tuned_lens


def load_jacobian(lm, path: str = ""):
    """The Jacobian lens (``path``, or the one shipped for the model), from now on the model's
    ``jacobian`` lens (:meth:`Model.load_jacobian_lens`).

    Raises:
        BadInput: none there / none shipped. CheckpointMismatch: a lens of another model.
    """
    return lm.load_jacobian_lens(path or None)


def lenses_at(lm, path: str) -> dict:
    """Every lens kind the ``--lens`` folder or file holds, ``{kind: where}``
    (:func:`vocablens.handle.lenses.sources.lenses_at`).

    Raises:
        BadInput: it holds neither a tuned nor a Jacobian lens.
    """
    from vocablens.handle.lenses.sources import lenses_at as held

    return held(path, lm.spec or DEFAULT_MODEL)


def forward(lm, ids: torch.Tensor, inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of one prompt (ids [1, T]; ``inputs``: its images' tensors, or None):
    ``(resid [L+1, 1, T, d], logits [1, T, V] float32)`` (:meth:`Model.forward`); the server caches it
    per prompt."""
    return lm.forward(ids, inputs)


# ---------------------------------------------------------------------------------------- endpoints
def lens_json(lm, ids: torch.Tensor, kind: str, k: int,
              stream: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """``/api/lens``: every layer x every position; the dict of ``lens --positions all --json``.

    ``kind``: ``logit``, ``tuned``, ``jacobian``, ``both`` (= logit,tuned) or a comma list of them, read
    through the lenses the model holds (:func:`load_tuned`, :func:`load_jacobian`). ``stream``: the
    prompt's cached :func:`forward` (None: run it); every lens asked for reads the same forward pass.
    """
    kinds = ["logit", "tuned"] if kind == "both" else [x for x in str(kind).split(",") if x]
    if not kinds or any(x not in ("logit", "tuned", "jacobian") for x in kinds):
        raise BadInput(f"kind must be logit, tuned, jacobian, both or a comma list of them; got {kind!r}")
    return lens_response(lm.lens(ids, kind=kinds, k=k, positions="all", stream=stream).to_json())


def trajectory_json(lm, ids: torch.Tensor, stream, position: int, tid: int, tuned: bool) -> dict:
    """``/api/trajectory``: rank (0 = top) and probability of token ``tid`` at every layer 0..L at one
    position, through the logit lens and the tuned lens (``tuned`` False: logit only, ``"tuned": null``),
    from the prompt's cached forward ``stream`` (:meth:`Model.trajectory`)."""
    return lm.trajectory(ids, position=position, token=tid, kinds=("logit", "tuned") if tuned else ("logit",),
                         stream=stream).to_json()


def explain_json(lm, ids: torch.Tensor, position: int, tid: int | None) -> dict:
    """``/api/explain``: the dict of ``explain PROMPT -p POS -t TARGET --json`` (k=5, 5 sub-updates)."""
    return lm.explain(ids, position=position, target=tid, k=5, subs=5).to_json()


def neighbors_json(lm, query: str, k: int) -> dict:
    """``/api/neighbors``: the dict of ``neighbors TOKEN -k K --json`` (input and, untied, output rows)."""
    return lm.neighbors([query], k=k).to_json()


def project_json(lm, tid: int, k: int) -> dict:
    """``/api/project``: the dict of ``project --token TOKEN -k K --json``: the FFN value vectors that
    most promote / suppress the token, with what each promotes."""
    return lm.project(token=tid, k=k).to_json()


def argmax_scan(lm, progress=None):
    """The whole-vocabulary argmax scan of ``vocablens argmax`` (defaults): :meth:`Model.argmax`.

    Starts from the verdicts ``vocablens argmax`` stored for the same head, bias, final norm and
    settings (:mod:`vocablens.argmax.stored`; then no scan runs), and stores a completed scan."""
    return lm.argmax(progress=progress)


def argmax_full_json(lm, ma) -> dict:
    """The dict ``vocablens argmax --json`` prints (computed once per server from the cached scan)."""
    return ma.to_json()


def argmax_token_json(lm, ma, full: dict, tid: int) -> dict:
    """``/api/argmax``: one token's entries of ``argmax --json`` (``full``) from the cached scan ``ma``
    (:func:`vocablens.render.explorer.argmax_token_to_dict`)."""
    return argmax_token_to_dict(full, int(ma.result.stage[tid]), tid, lm.tokenizer)


def undertrained_index(lm):
    """The cheap part of ``vocablens undertrained`` (tokenizer classes and the indicator, no prompting):
    an :class:`~vocablens.undertrained.analysis.UndertrainedResult` whose candidates are the paper's
    lowest 2% of the testable tokens (seconds on the default model: the server computes it once)."""
    return lm.undertrained(candidates=None, verify=False).value


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
    """``/api/undertrained``: one token's under-training figures (:func:`undertrained_index`; ``verified``:
    :func:`undertrained_verified`) as :func:`vocablens.render.explorer.undertrained_token_to_dict` gives them."""
    return undertrained_token_to_dict(index, verified, tid, lm.tokenizer, lm.provenance)


def health_json(lm, tuned_note: str, jacobian_note: str | None = None) -> dict:
    """``GET /api/health`` (:func:`vocablens.render.explorer.health_to_dict`)."""
    return health_to_dict(lm, tuned_note, jacobian_note)
