"""What every lens command shares: ``--kind`` and ``--lens`` (which lenses, where, with their provenance),
the corpus rows a lens is fitted or scored on, and ``lens eval --kind`` over several lenses."""

from __future__ import annotations

from pathlib import Path

from vocablens.cli.common import emit_json, err, load_model, out, status
from vocablens.errors import BadInput, OutputExists

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
    """Where each non-logit kind's lens is (before the model loads): ``--lens`` (a folder may hold
    both a tuned and a Jacobian lens; a published file serves its own kind) or the lens shipped.

    Raises:
        BadInput: ``--lens`` with only the logit lens, or no lens of a kind asked for.
    """
    from vocablens.lens.jacobian import find_jacobian_lens
    from vocablens.lens.tuned import find_lens

    wanted = [k for k in kinds if k != "logit"]
    if lens_path and not wanted:
        raise BadInput("--lens reads a tuned or Jacobian lens: add --kind tuned or --kind jacobian")
    found = {}
    for k in wanted:
        found[k] = find_lens(model, lens_path) if k == "tuned" else find_jacobian_lens(model, lens_path)
    return found


def load_lenses(found: dict[str, Path], borders) -> dict:
    """The lenses :func:`find_lenses` found, loaded and checked against the model (one line if not)."""
    from vocablens.lens.jacobian import JacobianLens
    from vocablens.lens.tuned import TunedLens

    return {k: (TunedLens.load(p, borders) if k == "tuned" else JacobianLens.load(p, borders)) for k, p in found.items()}


def lens_caption(kind: str, lens) -> str:
    """One line of provenance: model, corpus, prompts or tokens, stored dtype, source, revision, file
    format and whether the file's model identity was verified (:func:`vocablens.lens.identity.verify_identity`)."""
    from vocablens.lens.jacobian import layer_span

    info = lens.info() if hasattr(lens, "info") else {}
    s = getattr(lens, "settings", {}) or {}
    data = s.get("data") or {}
    from vocablens.lens.identity import shown_name

    bits = [f"{kind} lens for {shown_name(str(info['name'])) if info.get('name') else '?'}"]
    corpus = info.get("corpus") or data.get("corpus")
    if corpus:
        bits.append(f"fitted on {corpus}" if kind == "jacobian" else f"trained on {corpus}")
    if kind == "jacobian":
        bits.append(f"{info.get('n_prompts') or '?'} prompts")
    if info.get("tokens") not in (None, "?"):
        bits.append(f"{info['tokens']} tokens")
    if info.get("dtype") or s.get("stored_dtype"):
        bits.append(f"stored {info.get('dtype') or s.get('stored_dtype')}")
    if kind == "jacobian":
        bits.append(f"layers {layer_span(list(lens.layers))}")
        bits.append(f"source {info.get('source')}")
    if info.get("revision"):
        bits.append(f"revision {str(info['revision'])[:12]}")
    if info.get("format"):
        bits.append(f"format {info['format']}")
    if info.get("verified"):
        bits.append(str(info["verified"]))
    return ", ".join(bits)


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
    if max_tokens < 2 or seq_len < 2:
        raise BadInput("--max-tokens and --seq-len must be at least 2")
    if split not in ("validation", "train", "all"):
        raise BadInput(f"--split must be validation, train or all; got {split!r}")
    if plot is not None and plot.exists() and not force:
        raise OutputExists(f"{plot} exists; pass --force to replace it")
    if plot is not None and plot.suffix.lower() not in (".html", ".png"):
        raise BadInput(f"--plot must end in .html or .png; got {plot}")


def eval_kinds(kinds: list[str], model: str, lens_path: str, corpus: str, split: str, max_tokens: int, seq_len: int,
               plot, threads: int, force: bool, progress: bool, json_: bool, trust_remote_code: bool, device: str) -> None:
    """``lens eval --kind K1,K2,...``: every lens on the same held-out tokens, one table and one figure
    (:func:`vocablens.lens.compare.compare_lenses`)."""
    from vocablens.cli.common import count_bar
    from vocablens.corpus import NAMED_CORPORA, load_documents
    from vocablens.lens.compare import compare_lenses
    from vocablens.lens.evaluate import text_bytes
    from vocablens.render.compare import comparison_to_dict, print_comparison, save_comparison_plot
    from vocablens.render.lens import lens_record

    check_eval_options(max_tokens, seq_len, split, plot, force)
    set_threads(threads)
    quiet = json_ and not progress
    found = find_lenses(kinds, model, lens_path)  # before the model loads
    data: dict = {}
    if not corpus:  # the held-out part of the corpus the first fitted lens saw, when it is a named one
        from vocablens.lens.jacobian import JacobianLens
        from vocablens.lens.tuned import TunedLens

        for kd, p in found.items():
            if kd == "tuned" or p.is_dir():
                ln = TunedLens.load(p) if kd == "tuned" else JacobianLens.load(p)
                data = ln.settings.get("data") or {}
                if str(data.get("corpus") or "") in NAMED_CORPORA:
                    corpus = str(data["corpus"])
                    break
        corpus = corpus or "pydoc-topics"
    docs = load_documents(corpus)
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=quiet)
    lenses = load_lenses(found, lm.borders)
    with status(f"tokenizing the {split} split of {corpus} ...", quiet=quiet or split == "all"):
        rows, info = lm.eval_rows(corpus, split, min(seq_len, max_tokens), max_tokens,
                                  float(data.get("val_fraction", 0.1)), int(data.get("split_seed", 0)), docs)
    if not quiet:
        for kd, ln in lenses.items():
            err.print(lens_caption(kd, ln), style="dim", soft_wrap=True)
        err.print(f"scoring {rows.numel()} tokens of {info['corpus']} ({split}) at {lm.borders.n_layers + 1} layers, "
                  f"lenses {', '.join(kinds)}", style="dim", soft_wrap=True)
    T = int(rows.shape[1])
    with count_bar(quiet, int(rows.shape[0]) * T, "lens eval", "tokens", stage="scoring the lenses") as tick:
        res = compare_lenses(lm.borders, {k: lenses.get(k) for k in kinds}, rows,
                             n_bytes=text_bytes(lm.tokenizer, rows), on_row=lambda done, total: tick(done * T))
    title = f"{lm.provenance.name}: {', '.join(kinds)} lenses on {info['corpus']} ({split})"
    if plot is not None:
        save_comparison_plot(res, plot, title=title)
    if json_:
        emit_json(comparison_to_dict(res, lm.provenance, [lens_record(k, v) for k, v in lenses.items()], info, plot))
    else:
        print_comparison(res, out, title=f"{lm.provenance.name}, {rows.numel()} tokens of {info['corpus']} ({split})")
        if plot is not None:
            err.print(f"wrote {plot}", style="dim")


__all__ = ["KINDS", "eval_kinds", "find_lenses", "lens_caption", "load_lenses", "parse_kinds", "set_threads"]
