"""Commands ``project``, ``explain`` and ``settle``: parameters and updates read in vocabulary space."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from vocablens.handle import checks
from vocablens.cli.common import (
    DeviceOpt, JsonOpt, ModelOpt, TrustOpt, app, show, err, load_model,
    parse_int_list,
)
from vocablens.cli.progress import count_bar
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL

KOpt = Annotated[int, typer.Option("-k", "--top-k", help="Tokens (or pairs, or vectors) listed.")]
NoGainOpt = Annotated[bool, typer.Option(
    "--no-norm-gain", help="Read vectors with the bare unembedding U·v instead of U·(g⊙v), g the final norm's "
    "gain (the default applies it: the map the model uses, up to a positive per-position scale).")]


def _block(block: int | None, layer: int | None) -> int | None:
    """``--block``, or the deprecated ``--layer`` alias (one note on stderr); both must agree."""
    if layer is None:
        return block
    err.print(Text.assemble(("note:", "yellow"), " project --layer is deprecated: it counts blocks (0..L-1); use --block"))
    if block is not None and block != layer:
        raise BadInput(f"--block {block} and --layer {layer} disagree; give --block only")
    return layer


def _check_block_early(spec: str, block: int) -> None:
    """``--block`` against the block count in the model's own ``config.json`` (a model directory, or
    the cache of a ``.gguf`` file), so a bad block is one line, before the loading line. When that
    needs more than reading one small file (a hub id, a GGUF file not cached yet, a config transformers
    cannot parse), the loader checks the block instead."""
    from vocablens.errors import VocabLensError
    from vocablens.models.files.gguf_cache import CACHE_MARK, cache_dir
    from vocablens.models.files.source import resolve_source

    if block < 0:
        raise BadInput(f"block {block} is out of range: blocks count from 0")
    try:
        source = resolve_source(spec)
        kind, path = source.kind, source.path
        if kind == "gguf":
            path = cache_dir(path)
            if path is None or not (path / CACHE_MARK).is_file():
                return
        elif kind != "dir":
            return
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=False)  # a check only: never a model's code
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        n = getattr(cfg, "num_hidden_layers", None)
    except (VocabLensError, ValueError, KeyError, TypeError, AttributeError, OSError):
        return
    if isinstance(n, int) and not isinstance(n, bool):
        checks.block_in_range(block, n)  # the handle's rule, read off the config before the load


@app.command("project")
def project_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    block: Annotated[int | None, typer.Option("--block", "-b", help="Block 0..L-1 (block i reads stream layer i and writes i+1); default: all blocks.")] = None,
    layer: Annotated[int | None, typer.Option("--layer", "-l", hidden=True, help="Deprecated alias of --block.")] = None,
    neuron: Annotated[str, typer.Option("--neuron", "-n", help="Neuron(s) of --block, comma-separated.")] = "",
    token: Annotated[list[str] | None, typer.Option("--token", "-t", help="Reverse search: the value vectors that most single out this token (its text; id:N names id N), ranked by its z-score among each vector's own logits (repeat for several tokens).")] = None,
    interpretable: Annotated[int, typer.Option("--interpretable", help="List the N most interpretable value vectors of a sample (--sample per block, default 32), by the mean z-score of their top -k tokens.")] = 0,
    head: Annotated[int | None, typer.Option("--head", help="Read this attention head of --block (OV or QK circuit).")] = None,
    circuit: Annotated[str, typer.Option("--circuit", help="ov (what the head copies/writes) or qk (what attends to what).")] = "ov",
    keys: Annotated[bool, typer.Option("--keys", help="Project key vectors (gate/up rows) through the input embedding instead of value vectors.")] = False,
    sample: Annotated[int | None, typer.Option("--sample", help="Without --neuron: neurons drawn per block (default 4; 32 with --interpretable).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the neuron sample.")] = 0,
    max_sources: Annotated[int | None, typer.Option("--max-sources", help="Head circuits: scan only the first N source token ids.")] = None,
    k: KOpt = 10,
    no_norm_gain: NoGainOpt = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Parameters in vocabulary space: FFN value/key vectors, reverse token search, head OV/QK circuits.

    --block counts blocks 0..L-1 (block i reads residual-stream layer i and writes layer i+1); the
    JSON field "block" of vectors and rows is that block index, as in explain's JSON.
    """
    from vocablens.cli.heap import trim_heap

    block = _block(block, layer)
    tokens = list(token or [])
    ns = _check_project_flags(block, tokens, k, circuit, head, interpretable, neuron)
    if block is not None:
        _check_block_early(model, block)  # one line, before the loading line
    lm = _load_for_project(model, block, tokens, interpretable, keys, trust_remote_code, device, json_)
    b = lm.borders
    checks.block_in_range(block, b.n_layers)
    tids = [lm.token_id(x, "--token") for x in tokens]
    lm = lm.without_tokenizer()  # encoding is done: token strings only from here on (the tokenizer is freed)
    trim_heap()
    res = _project(lm, tids=tids, interpretable=interpretable, block=block, head=head, neurons=ns, circuit=circuit,
                   keys=keys, sample=sample, seed=seed, k=k, norm_gain=not no_norm_gain, max_sources=max_sources,
                   quiet=json_)
    show(res, json_)


def _check_project_flags(block: int | None, tokens: list[str], k: int, circuit: str, head: int | None,
                         interpretable: int, neuron: str) -> list[int] | None:
    """Raise BadInput for flags ``project`` cannot combine or take; -> the ``--neuron`` list, or None
    when no neurons are chosen (a sample, or another mode)."""
    checks.at_least("k", k)
    if circuit not in ("ov", "qk"):
        raise BadInput(f"--circuit must be ov or qk; got {circuit!r}")
    checks.needs("head", head, "block", block)
    if sum(bool(x) for x in (tokens, head is not None, interpretable)) > 1:
        raise BadInput("give one of --token (reverse search), --head (circuit) or --interpretable")
    if interpretable < 0:
        raise BadInput(f"--interpretable must be >= 1; got {interpretable}")
    uses_neuron = bool(neuron) and not tokens and not interpretable and head is None
    checks.needs("neurons", neuron if uses_neuron else None, "block", block)
    return parse_int_list(neuron, "--neuron") if uses_neuron else None


def _load_for_project(spec: str, block: int | None, tokens: list[str], interpretable: int, keys: bool,
                      trust_remote_code: bool, device: str, quiet: bool):
    """Load only what the mode reads: one block (or every block's value matrix) with the head and the
    final norm; the whole model for key vectors of every block. Freed row blocks and read checkpoint
    pages leave the resident set."""
    from vocablens.cli.heap import tune_heap
    from vocablens.models.files.pages import release_after_reading

    one_block = block is not None and not tokens and not interpretable  # that block + head + final norm
    values = not one_block and not keys  # every block's value vectors + head + final norm
    tune_heap()  # the readout's freed row blocks leave the resident set
    release_after_reading()  # and so do the checkpoint pages of the rows it has read
    if one_block or values:  # that block or every value matrix, with the head and the final norm
        return load_model(spec, mode="borders", blocks=[block] if one_block else None, value_vectors=values,
                          trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    return load_model(spec, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)


def _project(lm, *, tids: list[int], interpretable: int, block: int | None, head: int | None,
             neurons: list[int] | None, circuit: str, keys: bool, sample: int | None, seed: int, k: int,
             norm_gain: bool, max_sources: int | None, quiet: bool):
    """The one ``lm.project`` call the flags ask for: reverse token search, the most interpretable value
    vectors, a head's OV/QK circuit, or value/key vectors (the chosen neurons or a sample)."""
    if tids:
        if not quiet:
            err.print(f"scoring {lm.borders.n_layers} blocks of value vectors against the vocabulary ...", style="dim")
        return lm.project(token=tids, k=k, norm_gain=norm_gain)
    if interpretable:
        if not quiet:
            err.print(f"reading {sample or 32} value vectors per block ...", style="dim")
        return lm.project(interpretable=interpretable, sample=sample, seed=seed, k=k, norm_gain=norm_gain)
    if head is not None:
        return lm.project(block=block, head=head, circuit=circuit, k=k, norm_gain=norm_gain, max_sources=max_sources)
    return lm.project(block=block, neurons=neurons, sample=sample, seed=seed, k=k, keys=keys, norm_gain=norm_gain)


@app.command("explain")
def explain_cmd(
    prompt: Annotated[str, typer.Argument(help="Text whose next-token prediction is explained.")],
    model: ModelOpt = DEFAULT_MODEL,
    position: Annotated[int, typer.Option("--position", "-p", help="Position explained (negative from the end).")] = -1,
    token: Annotated[str, typer.Option("--token", "-t", help="A token to follow and attribute, by its text ('4' is the text \"4\"; id:N names id N); default: the top-1.")] = "",
    token_id: Annotated[Optional[int], typer.Option("--token-id", help="The token to follow and attribute, by its id (instead of --token).")] = None,
    k: KOpt = 5,
    subs: Annotated[int, typer.Option("--subs", help="FFN sub-updates kept per block.")] = 5,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the chat template (user turn).")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """What built a prediction: per-block attention/FFN updates, FFN sub-updates, per-head logit attribution."""

    checks.prompt_text(prompt)
    checks.at_least("k", k)
    if token and token_id is not None:
        raise BadInput("give --token TEXT or --token-id N, not both")
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    tid = lm.token_id(token_id, "--token-id") if token_id is not None else lm.token_id(token, "--token") if token else None
    e = lm.explain(prompt, position=position, target=tid, k=k, subs=subs, chat=chat)
    show(e, json_)


@app.command("settle")
def settle_cmd(
    corpus: Annotated[str, typer.Option("--corpus", "-c", help="A named corpus (pydoc-topics, python-docs ...), a file or a directory.")],
    model: ModelOpt = DEFAULT_MODEL,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens read from the corpus.")] = 2048,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per row.")] = 256,
    batch: Annotated[int, typer.Option("--batch", help="Rows per forward pass.")] = 2,
    thresholds: Annotated[str, typer.Option("--thresholds", help="Comma-separated exit confidences in (0, 1].")] = "0.5,0.7,0.8,0.9,0.95,0.99",
    lens: Annotated[str, typer.Option("--lens", help="logit (default) or tuned (when vocablens.lens.tuned is installed).")] = "logit",
    tuned_path: Annotated[str, typer.Option("--tuned-path", help="Tuned lens directory (default: the one shipped for the model).")] = "",
    min_layer: Annotated[int, typer.Option("--min-layer", help="First residual-stream layer where an early exit is checked (0 = the embedding output .. L = the last block's output).")] = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the settle plot here (.html, .png, .svg, .pdf).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --plot file.")] = False,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Where predictions settle over a corpus, and what an early exit would save and keep."""
    from vocablens.corpus import load_documents
    from vocablens.render import vocab_space as rv

    try:
        ths = [float(x) for x in thresholds.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--thresholds takes comma-separated numbers; got {thresholds!r}") from None
    if lens not in ("logit", "tuned"):
        raise BadInput(f"--lens must be logit or tuned; got {lens!r}")
    checks.settle_options(seq_len, batch, max_tokens)
    if plot is not None:
        checks.free_output(plot, force)
        if plot.suffix.lower() not in (".html", ".htm", ".png", ".svg", ".pdf"):
            raise BadInput(f"--plot must end in .html, .png, .svg or .pdf; got {plot.name!r}")
    load_documents(corpus, max_docs=1)  # fail early on a missing corpus, before loading the model
    from vocablens.parallel.processes import init_from_env

    rank, world = init_from_env()  # under torchrun: batches split over ranks, rank 0 prints
    quiet = json_ or rank != 0
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    rows = lm.first_rows(corpus, seq_len, max_tokens)
    batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    with count_bar(quiet or world > 1, rows.numel(), "settle", "tokens", stage="forward passes") as tick:
        # one process: the bar advances after each layer of each batch (a first ETA after one layer)
        res = lm.settle(corpus, max_tokens=max_tokens, seq_len=seq_len, batch=batch, thresholds=ths, lens=lens,
                        min_layer=min_layer, batches=batches, lens_dir=tuned_path or None,
                        on_tokens=None if world > 1 else (lambda n: tick(int(n))))
    if rank != 0:
        return
    if plot is not None:
        rv.write_settle_plot(res.value, plot)
    show(res, json_, options={"plot": str(plot) if plot else None},
         notes=[f"wrote {plot}"] if plot is not None else [])
