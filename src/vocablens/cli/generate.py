"""``vocablens generate PROMPT``: KV-cached generation through the borders, with an optional early exit."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from vocablens.handle import checks
from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TpOpt, TrustOpt, app, load_model, show
from vocablens.errors import BadInput
from vocablens.models.files.spec import DEFAULT_MODEL


@app.command("generate")
def generate_cmd(
    prompt: Annotated[str, typer.Argument(help="Text to continue.")],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy (default).")] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (ties kept).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus: keep the smallest top set with mass >= p.")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="Keep tokens with p >= min_p * p_max.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed for sampling (same seed, same text).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the chat template as a user turn.")] = False,
    top: Annotated[int, typer.Option("--top", help="Alternatives recorded per token (--json).")] = 5,
    early_exit: Annotated[Optional[str], typer.Option(
        "--early-exit", help="Exit each step at the first layer whose lens (logit|tuned) is confident.")] = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Early exit: top-1 probability to reach.")] = 0.9,
    min_layer: Annotated[Optional[int], typer.Option(
        "--min-layer", help="Early exit: first layer checked (default: half the blocks).")] = None,
    exit_test: Annotated[str, typer.Option(
        "--exit-test", help="full (lens over all V) or candidates (previous token's top-k rows first).")] = "full",
    candidates: Annotated[int, typer.Option("--candidates", help="k for --exit-test candidates.")] = 32,
    lens_path: Annotated[Optional[str], typer.Option("--lens", help="Tuned lens directory (default: the shipped one).")] = None,
    model: ModelOpt = DEFAULT_MODEL,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
    tp: TpOpt = False,
) -> None:
    """Generate text, streamed to stdout as it comes; notes on stderr; --json for tokens and logprobs.

    Under torchrun (WORLD_SIZE > 1) the embedding and LM head rows are split over the ranks (no
    --early-exit then) and rank 0 prints; with --tp the blocks are split too (transformers' tensor
    parallel), every rank draws the same tokens."""
    from vocablens.render.generate import TextStream, summary_lines

    _check_flags(max_new_tokens, top, temperature, top_k, top_p, min_p, early_exit, threshold, exit_test)
    from vocablens.cli.torchrun import group_device
    from vocablens.parallel.processes import common_seed, init_from_env

    rank, world = init_from_env(group_device(tp, device))
    if world > 1 and early_exit is not None:
        raise BadInput("--early-exit reads the whole LM head at every layer: run it without torchrun")
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_ or rank != 0,
                    tp=tp)
    rule = _exit_rule(lm, early_exit, threshold, min_layer, exit_test, candidates, lens_path)
    stream = TextStream(lm.tokenizer)

    def on_token(t) -> None:
        if not json_ and rank == 0:
            sys.stdout.write(stream.push(t.id))
            sys.stdout.flush()

    seed = common_seed(seed)  # under torchrun every rank must draw the same tokens
    res = lm.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                      min_p=min_p, seed=seed, top=top, chat=chat, early_exit=rule, on_token=on_token,
                      vocab_parallel=world > 1)
    if rank != 0:
        return

    def rest() -> None:  # the text was streamed as it came: only its tail and a newline are left
        sys.stdout.write(stream.flush() + "\n")
        sys.stdout.flush()

    show(res, json_, printed=rest, notes=summary_lines(res.value))


def _check_flags(max_new_tokens: int, top: int, temperature: float, top_k, top_p, min_p, early_exit,
                 threshold: float, exit_test: str) -> None:
    """Raise BadInput for a bad count, sampling filter or early-exit option, through the library's own
    rules (their `` `top_k` ``, `` `lens` `` ... are printed as --top-k, --early-exit: in_cli_words)."""
    from vocablens.generate.early_exit import check_exit_options
    from vocablens.ops.sampling import check_sampling_args

    checks.at_least("max_new_tokens", max_new_tokens)
    checks.at_least_ge("top", top, 0)
    check_sampling_args(temperature, top_k, top_p, min_p)
    check_exit_options("logit" if early_exit is None else early_exit, threshold, exit_test)  # None: no early exit


def _exit_rule(lm, early_exit: str | None, threshold: float, min_layer: int | None, exit_test: str,
               candidates: int, lens_path: str | None):
    """The :class:`~vocablens.generate.ExitRule` the flags ask for, checked against the model's layers
    (None without --early-exit); ``tuned`` loads the tuned lens (``--lens``, or the shipped one)."""
    from vocablens.generate import ExitRule

    if early_exit is None:
        return None
    n_layers = lm.borders.n_layers
    m = n_layers // 2 if min_layer is None else min_layer
    tuned = lm.translator("tuned", lens_path or None) if early_exit == "tuned" else None
    rule = ExitRule(lens=early_exit, threshold=threshold, min_layer=m, test=exit_test,
                    candidates=candidates, tuned=tuned)
    rule.validate(n_layers)
    return rule
