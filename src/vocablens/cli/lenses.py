"""What every lens command shares: ``--kind`` and ``--lens`` (which lenses, where, with their provenance),
the corpus rows a lens is fitted or scored on, and ``lens eval --kind`` over several lenses."""

from __future__ import annotations

from pathlib import Path

from vocablens.handle import checks
from vocablens.cli.common import err, load_model, show, status
from vocablens.errors import BadInput

KINDS = ("logit", "tuned", "jacobian")


def parse_kinds(kind: str) -> list[str]:
    """``--kind``: ``logit``, ``tuned``, ``jacobian``, ``both`` (= logit,tuned) or a comma list, in
    the order given (duplicates dropped).

    Raises:
        BadInput: an unknown kind or an empty list.
    """
    parts = [p.strip() for p in str(kind or "").split(",") if p.strip()]
    kinds: list[str] = []
    for p in parts:
        for k in (("logit", "tuned") if p == "both" else (p,)):
            if k not in KINDS:
                raise BadInput(f"--kind takes logit, tuned, jacobian, both or a comma list of them; got {p!r}")
            if k not in kinds:
                kinds.append(k)
    if not kinds:
        raise BadInput("--kind takes logit, tuned, jacobian, both or a comma list of them; got nothing")
    return kinds


def find_lenses(kinds: list[str], model: str, lens_path: str) -> dict[str, Path]:
    """Where each non-logit kind's lens is, before the model loads (:func:`vocablens.handle.lenses.sources.find_lenses`).

    Raises:
        BadInput: ``--lens`` with only the logit lens, or no lens of a kind asked for.
    """
    from vocablens.handle.lenses.sources import find_lenses as find

    return find(kinds, model, lens_path)


def load_lenses(found: dict[str, Path], m) -> dict:
    """The lenses :func:`find_lenses` found, read through the model ``m`` and checked against it (one line if not)."""
    return {k: m.translator(k, p) for k, p in found.items()}


def lens_caption(kind: str, lens) -> str:
    """One line of a lens's provenance (:func:`vocablens.render.lens.lens_caption`)."""
    from vocablens.render.lens import lens_caption as caption

    return caption(kind, lens)


def set_threads(n: int) -> None:
    import torch

    if n > 0:
        torch.set_num_threads(n)


def check_eval_options(max_tokens: int, seq_len: int, split: str, plot: Path | None, force: bool) -> None:
    """The options every ``lens eval`` takes, refused in one line before anything loads.

    Raises:
        BadInput: --max-tokens or --seq-len below 2, an unknown --split, a --plot not .html/.png.
        OutputExists: --plot exists and --force was not given.
    """
    checks.token_window(max_tokens, seq_len)
    checks.one_of("split", split, checks.SPLITS)
    checks.plot_path(plot, force)


def eval_kinds(kinds: list[str], model: str, lens_path: str, corpus: str, split: str, max_tokens: int, seq_len: int,
               plot, threads: int, force: bool, progress: bool, json_: bool, trust_remote_code: bool, device: str) -> None:
    """``lens eval --kind K1,K2,...``: every lens on the same held-out tokens, one table and one figure
    (:meth:`vocablens.Model.compare_lenses`)."""
    from vocablens.cli.progress import stage_progress
    from vocablens.handle.lenses.evaluation import compare_inputs

    check_eval_options(max_tokens, seq_len, split, plot, force)
    set_threads(threads)
    quiet = json_ and not progress
    inputs = compare_inputs(model, kinds, lens_path, corpus, split)  # the lenses and the corpus: before the load
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)

    def started(lenses: dict, tokens: int, data: dict) -> None:
        if not quiet:
            for kd, ln in lenses.items():
                err.print(lens_caption(kd, ln), style="dim", soft_wrap=True)
            err.print(f"scoring {tokens} tokens of {data['corpus']} ({split}) at {lm.borders.n_layers + 1} layers, "
                      f"lenses {', '.join(kinds)}", style="dim", soft_wrap=True)

    cb, close = stage_progress("lens eval", "tokens", quiet=quiet)
    try:
        res = lm.compare_lenses(lenses=inputs, max_tokens=max_tokens, seq_len=seq_len, plot=plot, force=force,
                                status=lambda msg: status(msg, quiet=quiet), started=started, progress=cb)
    finally:
        close()
    show(res, json_, notes=[f"wrote {plot}"] if plot is not None else [])


__all__ = ["KINDS", "eval_kinds", "find_lenses", "lens_caption", "load_lenses", "parse_kinds", "set_threads"]
