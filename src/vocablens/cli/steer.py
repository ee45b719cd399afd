"""``vocablens steer``: scale the FFN value vectors that promote / suppress tokens (Geva et al. 2022, §5.1)."""

from __future__ import annotations

from typing import Annotated

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, app, emit_json, err, load_model, out
from vocablens.errors import BadInput


def _token_ids(tokenizer, texts: list[str], V: int, quiet: bool) -> list[int]:
    from vocablens.models.tokens import single_token_id

    ids = []
    for t in texts:
        got, note = single_token_id(tokenizer, t, V)
        if note and not quiet:
            err.print(f"note: {note}", style="dim")
        ids.append(int(got[0]))
    return list(dict.fromkeys(ids))


def _stream_layers(s: str, L: int) -> list[int] | None:
    """'A..B' stream layers (1..L: layer l is written by block l-1) -> block indices."""
    if not s:
        return None
    try:
        a, b = (int(x) for x in s.split("..", 1)) if ".." in s else (int(s), int(s))
    except ValueError:
        raise BadInput(f"--layers takes A..B (stream layers 1..{L}); got {s!r}") from None
    if not 1 <= a <= b <= L:
        raise BadInput(f"--layers A..B must satisfy 1 <= A <= B <= {L} (layer l is written by block l-1); got {s!r}")
    return list(range(a - 1, b))


@app.command("steer")
def steer_cmd(
    promote: Annotated[list[str], typer.Option("--promote", help="A token to promote (repeat the option).")] = [],  # noqa: B006
    suppress: Annotated[list[str], typer.Option("--suppress", help="A token to suppress (repeat the option).")] = [],  # noqa: B006
    top_n: Annotated[int, typer.Option("--top-n", help="Value vectors chosen per token set.")] = 10,
    scale: Annotated[float, typer.Option("--scale", help="Factor on the chosen vectors' activations.")] = 8.0,
    layers: Annotated[str, typer.Option("--layers", help="Only the blocks that write stream layers A..B "
                                                       "(layer l = output of block l-1), e.g. 15..30.")] = "",
    suppress_mode: Annotated[str, typer.Option("--suppress-mode", help="boost: scale up the vectors that push "
                                               "the set down; ablate: switch off those that push it up.")] = "boost",
    prompt: Annotated[str, typer.Option("--prompt", help="Text to measure on and to continue greedily.")] = "",
    corpus: Annotated[str, typer.Option("--corpus", help="Measure on a corpus instead (named or a path).")] = "",
    heldout: Annotated[str, typer.Option("--heldout", help="Corpus for the perplexity (fluency cost).")] = "pydoc-topics",
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Greedy continuation length (0: none).")] = 24,
    save: Annotated[str, typer.Option("--save", help="Write the steered model (factors folded into the "
                                                    "weights) as a Hugging Face directory.")] = "",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --save directory.")] = False,
    model: ModelOpt = "smollm2",
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Scale the FFN value vectors that promote / suppress tokens, and measure the effect.

    The vectors are chosen by the tokens' z-score in vocabulary space (Geva et al. 2022, §5.1) and
    scaled with a forward hook (no weight edit); reported before and after: the tokens' probability
    mass, the held-out perplexity and greedy continuations."""
    from vocablens.vocab_space.steer import steer
    from vocablens.vocab_space.steer_eval import measure
    from vocablens.models.tokens import check_ids_fit

    if not promote and not suppress:
        raise BadInput("give --promote TOKEN and/or --suppress TOKEN")
    if prompt and corpus:
        raise BadInput("give --prompt or --corpus, not both")
    if isinstance(new_tokens, bool) or new_tokens < 0 or new_tokens > 512:
        raise BadInput(f"--new-tokens must be in 0..512; got {new_tokens}")
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    b, tok = lm.borders, lm.tokenizer
    blocks = _stream_layers(layers, b.n_layers)
    sets = {"promote": _token_ids(tok, promote, b.vocab_size, json_),
            "suppress": _token_ids(tok, suppress, b.vocab_size, json_)}
    st = steer(b, promote=sets["promote"], suppress=sets["suppress"], top_n=top_n, scale=scale, blocks=blocks,
               suppress_mode=suppress_mode)
    from vocablens.surgery.io import heldout_texts

    def enc(t: str):
        ids = tok(t, return_tensors="pt").input_ids[0][:256]
        check_ids_fit(ids, b.vocab_size, tok)
        return ids

    probes = [enc(prompt or "The weather today is")] if not corpus else [enc(t) for t in heldout_texts(corpus, 4, 600)]
    held = [enc(t) for t in heldout_texts(heldout, 4, 800)]
    if not json_:
        err.print(f"measuring {len(st.vectors)} vectors on {len(probes)} probe text(s) and "
                  f"{len(held)} held-out texts, unsteered and steered ...", style="dim")
    from vocablens.cli.progress import stage_progress

    cb, close = stage_progress("steer", "forward passes", quiet=json_)
    try:
        eff = measure(b, st, probes, sets, heldout=held, max_new_tokens=new_tokens if not corpus else 0, progress=cb)
    finally:
        close()
    from vocablens.render.steer import print_steer, steer_to_dict, vector_rows
    from vocablens.vocab_space.steer import vector_top_tokens

    rows = vector_rows(st.vectors, vector_top_tokens(b, st.vectors, k=6), tok)
    saved = None
    if save:
        from vocablens.surgery.io import save_model_dir

        with st.folded():
            saved = str(save_model_dir(lm.model, tok, save, force=force))
    if json_:
        emit_json(steer_to_dict(sets, rows, eff, tok, top_n=top_n, scale=scale, suppress_mode=suppress_mode,
                                saved=saved, provenance=lm.provenance))
    else:
        print_steer(out, rows, eff, tok, save if saved else "")
