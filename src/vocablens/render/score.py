"""Terminal and JSON rendering of a text's score (``vocablens score``).

The ``score`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vocablens.models.tokens import quoted, token_str
from vocablens.generate.score import ScoreResult
from vocablens.units import plural
from vocablens.render.renderer import Renderer, model_of


def score_to_dict(res: ScoreResult, tokenizer) -> dict:
    """Plain data for ``--json``: per-token log-probabilities (nats), totals and top-k alternatives."""
    ids = res.input_ids.tolist()
    tokens = []
    for j in range(res.logprobs.numel()):
        tokens.append({
            "position": j + 1,
            "id": ids[j + 1],
            "token": token_str(tokenizer, ids[j + 1]),
            "logprob": float(res.logprobs[j]),
            "entropy": float(res.entropy[j]),
            "top_k": [{"id": int(i), "token": token_str(tokenizer, int(i)), "logprob": float(lp)}
                      for i, lp in zip(res.topk_ids[j].tolist(), res.topk_logprobs[j].tolist())],
        })
    return {
        "n_tokens": len(ids),
        "n_scored": res.logprobs.numel(),
        "first_token": {"id": ids[0], "token": token_str(tokenizer, ids[0])},
        "total_logprob": res.total_logprob,
        "n_bytes": res.n_bytes,
        "logprob_per_byte": res.logprob_per_byte,
        "bits_per_byte": res.bits_per_byte,
        "perplexity": res.perplexity,
        "tokens": tokens,
    }


def score_table(res: ScoreResult, tokenizer, max_rows: int = 200) -> Table:
    """One row per scored token: position, id, token, log-prob, entropy and the top-k alternatives."""
    t = Table(title="per-token log-probabilities (nats)", title_justify="left")
    t.add_column("pos", justify="right")
    t.add_column("id", justify="right")
    t.add_column("token")
    t.add_column("logprob", justify="right")
    t.add_column("entropy", justify="right")
    if res.topk_ids.shape[-1]:
        t.add_column("top alternatives (logprob)")
    ids = res.input_ids.tolist()
    n = res.logprobs.numel()
    for j in range(min(n, max_rows)):
        row = [str(j + 1), str(ids[j + 1]), quoted(token_str(tokenizer, ids[j + 1])), f"{float(res.logprobs[j]):.3f}",
               f"{float(res.entropy[j]):.3f}"]
        if res.topk_ids.shape[-1]:
            row.append(", ".join(f"{quoted(token_str(tokenizer, i))} {lp:.2f}" for i, lp in
                                 zip(res.topk_ids[j].tolist(), res.topk_logprobs[j].tolist())))
        t.add_row(*row)
    if n > max_rows:
        t.caption = f"{n - max_rows} more rows (use --json for all)"
    return t


def print_score(res: ScoreResult, tokenizer, out: Console, provenance=None) -> None:
    """Print the per-token table and the totals line on the rich console ``out`` (the CLI's stdout console)."""
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim")
    out.print(score_table(res, tokenizer))
    out.print(f"total log-prob {res.total_logprob:.3f} nats over {plural(res.logprobs.numel(), 'token')} "
              f"({res.n_bytes} bytes): {res.logprob_per_byte:.4f} nats/byte, "
              f"{res.bits_per_byte:.4f} bits/byte, perplexity {res.perplexity:.2f}")


# ---------- the renderers of a score result (vocablens.handle.results.Score)
def _json_of(r) -> dict:
    return {**score_to_dict(r.value, r.tokenizer), **model_of(r)}


def _print_of(r, out) -> None:
    print_score(r.value, r.tokenizer, out, r.provenance)


def _rows_of(r) -> list[dict]:
    """A row per scored token (position 1.. of the ids): its log-probability and the entropy (nats)."""
    res = r.value
    ids = res.input_ids.tolist()
    return [{"position": j + 1, "id": ids[j + 1], "token": token_str(r.tokenizer, ids[j + 1]),
             "logprob": float(res.logprobs[j]), "entropy": float(res.entropy[j])} for j in range(res.logprobs.numel())]


#: how a ``score`` result shows itself
RENDERER = Renderer("score", _json_of, _print_of, None, _rows_of)
