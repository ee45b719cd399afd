"""Vocabulary surgery commands: ``vocablens expand`` (add tokens) and ``vocablens trim`` (keep a corpus's tokens)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vocablens.handle import checks
from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, show, load_model, status
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL

OutOpt = Annotated[str, typer.Option("--out", "-o", help="Output directory (a Hugging Face model directory).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")]


def _read_lines(path: str) -> list[str]:
    from vocablens.files import read_text

    text = read_text(path)
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n") if ln.strip()]


@app.command("expand")
def expand(
    model: ModelOpt = DEFAULT_MODEL,
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
    from vocablens.surgery.io import check_out, chunk_texts, heldout_texts

    out_path = check_out(out_dir, force)
    tokens = list(add or []) + (_read_lines(add_file) if add_file else [])
    if not tokens:
        raise BadInput("no tokens to add: give --add TOKEN (repeatable) or --add-file FILE")
    checks.eval_text_options(eval_texts, eval_chars)
    texts = chunk_texts([eval_text], eval_texts, eval_chars) if eval_text.strip() else \
        heldout_texts(eval_corpus, eval_texts, eval_chars)   # a missing corpus: one line, before loading
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    new = lm.expand(tokens, init=init, interpolation=interpolation, special=special, sample=sample, seed=seed,
                    heldout=texts, status=lambda msg: status(msg, quiet=json_))
    with status(f"writing {out_path} ...", quiet=json_):
        new.save(out_path, force=force)
    show(new.surgery, json_)


@app.command("trim")
def trim(
    model: ModelOpt = DEFAULT_MODEL,
    corpus: Annotated[str, typer.Option("--corpus", help="Corpus whose tokens to keep: a file, a directory or a named corpus (pydoc-topics, python-docs, debian-handbook ...).")] = "",
    token_list: Annotated[str, typer.Option("--token-list", help="File of tokens to keep: one vocabulary string (the tokenizer's piece) or id:N per line (with or instead of --corpus).")] = "",
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
    from vocablens.surgery.io import check_out

    out_path = check_out(out_dir, force)
    if not corpus and not token_list:
        raise BadInput("give --corpus F (or --token-list F): the tokens to keep")
    checks.at_least_ge("undertrained_candidates", undertrained_candidates)
    with status(f"reading the corpus {corpus} ...", quiet=json_ or not corpus):
        texts = [d.text for d in load_documents(corpus, max_docs=max_docs or None)] if corpus else []
    token_lines = _read_lines(token_list) if token_list else []
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    from vocablens.cli.progress import stage_progress

    def progress(phase: str):
        if phase == "undertrained":
            return stage_progress("trim: under-trained tokens", "prompts", quiet=json_,
                                  units={"tokenizer classes": "tokens", "indicators": "tokens"})
        return stage_progress("trim", "documents", quiet=json_ or not texts)

    new = lm.trim(corpus, token_list=token_lines, verify_texts=verify_texts, verify_tokens=verify_tokens,
                  drop_undertrained=drop_undertrained, undertrained_candidates=undertrained_candidates,
                  documents=texts, status=lambda msg: status(msg, quiet=json_), progress=progress)
    with status(f"writing {out_path} ...", quiet=json_):
        new.save(out_path, force=force)
    show(new.surgery, json_, notes=[f"id map: {out_path / 'vocab_map.json'}"])
