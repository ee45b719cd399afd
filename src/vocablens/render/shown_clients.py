"""Renderers (:mod:`vocablens.render.shown`) of the results whose workflows moved from the CLI and the
explorer into :class:`vocablens.Model`: a token's trajectory through the layers (the explorer's
``/api/trajectory``), the softmax bottleneck (``bottleneck``), an alignment of two models (``align``),
lens anomaly scores (``lens anomaly``), a tuned lens trained (``lens train``) and evaluated (``lens
eval``). Each JSON is what that surface answered before."""

from __future__ import annotations

from typing import Callable

from vocablens.models.tokens import token_str


def _model(r) -> dict:
    return {"model": r.provenance.to_dict()} if r.provenance is not None else {}


# ------------------------------------------------------------------------------------- trajectory
def _json_trajectory(r) -> dict:
    """``{"tokens", "position", "token", "token_id", "n_layers", "logit": {"rank" [L+1], "prob" [L+1],
    "top1" [L+1]}, "tuned": ... or null (no tuned lens read), ..., "model"}``."""
    o, tok = r.options, r.tokenizer
    labels = o.get("input_labels") or [None] * len(o["input_ids"])  # image positions: <image k/n>
    out = {"tokens": [lb or token_str(tok, i) for i, lb in zip(o["input_ids"].tolist(), labels)],
           "position": o["position"],
           "token": token_str(tok, o["token_id"]), "token_id": o["token_id"], "n_layers": o["n_layers"]}
    for name in dict.fromkeys(["logit", "tuned", *r.value]):
        t = r.value.get(name)
        out[name] = None if t is None else {"rank": t.target_rank.tolist(), "prob": t.logprob.exp().tolist(),
                                            "top1": [token_str(tok, i) for i in t.topk_ids[:, 0].tolist()]}
    return {**out, **_model(r)}


def _print_trajectory(r, out) -> None:
    from rich.table import Table

    d = _json_trajectory(r)
    kinds = [k for k in r.value]
    t = Table(title=f"{d['token']!r} at position {d['position']} ({d['tokens'][d['position']]!r}), every layer",
              title_justify="left")
    t.add_column("layer", justify="right")
    for k in kinds:
        t.add_column(f"{k} rank", justify="right")
        t.add_column(f"{k} prob", justify="right")
        t.add_column(f"{k} top-1")
    for layer in range(d["n_layers"] + 1):
        t.add_row(str(layer), *[x for k in kinds for x in (str(d[k]["rank"][layer]), f"{d[k]['prob'][layer]:.4f}",
                                                          repr(d[k]["top1"][layer]))])
    out.print(t)


# ------------------------------------------------------------------------------------- bottleneck
def _json_bottleneck(r) -> dict:
    from vocablens.render.argmax import bottleneck_to_dict

    return {**bottleneck_to_dict(r.value), "corpus": r.options.get("corpus"), **_model(r)}


def _print_bottleneck(r, out) -> None:
    from vocablens.render.argmax import bottleneck_tables

    for t in bottleneck_tables(r.value):
        out.print(t)


# ---------------------------------------------------------------------------------------- align
def _json_align(r) -> dict:
    from vocablens.render.align import alignment_to_dict

    other = r.options.get("other")
    return {**alignment_to_dict(r.value, r.options["best"]),
            "model_a": None if r.provenance is None else r.provenance.to_dict(),
            "model_b": None if other is None else other.to_dict()}


def _print_align(r, out) -> None:
    from vocablens.render.align import alignment_tables

    res = r.value
    vocab = "identical vocabularies" if res.shared.identical else f"{res.shared.size:,} shared tokens (mapped by string)"
    out.print(f"{res.what}: {vocab}; units compared by the correlation of their vocabulary-space projections")
    for t in alignment_tables(res, r.options["best"], *r.options["names"]):
        out.print(t)


# -------------------------------------------------------------------------------------- anomaly
def _json_anomaly(r) -> dict:
    from vocablens.render.anomaly import anomaly_to_dict

    o = r.options
    return anomaly_to_dict(r.value, o["kinds"], o["detectors"], o["texts"], o["labels"], r.provenance)


def _print_anomaly(r, out) -> None:
    from vocablens.render.anomaly import print_anomaly

    o = r.options
    print_anomaly(out, r.value, o["detectors"], o["texts"], o["labels"])


# ------------------------------------------------------------------------------ lens train / eval
def _json_lens_train(r) -> dict:
    from vocablens.render.tuned import train_summary_to_dict

    o = r.options
    return train_summary_to_dict(r.value, o["out"], o["steps"], o["seconds"], o["world_size"], o["data"])


def _print_lens_train(r, out) -> None:
    d = _json_lens_train(r)
    where = f"saved the tuned lens to {d['out']}" if d["out"] is not None else "trained a tuned lens"
    tps = f"{d['tokens_per_s']:.1f}" if d["tokens_per_s"] is not None else "?"
    loss = f"{d['final_loss']:.4f}" if d["final_loss"] is not None else "?"
    out.print(f"{where} ({d['tokens']} tokens in {r.options['seconds']:.0f} s, {tps} tokens/s; "
              f"final loss {loss} nats summed over layers)")


def _json_lens_eval(r) -> dict:
    from vocablens.render.tuned import eval_to_dict

    o = r.options
    return eval_to_dict(r.value, r.provenance, o["label"], o["data"], o.get("plot"), o["lenses"])


def _print_lens_eval(r, out) -> None:
    from vocablens.render.tuned import print_eval

    o = r.options
    print_eval(r.value, out, title=f"{r.provenance.name}, {o['tokens']} tokens of {o['data']['corpus']} "
                                   f"({o['split']}), lens {o['label']}")


#: kind -> (to_json, print); their figures and rows are in :mod:`vocablens.render.result_figures` and
#: :mod:`vocablens.render.frames` (:data:`vocablens.render.shown.RENDERERS` gathers them)
RENDERERS: dict[str, tuple[Callable, Callable]] = {
    "trajectory": (_json_trajectory, _print_trajectory),
    "bottleneck": (_json_bottleneck, _print_bottleneck),
    "align": (_json_align, _print_align),
    "anomaly": (_json_anomaly, _print_anomaly),
    "lens_train": (_json_lens_train, _print_lens_train),
    "lens_eval": (_json_lens_eval, _print_lens_eval),
}

__all__ = ["RENDERERS"]
