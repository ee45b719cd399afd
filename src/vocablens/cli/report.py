"""`vocablens report`: the main job — analyses of one model in a self-contained HTML file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Callable

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from vocablens.cli.common import JsonOpt, ModelOpt, TrustOpt, app, emit_json, err, load_model, out
from vocablens.errors import BadInput

DEFAULT_PROMPT = "The capital of France is"
#: tokens whose neighbours the report shows (single tokens in most English vocabularies)
REPORT_NEIGHBOR_TOKENS = (" king", " Paris", " three", " Monday", " dog", " happy")
#: tokens whose strongest promoting FFN value vectors the report shows
REPORT_PROBE_TOKENS = (" three", " Monday", " France", " red")


@app.command("report")
def report(
    model: ModelOpt = "smollm2",
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt for the lens sections.")] = DEFAULT_PROMPT,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("vocablens-report.html"),
    lens_path: Annotated[str, typer.Option("--lens", help="Tuned-lens directory (default: the lens shipped for the model, if any).")] = "",
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
) -> None:
    """Write one self-contained HTML report (plotly inlined) and print a terminal summary."""
    from vocablens import vocab_space as vs
    from vocablens.anatomy import anatomy
    from vocablens.argmax import argmax_for_borders
    from vocablens.render.argmax import argmax_section, argmax_to_dict
    from vocablens.corpus import load_documents, pack_tokens
    from vocablens.render import vocab_space as rv
    from vocablens.geometry import nearest_neighbors, word_pca
    from vocablens.lens import logit_lens
    from vocablens.render.anatomy import anatomy_section, anatomy_table
    from vocablens.render.geometry import neighbors_section, neighbors_tables, neighbors_to_dict, pca_section
    from vocablens.models.tokens import context_length, encode_prompt
    from vocablens.render.borders import borders_section, borders_table
    from vocablens.render.lens import lens_section, lens_table
    from vocablens.render.report import render_report, stamp, write_atomic
    from vocablens.tying import tie_check

    if not prompt.strip():
        raise BadInput("empty prompt: give some text with --prompt")
    out_path = Path(out_path)
    if out_path.is_dir():
        raise BadInput(f"--out {out_path} is a directory; give a file name")
    if not out_path.parent.exists():
        raise BadInput(f"--out: directory {out_path.parent} does not exist")
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    lm = load_model(model, trust_remote_code=trust_remote_code, quiet=json_)
    timings["load"] = time.perf_counter() - t0
    tok, borders, prov = lm.tokenizer, lm.borders, lm.provenance
    ids = encode_prompt(tok, prompt, context_length(lm.model.config))

    results: dict = {}
    sections = []
    steps: list[tuple[str, Callable[[], None]]] = []

    def step_borders():
        tie = tie_check(borders)
        results["tie"] = tie
        sections.append(borders_section(borders, tie, prov))

    def step_lens():
        res = logit_lens(borders, ids, positions="all", k=5)
        results["lens"] = res
        sections.append(lens_section(res, tok, prompt))

    def step_anatomy():
        a = anatomy(borders, name=prov.name)
        results["anatomy"] = a
        sections.append(anatomy_section([a]))

    def step_neighbors():
        queries = [q for q in REPORT_NEIGHBOR_TOKENS if len(tok(q, add_special_tokens=False).input_ids) >= 1]
        nb = nearest_neighbors(borders, tok, queries, k=8)
        results["neighbors"] = nb
        sections.append(neighbors_section(nb, tok))

    def step_pca():
        wp = word_pca(borders, tok)
        results["pca"] = wp
        sections.append(pca_section(wp))

    def step_value_vectors():
        # first the strongest promoter of a few probe tokens, then a random sample of 2 per layer
        lead_l, lead_n, probes = [], [], []
        for q in REPORT_PROBE_TOKENS:
            q_ids = tok(q, add_special_tokens=False).input_ids
            if len(q_ids) != 1:
                continue
            found = vs.search_token(borders, q_ids[0], k=1)
            lead_l.append(int(found.promote_layers[0]))
            lead_n.append(int(found.promote_neurons[0]))
            probes.append(q)
        layers, neurons = vs.sample_neurons(borders, 2, seed=0)
        res = vs.project_vectors(borders, lead_l + layers, lead_n + neurons, k=8)
        results["value_vectors"] = res
        note = (f"The first {len(probes)} rows are the value vectors that most promote "
                + ", ".join(repr(q) for q in probes)
                + " (reverse search over all layers); then a random sample of 2 neurons per layer:")
        sections.append(rv.value_vectors_section(res, tok, note=note))

    def step_explain():
        e = vs.explain(borders, ids)
        results["explain"] = e
        sections.append(rv.explanation_section(e, tok, prompt))

    def step_settle():
        rows = pack_tokens(load_documents("pydoc-topics", max_docs=8), tok, 128, max_tokens=256)
        res = vs.settle(borders, rows, min_layer=borders.n_layers // 2)
        results["settle"] = res
        sections.append(rv.settle_section(res))

    def step_tuned():
        from vocablens.errors import CheckpointMismatch
        from vocablens.lens.tuned import load_for_model
        from vocablens.render.html import Section, esc
        from vocablens.render.tuned import tuned_lens_section

        try:
            lens = load_for_model(borders, model, lens_path or None)
        except (BadInput, CheckpointMismatch) as exc:
            if lens_path:
                raise
            results["tuned"] = None
            sections.append(Section("tuned-lens", "Tuned lens", (
                f"<p class='note'>No tuned lens for this model ({esc(exc)}). Train one with "
                f"<code>vocablens lens train --model {esc(model)} --out DIR</code> and pass "
                f"<code>--lens DIR</code>.</p>")))
            return
        results["tuned"] = logit_lens(borders, ids, positions="all", k=5, translator=lens)
        from vocablens.lens.logit import lens_pair

        sections.append(tuned_lens_section(*lens_pair(borders, ids[0], lens), tok, lens.info()))

    def step_argmax():
        ma = argmax_for_borders(borders)
        results["argmax"] = ma
        sections.append(argmax_section(ma, tok))

    steps += [
        ("anatomy", step_anatomy),
        ("borders and tied check", step_borders),
        ("embedding neighbours", step_neighbors),
        ("3-D PCA of word embeddings", step_pca),
        ("logit lens", step_lens),
        ("tuned lens", step_tuned),
        ("tokens that can never win (argmax geometry)", step_argmax),
        ("value vectors in vocabulary space", step_value_vectors),
        ("what built the prediction", step_explain),
        ("where predictions settle", step_settle),
    ]

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=json_) as progress:
        task = progress.add_task("analyses", total=len(steps))
        for name, fn in steps:
            progress.update(task, description=name)
            t0 = time.perf_counter()
            fn()
            timings[name] = time.perf_counter() - t0
            progress.advance(task)
    html = render_report(
        f"vocablens report — {prov.name}",
        [f"Weights: {prov.describe()}", f"Prompt: {prompt!r}", f"Made {stamp()} by vocablens"],
        sections,
    )
    write_atomic(out_path, html)
    timings["total"] = time.perf_counter() - t_all
    if json_:
        from vocablens.lens import lens_to_dict

        emit_json({
            "out": str(out_path),
            "model": prov.to_dict(),
            "borders": borders.describe(),
            "anatomy": results["anatomy"].to_dict(),
            "tie_check": results["tie"].to_dict(),
            "neighbors": neighbors_to_dict(results["neighbors"], tok),
            "lens": lens_to_dict(results["lens"], tok),
            "tuned_lens": lens_to_dict(results["tuned"], tok) if results.get("tuned") is not None else None,
            "argmax": argmax_to_dict(results["argmax"], tok, per_token=False),
            "explain": rv.explanation_to_dict(results["explain"], tok),
            "settle": rv.settle_to_dict(results["settle"]),
            "sections": [s.id for s in sections],
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
        })
        return
    out.print(f"[bold]vocablens report[/bold] — {prov.describe()}")
    out.print(anatomy_table([results["anatomy"]]))
    out.print(borders_table(borders, results["tie"]))
    for t in neighbors_tables(results["neighbors"], tok)[:3]:
        out.print(t)
    res = results["lens"]
    out.print(lens_table(res, tok, len(res.positions) - 1, k=3, every=5))
    out.print(f"wrote [bold]{out_path}[/bold] ({out_path.stat().st_size / 2**20:.1f} MiB) in "
              f"{timings['total']:.1f} s (load {timings['load']:.1f} s)")
