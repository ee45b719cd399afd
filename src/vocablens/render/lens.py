"""Terminal rendering of a lens result (rich tables)."""

from __future__ import annotations

from rich.table import Table

from vocablens.cli.common import out  # noqa: F401  (render never prints elsewhere)
from vocablens.lens.logit import LensResult
from vocablens.models.tokens import token_str


def lens_table(res: LensResult, tokenizer, j: int = 0) -> Table:
    """A table: one row per layer at the j-th position read."""
    pos = int(res.positions[j])
    tokens = res.input_ids.tolist()
    title = (f"{res.kind} lens at position {pos} (after {token_str(tokenizer, tokens[pos])!r}); "
             f"final top-1 {token_str(tokenizer, int(res.final_top1[j]))!r}")
    t = Table(title=title, title_justify="left")
    t.add_column("layer", justify="right")
    t.add_column("top tokens (prob)")
    t.add_column("entropy", justify="right")
    t.add_column("KL(final‖layer)", justify="right")
    t.add_column("rank of final top-1", justify="right")
    for ly in res.layers:
        toks = ", ".join(f"{token_str(tokenizer, i)!r} {p:.3f}" for i, p in
                         zip(ly.top_ids[j].tolist(), ly.top_probs[j].tolist()))
        t.add_row(str(ly.layer), toks, f"{float(ly.entropy[j]):.3f}", f"{float(ly.kl_to_final[j]):.3f}",
                  str(int(ly.final_top1_rank[j])))
    return t


def print_lens(res: LensResult, tokenizer, provenance=None) -> None:
    from vocablens.cli.common import out

    if provenance is not None:
        out.print(f"[dim]model: {provenance.describe()}[/dim]")
    for j in range(len(res.positions)):
        out.print(lens_table(res, tokenizer, j))
    out.print(f"[dim]layer {res.n_layers} vs the model's own output: max |Δp| = {res.model_max_abs_diff:.2e}[/dim]")
