"""What each kind of :class:`vocablens.handle.Result` prints: the command's own output on a rich console
(the CLI's stdout console, or :mod:`vocablens.render.shown`'s recording one for ``.table()`` and notebook
HTML). One function per kind, each calling the renderers the command has always printed with."""

from __future__ import annotations


def print_anatomy(r, out):
    from vocablens.render.anatomy import print_anatomy

    print_anatomy([r.value], out)


def print_neighbors(r, out):
    from vocablens.render.geometry import print_neighbors

    print_neighbors(r.value, r.tokenizer, out)


def print_lens(r, out):
    from rich.text import Text

    from vocablens.render.lens import print_lens

    batch = r.options.get("batch")
    if batch:
        out.print(f"model: {r.provenance.describe()}", style="dim", soft_wrap=True)
    quality = {rec.get("kind"): rec.get("quality") for rec in r.options.get("lenses") or []}
    for i, (text, per_kind) in enumerate(zip(r.options["prompts"], r.value)):
        if batch:
            out.print(Text.assemble((f"prompt {i + 1}:", "bold"), f" {text}"), soft_wrap=True)
        for res in per_kind:
            print_lens(res, r.tokenizer, out, None if batch else r.provenance, quality.get(res.kind))


def print_score(r, out):
    from vocablens.render.ops import print_score

    print_score(r.value, r.tokenizer, out, r.provenance)


def print_explain(r, out):
    from vocablens.render import vocab_space as rv

    for t in rv.explanation_tables(r.value, r.tokenizer):
        out.print(t)
    out.print(rv.explanation_footer(r.value), style="dim")


def print_project(r, out):
    from vocablens.render import vocab_space as rv

    how = r.options.get("how", "vectors")
    t = (rv.search_table(r.value, r.tokenizer, r.options.get("tops")) if how == "search" else
         rv.interpretable_table(r.value, r.tokenizer) if how == "interpretable" else
         rv.circuit_table(r.value, r.tokenizer) if how == "circuit" else rv.vectors_table(r.value, r.tokenizer))
    out.print(t)


def print_settle(r, out):
    from vocablens.render.vocab_space import settle_tables

    for t in settle_tables(r.value):
        out.print(t)


def print_argmax(r, out):
    from vocablens.render.argmax import argmax_tables

    for t in argmax_tables(r.value, r.tokenizer):
        out.print(t)


def print_undertrained(r, out):
    from vocablens.render.undertrained import undertrained_tables, undertrained_to_dict

    for t in undertrained_tables(undertrained_to_dict(r.value, r.tokenizer, r.options.get("verdicts"))):
        out.print(t)


def print_generate(r, out):
    from vocablens.render.generate import generation_to_dict, summary_lines

    out.print(generation_to_dict(r.value, r.tokenizer)["text"], markup=False, highlight=False)
    for line in summary_lines(r.value):
        out.print(line, style="dim")


def print_steer(r, out):
    from vocablens.render.steer import print_steer

    print_steer(out, r.options["rows"], r.value, r.tokenizer, saved_to=r.options.get("saved_to") or "")


def print_surgery(r, out):
    from vocablens.render.surgery import print_expand, print_trim

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


def print_tie_check(r, out):
    from rich.table import Table

    t = Table(title="tying: by storage and by value", title_justify="left")
    t.add_column("")
    t.add_column("", justify="right")
    for k, v in r.value.to_dict().items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    out.print(t)


def print_pca(r, out):
    wp = r.value
    out.print(f"3-D PCA of {len(wp.words)} words in {len(set(wp.groups))} groups (input embedding)"
              + (f"; skipped (several tokens): {', '.join(wp.skipped)}" if wp.skipped else "")
              + ". .figure() draws it.")


__all__ = ["print_anatomy", "print_argmax", "print_explain", "print_generate", "print_lens", "print_neighbors", "print_pca", "print_project", "print_score", "print_settle", "print_steer", "print_surgery", "print_tie_check", "print_undertrained"]
