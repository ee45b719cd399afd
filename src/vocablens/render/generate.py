"""Rendering a generation: streamed text deltas, the ``--json`` document, and the early-exit summary.

The ``generate`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from vocablens.models.tokens import token_str
from vocablens.units import plural
from vocablens.render.renderer import Renderer


class TextStream:
    """Turns the growing list of new ids into text deltas as they arrive.

    Decodes everything generated so far and returns what was not printed yet; a trailing partial
    UTF-8 character (decoded as U+FFFD) is held back until the token that completes it arrives.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.printed = 0

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one id; return the new printable text (may be empty)."""
        self.ids.append(int(token_id))
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        delta, self.printed = text[self.printed:], len(text)
        return delta

    def flush(self) -> str:
        """Whatever is still held back (at the end of generation)."""
        text = self._text()
        delta, self.printed = text[self.printed:], len(text)
        return delta


def _r(x: float, n: int = 6) -> float:
    return round(float(x), n)


def early_exit_to_dict(res) -> dict:
    """The early-exit fields: the rule, per-step exit layers, the mean fraction of blocks run over the
    decode steps (the first token comes from the prefill, which runs every block), lens reads and
    FLOPs (``total`` against ``full_model`` for the same tokens)."""
    rule, L, steps = res.rule, int(res.n_layers), res.steps
    from_steps = [s.exit_layer for s in steps]
    d = {
        "lens": rule.lens, "threshold": rule.threshold, "min_layer": rule.min_layer, "exit_test": rule.test,
        "kv_fill": "CALM state propagation: the exit state feeds the skipped blocks' K/V projections",
        "exit_layers": from_steps,
        "mean_blocks_fraction": _r(sum(from_steps) / (len(steps) * L)) if steps and L else None,
        "exited_early": sum(1 for e in from_steps if L and e < L),
        "full_lens_reads": sum(s.full_reads for s in steps),
        "candidate_lens_reads": sum(s.row_reads for s in steps),
        "flops": {k: float(v) for k, v in res.flops.items()},
    }
    if res.flops.get("full_model"):
        d["flops_fraction"] = _r(res.flops["total"] / res.flops["full_model"])
    return d


def generation_to_dict(res, tokenizer) -> dict:
    """``{"text", "tokens": [{"id", "token", "logprob", "top": [{"id", "token", "logprob"}]}],
    "prefill_head_flops_saved", "time_s", "tokens_per_s"}``, plus ``"early_exit"`` (and each token's
    ``"exit_layer"``) when an exit rule was used. Logprobs in nats."""
    toks = []
    for t in res.tokens:
        e = {"id": t.id, "token": token_str(tokenizer, t.id), "logprob": _r(t.logprob),
             "top": [{"id": i, "token": token_str(tokenizer, i), "logprob": _r(v)} for i, v in t.top]}
        if res.rule is not None:
            e["exit_layer"] = t.exit_layer
        toks.append(e)
    d = {
        "text": tokenizer.decode(res.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
        "tokens": toks,
        "prefill_head_flops_saved": int(res.prefill_head_flops_saved),
        "time_s": _r(res.time_s, 4),
        "tokens_per_s": _r(res.tokens_per_s, 3),
    }
    if res.rule is not None:
        d["early_exit"] = early_exit_to_dict(res)
    return d


def _flops(x: float) -> str:
    for unit, f in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(x) >= f:
            return f"{x / f:.2f} {unit}"
    return f"{x:.0f} FLOP"


def summary_lines(res) -> list[str]:
    """One-line notes for stderr after the streamed text."""
    n, T = len(res.tokens), int(res.prompt_ids.numel())
    lines = [f"{plural(n, 'new token')} in {res.time_s:.2f} s ({res.tokens_per_s:.2f} tokens/s; prefill of {T} tokens "
             f"{res.prefill_s:.2f} s); last-position head saved {_flops(res.prefill_head_flops_saved)} at prefill"]
    if res.rule is not None:
        d = early_exit_to_dict(res)
        fl = d["flops"]
        frac = d["mean_blocks_fraction"]
        lines.append(
            f"early exit ({d['lens']} lens, threshold {d['threshold']}, from layer {d['min_layer']}, "
            f"{d['exit_test']} test): {d['exited_early']}/{len(res.steps)} decode steps exited early, "
            f"blocks run {frac:.1%}" if frac is not None else "early exit: no decode steps")
        if fl.get("full_model"):
            lines.append(
                f"FLOPs: blocks {_flops(fl['blocks'])} + K/V fill {_flops(fl['kv_fill'])} + lens reads "
                f"{_flops(fl['lens'])} + head {_flops(fl['head'])} = {_flops(fl['total'])}, "
                f"{fl['total'] / fl['full_model']:.2f}x the full model's {_flops(fl['full_model'])}")
    return lines


# ---------- the renderers of a generate result (vocablens.handle.results.Generation)
def _json_of(r) -> dict:
    return generation_to_dict(r.value, r.tokenizer)


def _print_of(r, out) -> None:
    out.print(generation_to_dict(r.value, r.tokenizer)["text"], markup=False, highlight=False)
    for line in summary_lines(r.value):
        out.print(line, style="dim")


def _rows_of(r) -> list[dict]:
    """A row per new token: its step (1..), id, token, log-probability (nats), the alternatives kept and,
    under an exit rule, the layer it exited at."""
    res = r.value
    rows = []
    for n, t in enumerate(res.tokens, start=1):
        row = {"step": n, "id": t.id, "token": token_str(r.tokenizer, t.id), "logprob": float(t.logprob),
               "top_tokens": [token_str(r.tokenizer, int(i)) for i, _ in t.top],
               "top_logprobs": [float(v) for _, v in t.top]}
        if res.rule is not None:
            row["exit_layer"] = t.exit_layer
        rows.append(row)
    return rows


#: how a ``generate`` result shows itself
RENDERER = Renderer("generate", _json_of, _print_of, None, _rows_of)


__all__ = ["RENDERER", "TextStream", "early_exit_to_dict", "generation_to_dict", "summary_lines"]
