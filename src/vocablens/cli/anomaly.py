"""``vocablens lens anomaly``: odd inputs from their lens trajectories (Belrose et al. 2023, §5)."""

from __future__ import annotations

from typing import Annotated

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, emit_json, err, load_model, out
from vocablens.cli.core import lens_app
from vocablens.errors import BadInput


@lens_app.command("anomaly")
def lens_anomaly(
    normal: Annotated[str, typer.Option("--normal", help="Normal inputs: a .txt (one per line), a .jsonl "
                                                        "({\"text\"}) or a directory of them.")],
    test: Annotated[str, typer.Option("--test", help="Inputs to score; a .jsonl with \"label\" (0 normal, 1 odd) "
                                                    "on every line also gives the AUROC.")],
    kind: Annotated[str, typer.Option("--kind", help="Trajectories of the logit lens, the tuned lens, or both.")] = "both",
    lens: Annotated[str, typer.Option("--lens", help="Tuned-lens directory (default: the lens shipped for the model).")] = "",
    detector: Annotated[str, typer.Option("--detector", help="iforest, lof or both.")] = "both",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the isolation forest.")] = 0,
    model: ModelOpt = "smollm2",
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Score inputs by how odd their lens trajectories are (Belrose et al. 2023, §5).

    Detectors are fitted on the normal inputs' trajectories (per layer: KL to the final distribution,
    entropy, rank of the final token; logit and tuned lens)."""
    from vocablens.cli.progress import stage_progress
    from vocablens.lens.anomaly import DETECTORS, detect, read_inputs, trajectory_features
    from vocablens.render.anomaly import anomaly_to_dict, print_anomaly

    if kind not in ("logit", "tuned", "both"):
        raise BadInput(f"--kind must be logit, tuned or both; got {kind!r}")
    if detector not in (*DETECTORS, "both"):
        raise BadInput(f"--detector must be iforest, lof or both; got {detector!r}")
    kinds = ("logit", "tuned") if kind == "both" else (kind,)
    dets = DETECTORS if detector == "both" else (detector,)
    normal_texts, _ = read_inputs(normal)
    test_texts, labels = read_inputs(test)
    distinct = len(set(normal_texts))
    if distinct < 5:
        raise BadInput(f"--normal needs at least 5 distinct inputs to fit a detector; {normal} holds "
                       f"{len(normal_texts)} ({distinct} distinct)")
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    tl = None
    if "tuned" in kinds:
        from vocablens.lens.tuned import load_for_model

        tl = load_for_model(lm.borders, model, lens or None)
    cb, close = stage_progress("lens anomaly", "inputs", quiet=json_)
    try:
        feats = []
        for name, texts in (("normal inputs", normal_texts), ("test inputs", test_texts)):
            stage = f"trajectories of {name}"
            cb(stage, 0, len(texts))
            feats.append(trajectory_features(lm.borders, lm.tokenizer, texts, lens=tl, kinds=kinds,
                                             progress=lambda d, n, s=stage: cb(s, d, n)))
    finally:
        close()
    rep = detect(feats[0], feats[1], labels, detectors=dets, seed=seed)
    if json_:
        emit_json(anomaly_to_dict(rep, kinds, dets, test_texts, labels, lm.provenance))
    else:
        print_anomaly(out, rep, dets, test_texts, labels)
