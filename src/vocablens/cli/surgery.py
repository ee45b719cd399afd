"""Vocabulary surgery commands: ``vocablens expand`` (add tokens) and ``vocablens trim`` (keep a corpus's tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, emit_json, err, load_model, out, status
from vocablens.errors import BadInput
from vocablens.units import plural

OutOpt = Annotated[str, typer.Option("--out", "-o", help="Output directory (a Hugging Face model directory).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")]


def _read_lines(path: str) -> list[str]:
    from vocablens.files import read_text

    text = read_text(path)
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n") if ln.strip()]


@app.command("expand")
def expand(
    model: ModelOpt = "smollm2",
    add: Annotated[Optional[list[str]], typer.Option("--add", help="A token to add (repeat); quote leading spaces: --add ' vocablens'.")] = None,
    add_file: Annotated[str, typer.Option("--add-file", help="File with one token per line (kept verbatim, blank lines skipped).")] = "",
    out_dir: OutOpt = "",
    init: Annotated[str, typer.Option("--init", help="subtoken-mean (default), mean, interpolate, zeros, random.")] = "subtoken-mean",
    interpolation: Annotated[float, typer.Option("--interpolation", help="Weight of the subtoken mean for --init interpolate.")] = 0.5,
    special: Annotated[bool, typer.Option("--special", help="Add as special tokens.")] = False,
    eval_corpus: Annotated[str, typer.Option("--eval-corpus", help="Held-out text: validation split of this corpus (name or path).")] = "pydoc-topics",
    eval_text: Annotated[str, typer.Option("--eval-text", help="Held-out text given directly (instead of --eval-corpus).")] = "",
    eval_texts: Annotated[int, typer.Option("--eval-texts", help="Number of held-out chunks.")] = 4,
    eval_chars: Annotated[int, typer.Option("--eval-chars", help="Characters per held-out chunk.")] = 800,
    sample: Annotated[str, typer.Option("--sample", help="Sentence shown tokenized before and after (default: built from the new tokens).")] = "",
    seed: Annotated[int, typer.Option("--seed", help="Seed for --init random.")] = 0,
    force: ForceOpt = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Add tokens: subtoken-mean rows on both ends (tied stays tied), verified on held-out text."""
    from vocablens.render.surgery import expand_to_dict, print_expand
    from vocablens.surgery import expand_vocab, verify_expansion
    from vocablens.surgery.io import check_out, chunk_texts, heldout_texts, save_model_dir

    out_path = check_out(out_dir, force)
    tokens = list(add or []) + (_read_lines(add_file) if add_file else [])
    if not tokens:
        raise BadInput("no tokens to add: give --add TOKEN (repeatable) or --add-file FILE")
    if eval_texts < 1 or eval_chars < 10:
        raise BadInput("--eval-texts must be >= 1 and --eval-chars >= 10")
    texts = chunk_texts([eval_text], eval_texts, eval_chars) if eval_text.strip() else \
        heldout_texts(eval_corpus, eval_texts, eval_chars)
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    with status("expanding the vocabulary ...", quiet=json_):
        ex = expand_vocab(lm.model, lm.tokenizer, tokens, init=init, special=special,
                          interpolation=interpolation, seed=seed)
    res = ex.result
    sample = sample or ("In this note," + "".join(t if t.startswith(" ") else " " + t for t in tokens) + ".")
    with status("verifying on held-out text ...", quiet=json_):
        v = verify_expansion(lm.model, lm.tokenizer, ex.model, ex.tokenizer, res.new_ids, texts,
                             res.trained_rows_head, sample)
    from vocablens.models import Borders
    from vocablens.render.surgery_undertrained import new_rows_table, new_rows_to_dict
    from vocablens.undertrained.newrows import new_row_indicators

    with status("the new rows' under-training indicator ...", quiet=json_):
        nb, idx = Borders.from_model(ex.model, ex.tokenizer), res.new_ids
        ind = new_rows_to_dict(res, new_row_indicators(lm.borders, lm.tokenizer, nb.W_E[idx],
                                                       None if nb.tied else nb.W_U[idx]))
    record = {"command": "expand", "source_model": lm.provenance.to_dict(), "expansion": res.to_dict(),
              "verification": v.to_dict(), "indicator": ind}
    with status(f"writing {out_path} ...", quiet=json_):
        save_model_dir(ex.model, ex.tokenizer, out_path, force=force, probe_texts=[sample, *texts], extra_json={"vocablens_surgery.json": record})
    if json_:
        emit_json({**expand_to_dict(res, v, out_path, lm.provenance), "indicator": ind})
    else:
        print_expand(res, v, out_path, out, lm.provenance)
        out.print(new_rows_table(ind))


@app.command("trim")
def trim(
    model: ModelOpt = "smollm2",
    corpus: Annotated[str, typer.Option("--corpus", help="Corpus whose tokens to keep: a file, a directory or a named corpus (pydoc-topics, python-docs, debian-handbook ...).")] = "",
    token_list: Annotated[str, typer.Option("--token-list", help="File of tokens to keep: one id or vocabulary string per line (with or instead of --corpus).")] = "",
    out_dir: OutOpt = "",
    max_docs: Annotated[int, typer.Option("--max-docs", help="Read at most this many corpus documents (0 = all).")] = 0,
    verify_texts: Annotated[int, typer.Option("--verify-texts", help="Corpus documents the trimmed model is checked on.")] = 3,
    verify_tokens: Annotated[int, typer.Option("--verify-tokens", help="Tokens read from the start of each check document.")] = 128,
    drop_undertrained: Annotated[bool, typer.Option("--drop-undertrained", help="Also remove the tokens `vocablens undertrained` verifies as under-trained (documents holding one are spelled with other tokens and left out of the check).")] = False,
    undertrained_candidates: Annotated[int, typer.Option("--undertrained-candidates", help="With --drop-undertrained: lowest-indicator tokens to verify.")] = 500,
    force: ForceOpt = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Keep only the tokens a corpus uses (plus specials, bytes, merge parts); slice both matrices."""
    from vocablens.corpus import load_documents
    from vocablens.render.surgery import print_trim, trim_to_dict
    from vocablens.surgery import corpus_token_ids, trim_vocab, verify_trim
    from vocablens.surgery.io import check_out, save_model_dir
    from vocablens.surgery.trim import read_token_list, tokenization_mismatches
    from vocablens.surgery.verify import accept_trim

    out_path = check_out(out_dir, force)
    if not corpus and not token_list:
        raise BadInput("give --corpus F (or --token-list F): the tokens to keep")
    if undertrained_candidates < 1:
        raise BadInput(f"--undertrained-candidates must be >= 1; got {undertrained_candidates}")
    with status(f"reading the corpus {corpus} ...", quiet=json_ or not corpus):
        texts = [d.text for d in load_documents(corpus, max_docs=max_docs or None)] if corpus else []
    token_lines = _read_lines(token_list) if token_list else []
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    from vocablens.cli.progress import stage_progress

    cb, close = stage_progress("trim", "documents", quiet=json_ or not texts)
    try:
        used = corpus_token_ids(lm.tokenizer, texts, progress=cb) | read_token_list(token_lines, lm.tokenizer)
    finally:
        close()
    seeds, ut, drop = used, None, None
    if drop_undertrained:
        from vocablens.surgery import trim_undertrained as tu

        cb, close = stage_progress("trim: under-trained tokens", "prompts", quiet=json_,
                                   units={"tokenizer classes": "tokens", "indicators": "tokens"})
        try:  # the lowest-indicator tokens, verified by prompting (stages as `vocablens undertrained`)
            ut = tu.verified_undertrained(lm.borders, lm.tokenizer, undertrained_candidates, progress=cb)
        finally:
            close()
        seeds, rows_without = tu.drop_undertrained(lm.model, lm.tokenizer, used, ut.verified.tolist())
    with status("trimming the vocabulary ...", quiet=json_):
        tr = trim_vocab(lm.model, lm.tokenizer, seeds)
    checked = texts
    if ut is not None:  # documents holding a dropped token are spelled otherwise: left out of the check
        gone = set(ut.verified.tolist()) - set(tr.kept_old_ids)
        checked, respelled = tu.check_documents(lm.tokenizer, texts, gone)
        drop = tu.summarize(ut, used, tr.kept_old_ids, rows_without, respelled)
    # whole documents (cut by tokens, not characters: the tokenizer is lossless on corpus texts)
    checks = checked[:verify_texts] if checked else [lm.tokenizer.decode(sorted(seeds)[:200])]
    with status(f"checking the trimmed model against the original on {plural(len(checks), 'text')} ...", quiet=json_):
        v = verify_trim(lm.model, lm.tokenizer, tr.model, tr.tokenizer, tr.kept_old_ids, checks,
                        max_tokens=verify_tokens)
    cb, close = stage_progress("trim", "documents", quiet=json_ or not checked)
    try:
        mismatches = tokenization_mismatches(lm.tokenizer, tr.tokenizer, tr.kept_old_ids, checked, progress=cb)
    finally:
        close()
    accept_trim(v, mismatches)
    vocab_map = {"kept_old_ids": tr.kept_old_ids, "old_to_new": {str(o): n for n, o in enumerate(tr.kept_old_ids)},
                 "rows_before": tr.result.rows_before}
    record = {"command": "trim", "source_model": lm.provenance.to_dict(), "corpus": corpus or None,
              "trim": tr.result.to_dict(), "verification": v.to_dict(), "corpus_documents_checked": len(checked),
              "undertrained": None if drop is None else drop.to_dict()}
    with status(f"writing {out_path} ...", quiet=json_):
        save_model_dir(tr.model, tr.tokenizer, out_path, force=force, probe_texts=checks,
                       extra_json={"vocab_map.json": vocab_map, "vocablens_surgery.json": record})
    if json_:
        emit_json({**trim_to_dict(tr.result, v, out_path, corpus or None, len(checked), mismatches, lm.provenance),
                   "undertrained": None if drop is None else drop.to_dict()})
    else:
        print_trim(tr.result, v, out_path, out, lm.provenance, corpus_docs=len(checked), corpus_docs_different=mismatches)
        if drop is not None:
            from vocablens.render.surgery_undertrained import print_drop

            print_drop(drop, out)
    err.print(f"id map: {out_path / 'vocab_map.json'}", style="dim") if not json_ else None
