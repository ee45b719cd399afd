"""``vocablens lens anomaly``: odd inputs from their lens trajectories (Belrose et al. 2023, §5)."""

from __future__ import annotations

from typing import Annotated

import typer

from vocablens.cli.common import JsonOpt, ModelOpt, DeviceOpt, TrustOpt, load_model, show
from vocablens.cli.core import lens_app
from vocablens.models.files.spec import DEFAULT_MODEL


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
    model: ModelOpt = DEFAULT_MODEL,
    json_: JsonOpt = False,
    trust_remote_code: TrustOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Score inputs by how odd their lens trajectories are (Belrose et al. 2023, §5).

    Detectors are fitted on the normal inputs' trajectories (per layer: KL to the final distribution,
    entropy, rank of the final token; logit and tuned lens)."""
    from vocablens.cli.progress import stage_progress
    from vocablens.handle.trajectories import anomaly_inputs

    inputs = anomaly_inputs(normal, test, kind, detector)  # read and checked before the model loads
    lm = load_model(model, mode="full", trust_remote_code=trust_remote_code, device=device, quiet=json_)
    cb, close = stage_progress("lens anomaly", "inputs", quiet=json_)
    try:
        res = lm.anomaly(inputs, None, seed=seed, lens_dir=lens or None, progress=cb)
    finally:
        close()
    show(res, json_)
