"""The explorer's own JSON (``vocablens serve``): one token's entries of a whole-vocabulary result, and
the server's health. Each reads a result the handle computed and formats it; every other endpoint
answers with the matching command's ``--json`` (:mod:`vocablens.render.shown`)."""

from __future__ import annotations

from typing import Any

from vocablens.models.tokens import adds_bos, token_str
from vocablens.render.json import json_ready

#: the scan's summary fields repeated in each token's ``/api/argmax`` answer
SCAN_KEYS = ("vocab_size", "bias", "counts", "padding_rows", "untrained_rows", "unique_rows", "rank",
             "tolerance", "interrupted", "settled", "verified_f64", "norm_note")


def lens_response(d: dict) -> dict:
    """``/api/lens``: the dict of ``lens --positions all --json`` (``d``, a lens result's ``to_json()``),
    its ``"model"`` last, as the explorer has always answered (``--json`` puts it before ``"lenses"``)."""
    return {**{k: v for k, v in d.items() if k != "model"}, **({"model": d["model"]} if "model" in d else {})}


def patch_to_dict(image, box: tuple, label: str, position: int, size: int = 224) -> dict:
    """``/api/patch``: ``{"position", "label", "box": [x0, y0, x1, y1] (pixels of the model's input
    image), "size": [W, H], "png": a data URL}``, the PNG the image as the model saw it, scaled to
    ``size`` pixels wide (nearest neighbour), the patch outlined."""
    import base64
    import io

    from PIL import ImageDraw

    W, H = image.size
    f = max(1, size // max(W, 1))
    big = image.resize((W * f, H * f), resample=0)
    ImageDraw.Draw(big).rectangle([box[0] * f, box[1] * f, box[2] * f - 1, box[3] * f - 1], outline=(255, 0, 0),
                                  width=max(2, f // 4))
    buf = io.BytesIO()
    big.save(buf, format="PNG")
    return {"position": int(position), "label": label, "box": [int(x) for x in box], "size": [W, H],
            "png": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")}


def argmax_token_to_dict(full: dict, stage: int, tid: int, tokenizer) -> dict:
    """``/api/argmax``: one token's entries of ``argmax --json`` (``full``, that dict): its verdict and
    margin (per_token), its full record when flagged (certificate's combination, reason), its duplicate
    group, its reachable probability under the final norm when probed, the ``stage`` that settled it
    (an index of :data:`vocablens.argmax.exact.STAGES`, -1: none), and the scan's summary."""
    from vocablens.argmax.exact import STAGES

    names = full["per_token"]["verdict_names"]
    flagged = {it["id"]: it for it in full["unargmaxable"] + full["undecided"]}
    rec: dict[str, Any] = {"id": tid, "token": token_str(tokenizer, tid),
                           "verdict": names[full["per_token"]["verdict"][tid]],
                           "stage": STAGES[stage] if stage >= 0 else None,
                           "margin": full["per_token"]["margin"][tid]}
    rec.update(flagged.get(tid, {}))
    rec["duplicates"] = next((g for g in full["duplicates"] if tid in g["ids"]), None)
    norm = full["norm"]
    rec["norm"] = None if norm is None else next((t for t in norm["tokens"] if t["id"] == tid), None)
    rec["scan"] = {k: full[k] for k in SCAN_KEYS}
    rec["status"] = "done"
    rec["model"] = full["model"]
    return rec


def undertrained_token_to_dict(index, verified: dict[int, dict], tid: int, tokenizer, provenance) -> dict:
    """``/api/undertrained``: one token's under-training figures from ``index`` (an
    :class:`~vocablens.undertrained.analysis.UndertrainedResult`): its tokenizer ``class``, the
    ``indicator`` (name, value, ``rank`` among the testable tokens from the lowest, 0-based, and
    ``candidate``: within the paper's lowest 2%), ``verification`` (``max_prob``, ``verdict``) when an
    earlier run prompted it (``verified``; else null), ``verdict`` (``under-trained``, ``trained``,
    ``not tested``), and the vocabulary's ``counts`` per class."""
    from vocablens.undertrained.analysis import testable

    ind = index.indicators
    ok = testable(index.classes)
    value = float(ind.values[tid])
    is_testable = bool(ok[tid])
    rank = int((ind.values[ok] < value).sum()) if is_testable else None
    ver = verified.get(tid)
    return json_ready({
        "id": tid, "token": token_str(tokenizer, tid), "class": index.classes.name(tid),
        "testable": is_testable,
        "indicator": {"name": ind.name, "value": value, "rank": rank, "of": int(ok.sum()),
                      "candidate": bool((index.candidates == tid).any()),
                      "threshold": index.indicator_threshold, "reference": ind.reference_kind},
        "verification": ver, "verdict": "not tested" if ver is None else ver["verdict"],
        "verified_run": bool(verified), "counts": index.counts(), "model": provenance.to_dict()})


def health_to_dict(lm, tuned_note: str, jacobian_note: str | None = None) -> dict:
    """``GET /api/health``: the model's name and provenance, its sizes, whether a tuned lens and a
    Jacobian lens are loaded (``"loaded"``, else why not), and whether the tokenizer puts BOS in front
    of a text by itself (``adds_bos``; without it the first position of every map is an attention
    sink, not a reading of the text)."""
    b = lm.borders
    d = {"model": lm.provenance.name, "provenance": lm.provenance.to_dict(),
         "n_layers": b.n_layers, "vocab_size": b.vocab_size, "real_vocab_size": b.real_vocab_size,
         "d_model": b.d_emb, "tuned": tuned_note, "adds_bos": adds_bos(lm.tokenizer)}
    if jacobian_note is not None:
        d["jacobian"] = jacobian_note
    return json_ready(d)


__all__ = ["SCAN_KEYS", "argmax_token_to_dict", "health_to_dict", "lens_response", "undertrained_token_to_dict"]
