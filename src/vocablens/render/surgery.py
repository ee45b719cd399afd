"""Terminal rendering of vocabulary surgery (rich tables): what was added or trimmed, and the proof.

The ``surgery`` result's renderers (its JSON, printed table, figure and rows) are registered here as
:data:`RENDERER` (:data:`vocablens.render.shown.RENDERERS`).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from vocablens.surgery.expand import ExpandResult
from vocablens.surgery.trim import TrimResult
from vocablens.surgery.verify import ExpandVerification, TrimVerification
from vocablens.units import fmt_bytes, plural
from vocablens.errors import BadInput
from vocablens.render.renderer import Renderer


def expand_to_dict(res: ExpandResult, v: ExpandVerification, out_path, provenance=None) -> dict:
    """The dict ``expand --json`` prints: ``{"model", "out", "expansion", "verification"}``."""
    return {**({"model": provenance.to_dict()} if provenance is not None else {}),
            "out": None if out_path is None else str(out_path),
            "expansion": res.to_dict(), "verification": v.to_dict()}


def trim_to_dict(res: TrimResult, v: TrimVerification, out_path, corpus: str | None, docs_checked: int,
                 docs_different: int, provenance=None) -> dict:
    """The dict ``trim --json`` prints: ``{"model", "out", "corpus", "trim", "verification"}`` (the
    verification with the corpus documents checked and those the new tokenizer splits differently)."""
    return {**({"model": provenance.to_dict()} if provenance is not None else {}),
            "out": None if out_path is None else str(out_path),
            "corpus": corpus, "trim": res.to_dict(),
            "verification": {**v.to_dict(), "corpus_documents_checked": docs_checked,
                             "corpus_documents_tokenized_differently": docs_different}}


def new_tokens_table(res: ExpandResult) -> Table:
    """One row per added token: id, old tokenization, init method."""
    t = Table(title=f"added {plural(len(res.new_tokens), 'token')} ({'special' if res.special else 'normal'})",
              title_justify="left")
    t.add_column("token")
    t.add_column("id", justify="right")
    t.add_column("old tokenization")
    t.add_column("init")
    for nt in res.new_tokens:
        init = nt.init + (" (empty tokenization: global mean)" if nt.fallback else "")
        if nt.in_padding_row:
            init += ", in a padding row"
        t.add_row(repr(nt.token), str(nt.id), " | ".join(repr(p) for p in nt.old_pieces) or "(nothing)", init)
    return t


def expand_verification_table(res: ExpandResult, v: ExpandVerification) -> Table:
    """The proof: mass against Hewitt's bound, KL, perplexity before/after."""
    t = Table(title=f"verification on held-out text ({plural(v.positions, 'position')})", title_justify="left")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("reference", justify="right")
    bound_note = "bound k/(V+k)" + ("" if res.init == "mean" else " (holds for init=mean)")
    t.add_row("probability mass of the new tokens (mean)", f"{v.new_token_mass:.3e}", f"{v.mass_bound:.3e} {bound_note}")
    t.add_row("  (max over positions)", f"{v.new_token_mass_max:.3e}", "")
    t.add_row("KL(old ‖ new), nats (mean)", f"{v.kl_old_new:.3e}", f"{v.kl_bound:.3e} log(1+k/V)")
    t.add_row("perplexity before", f"{v.perplexity_before:.4f}", plural(v.tokens_before, "token"))
    t.add_row("perplexity after", f"{v.perplexity_after:.4f}", plural(v.tokens_after, "token"))
    t.add_row("relative change", f"{v.perplexity_relative_change:+.2e}",
              f"new tokens in the text: {v.new_tokens_in_text}")
    t.add_row("max |Δ logit| on the old vocabulary", f"{v.old_logits_max_abs_diff:.2e}", "0 = old rows untouched")
    return t


def print_expand(res: ExpandResult, v: ExpandVerification, out_path, console, provenance=None) -> None:
    """Print what ``expand`` did and its verification on a rich ``console`` (the CLI's stdout)."""
    out = console
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim")
    out.print(new_tokens_table(res))
    grew = (f"grew {res.rows_before:,} -> {plural(res.rows_after, 'row')}" if res.rows_after > res.rows_before
            else f"{plural(res.rows_after, 'row')} (new ids in existing padding rows)")
    out.print(f"{grew}; tokenizer {res.tokenizer_size_before:,} -> {res.tokenizer_size_after:,}; "
              f"{'tied (one matrix, still shared)' if res.tied else 'untied (embedding and head both set)'}"
              f"{'; head bias extended' if res.has_bias else ''}")
    for n in res.notes:
        out.print(Text.assemble(("note:", "yellow"), f" {n}"))
    out.print(expand_verification_table(res, v))
    if res.init == "mean" and v.new_token_mass_max > v.mass_bound:
        out.print(Text.assemble(("warning:", "bold red"), f" the new tokens take {v.new_token_mass_max:.3e} of the mass "
                                f"at some position, above Hewitt's bound {v.mass_bound:.3e} (a softcap or logit "
                                "scale breaks the bound)"))
    out.print(f"sample before: {' | '.join(repr(s) for s in v.sample_before)}")
    out.print(f"sample after:  {' | '.join(repr(s) for s in v.sample_after)}")
    out.print(f"wrote {out_path}" if out_path is not None else "not saved yet: .save(DIR) writes it")


def trim_table(res: TrimResult, v: TrimVerification) -> Table:
    """Rows, parameters and bytes saved, and the equality check."""
    t = Table(title="vocabulary trim", title_justify="left")
    t.add_column("measure")
    t.add_column("before", justify="right")
    t.add_column("after", justify="right")
    t.add_row("matrix rows (V)", f"{res.rows_before:,}", f"{res.rows_after:,}")
    t.add_row("tokenizer size", f"{res.tokenizer_size_before:,}", f"{res.tokenizer_size_after:,}")
    t.add_row("BPE merges", f"{res.merges_before:,}", f"{res.merges_after:,}")
    t.add_row("parameters" + (" (tied matrix once)" if res.tied else ""), f"{res.params_before:,}",
              f"{res.params_after:,}")
    t.add_row("parameter memory", fmt_bytes(res.params_before * res.bytes_per_param),
              fmt_bytes(res.params_after * res.bytes_per_param))
    return t


def print_trim(res: TrimResult, v: TrimVerification, out_path, console, provenance=None,
               corpus_docs: int | None = None, corpus_docs_different: int = 0) -> None:
    """Print what ``trim`` saved and its equality check on a rich ``console`` (the CLI's stdout)."""
    out = console
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim")
    out.print(trim_table(res, v))
    frac = res.params_saved / res.params_before if res.params_before else 0.0
    out.print(f"kept {plural(res.rows_after, 'token')}: {res.used_tokens:,} used by the corpus + "
              f"{res.kept_for_lossless:,} specials, bytes and merge parts; saved {plural(res.rows_saved, 'row')}, "
              f"{plural(res.params_saved, 'parameter')} ({frac:.1%}), {fmt_bytes(res.bytes_saved)}")
    out.print(f"check on {plural(v.texts, 'corpus text')} ({plural(v.positions, 'position')}): tokenization "
              f"{'identical (ids mapped)' if v.tokenization_identical else 'DIFFERENT'}; max |Δ logit| "
              f"{v.logits_max_abs_diff:.2e}; max |Δ log-prob| vs the original renormalised over kept tokens "
              f"{v.logprobs_max_abs_diff:.2e}; the original put {v.dropped_mass:.2%} of its mass on dropped tokens; "
              f"perplexity {v.perplexity_before:.3f} -> {v.perplexity_after:.3f}")
    if corpus_docs:
        out.print(f"the trimmed tokenizer encodes {corpus_docs - corpus_docs_different:,} of {corpus_docs:,} corpus "
                  f"documents exactly as the original (ids mapped)")
    out.print(f"wrote {out_path} (old -> new id map in vocab_map.json)" if out_path is not None
              else "not saved yet: .save(DIR) writes it (with the old -> new id map)")


# ---------- the renderers of a surgery result (vocablens.handle.results.Surgery)
def _json_of(r) -> dict:
    o = r.options
    if o["command"] == "expand":
        return {**expand_to_dict(r.value, o["verification"], o.get("out"), r.provenance), "indicator": o["indicator"]}
    drop = o.get("drop")
    return {**trim_to_dict(r.value, o["verification"], o.get("out"), o.get("corpus"), o["docs_checked"],
                           o["mismatches"], r.provenance), "undertrained": None if drop is None else drop.to_dict()}


def _print_of(r, out) -> None:
    o = r.options
    if o["command"] == "expand":
        from vocablens.render.surgery_undertrained import new_rows_table

        print_expand(r.value, o["verification"], o.get("out"), out, r.provenance)
        out.print(new_rows_table(o["indicator"]))
        return
    print_trim(r.value, o["verification"], o.get("out"), out, r.provenance, corpus_docs=o["docs_checked"],
               corpus_docs_different=o["mismatches"])
    if o.get("drop") is not None:
        from vocablens.render.surgery_undertrained import print_drop

        print_drop(o["drop"], out)


def _rows_of(r) -> list[dict]:
    """``expand``: a row per added token (id, its old tokenization, the init, and where it lands on the
    under-training indicator). A trim's record is not tabular."""
    o = r.options
    if o["command"] != "expand":
        raise BadInput("a trim's record is not tabular; .to_json() holds it")
    ind = {t["id"]: t for t in o["indicator"]["new_tokens"]}
    return [{"token": nt.token, "id": nt.id, "old_pieces": list(nt.old_pieces), "init": nt.init,
             "fallback": nt.fallback, "in_padding_row": nt.in_padding_row,
             "indicator": ind.get(nt.id, {}).get("value"), "percentile": ind.get(nt.id, {}).get("percentile"),
             "looks_undertrained": ind.get(nt.id, {}).get("looks_undertrained")} for nt in r.value.new_tokens]


#: how a ``surgery`` result (an expand or a trim) shows itself
RENDERER = Renderer("surgery", _json_of, _print_of, None, _rows_of)
