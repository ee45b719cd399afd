"""Odd inputs from their prediction trajectories (Belrose et al. 2023, "Eliciting Latent Predictions
from Transformers with the Tuned Lens", §5: prompt-injection detection).

An input's *prediction trajectory* is what the lens reads at its last position after every layer.
Per layer l = 0..L-1 and per lens (logit, tuned) three features are taken:

* KL(final ‖ layer) in nats — how far the layer's prediction is from the model's output;
* the entropy of the layer's prediction, nats;
* log(1 + rank) of the model's final top-1 token at that layer.

A detector from scikit-learn is fitted on normal inputs only, on standardized features, as in the
paper: an isolation forest (Liu et al. 2008) and a local outlier factor (Breunig et al. 2000, in
novelty mode). Its score is higher for inputs that look less like the normal set; with labelled test
inputs the AUROC measures how well the score separates them.

Every read over V goes through the batched lens (:func:`vocablens.lens.logit.lens_batches`): the
inputs run padded in forwards of up to 4,096 tokens, and one LM-head GEMM pass per layer reads the
last position of every input of a forward (:func:`vocablens.ops.kl.kl_readout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from vocablens.errors import BadInput
from vocablens.models.tokens import check_ids_fit

KINDS = ("logit", "tuned")
DETECTORS = ("iforest", "lof")
STATS = ("kl", "entropy", "log_rank")


@dataclass(frozen=True)
class Trajectories:
    """Trajectory features of a set of inputs.

    Attributes:
        features: [N, F] float32, F = len(kinds) · 3 · L.
        names: F names, ``"{kind}/{stat}/{layer}"``.
        kinds: the lenses used.
        n_tokens: [N] int64 tokens per input.
    """

    features: torch.Tensor
    names: list[str]
    kinds: tuple[str, ...]
    n_tokens: torch.Tensor

    def select(self, kinds: Sequence[str]) -> torch.Tensor:
        """The columns of the given lenses only, [N, F']."""
        cols = [i for i, n in enumerate(self.names) if n.split("/", 1)[0] in kinds]
        return self.features[:, cols]


def trajectory_features(borders, tokenizer, texts: Sequence[str], lens=None, kinds: Sequence[str] = KINDS,
                        max_tokens: int = 512, progress: Callable[[int, int], None] | None = None) -> Trajectories:
    """Lens trajectories of each text's last position, as features.

    Args:
        borders: a :class:`~vocablens.models.Borders`; tokenizer: its tokenizer.
        texts: N input texts (each encoded as the model's tokenizer does, BOS included when it adds one).
        lens: a :class:`~vocablens.lens.tuned.TunedLens` for ``"tuned"`` (required when listed).
        kinds: which lenses: ``"logit"``, ``"tuned"``.
        max_tokens: keep the last ``max_tokens`` tokens of a longer text.
        progress: called as ``progress(done, N)``.

    Returns:
        :class:`Trajectories` with features [N, len(kinds)·3·L] float32.

    Raises:
        BadInput: no texts, an empty text, an unknown kind, ``"tuned"`` without a lens.
    """
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise BadInput(f"lens kinds must be among {KINDS}; got {list(kinds)}")
    if "tuned" in kinds and lens is None:
        raise BadInput("the tuned-lens features need a tuned lens (give `lens`, or leave 'tuned' out of `kinds`)")
    if not texts:
        raise BadInput("no input texts")
    from vocablens.lens.logit import lens_batches

    L = borders.n_layers
    seqs = []
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise BadInput(f"input {i + 1} is empty")
        try:
            seqs.append(tokenizer(t, return_tensors="pt").input_ids[0][-max_tokens:])
        except (TypeError, ValueError) as e:
            raise BadInput(f"input {i + 1} cannot be tokenized: {e}") from None
        check_ids_fit(seqs[-1], borders.input_embedding.vocab_size, tokenizer)
    # the batched lens at each input's last position, every lens from the same forwards
    per_kind = lens_batches(borders, seqs, [None if kd == "logit" else lens for kd in kinds], positions="last",
                            k=1, layers=range(L), progress=progress)
    rows = []
    for i in range(len(seqs)):
        cols = []
        for res in (r[i] for r in per_kind):
            cols += [torch.stack([ly.kl_to_final[0] for ly in res.layers]),
                     torch.stack([ly.entropy[0] for ly in res.layers]),
                     torch.log1p(torch.stack([ly.final_top1_rank[0] for ly in res.layers]).float())]
        # cpu: features for scikit-learn, which runs on the host
        rows.append(torch.cat(cols).float().cpu())
    lengths = [int(x.numel()) for x in seqs]
    names = [f"{k}/{s}/{layer}" for k in kinds for s in STATS for layer in range(L)]
    return Trajectories(features=torch.stack(rows), names=names, kinds=kinds,
                        n_tokens=torch.tensor(lengths, dtype=torch.int64))


def read_inputs(path) -> tuple[list[str], torch.Tensor | None]:
    """Inputs from a file or a directory of files.

    * ``.jsonl``: one JSON object per line with ``"text"`` and optionally ``"label"`` (0 normal,
      1 anomalous); labels count only when every line has one.
    * any other text file: one input per non-empty line (write a newline inside an input as ``\\n``).
    * a directory: every ``.jsonl`` and ``.txt`` file in it, sorted by name.
    * ``-``: standard input, one input per non-empty line.

    Files are read by :func:`vocablens.files.read_text` (a byte-order mark skipped or decoded).

    Returns:
        ``(texts, labels [N] int64 or None)``.

    Raises:
        BadInput: missing path, unreadable or non-UTF-8 file, bad JSON line, no inputs.
    """
    import json
    from pathlib import Path

    from vocablens.files import STDIN, read_text

    p = Path(path)
    if str(path) == STDIN:
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".jsonl", ".txt") and f.is_file())
    elif p.is_file():
        files = [p]
    else:
        raise BadInput(f"no such file or directory: {path}")
    texts: list[str] = []
    labels: list[int | None] = []
    for f in files:
        lines = read_text(f).splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if f.suffix == ".jsonl":
                try:
                    obj = json.loads(line)
                    text = obj["text"]
                except (ValueError, KeyError, TypeError):
                    raise BadInput(f"{f}:{n}: expected a JSON object with a \"text\" field") from None
                lab = obj.get("label")
                if lab is not None and lab not in (0, 1):
                    raise BadInput(f"{f}:{n}: label must be 0 or 1; got {lab!r}")
                texts.append(str(text))
                labels.append(lab)
            else:
                texts.append(line.replace("\\n", "\n"))
                labels.append(None)
    if not texts:
        raise BadInput(f"no inputs in {path}")
    has = all(lab is not None for lab in labels)
    return texts, (torch.tensor(labels, dtype=torch.int64) if has else None)


def fit_detector(features: torch.Tensor, method: str = "iforest", seed: int = 0):
    """Fit a novelty detector on normal inputs only.

    Args:
        features: [N, F] features of normal inputs (at least 5 distinct rows).
        method: ``"iforest"`` (IsolationForest, 200 trees) or ``"lof"`` (LocalOutlierFactor with
            novelty=True, k = min(20, N-1)), both after a StandardScaler fitted on the same inputs.

    Returns:
        A fitted scikit-learn pipeline; :func:`anomaly_scores` reads it.

    Raises:
        BadInput: unknown method, or fewer than 5 distinct normal inputs (six copies of one line
            gave LOF scores up to 1.5e10 and an AUROC of 1.0).
    """
    from sklearn.ensemble import IsolationForest
    from sklearn.neighbors import LocalOutlierFactor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if method not in DETECTORS:
        raise BadInput(f"detector must be one of {DETECTORS}; got {method!r}")
    X = features.double().cpu().numpy()  # cpu: scikit-learn runs on the host
    distinct = len({row.tobytes() for row in X})
    if distinct < 5:  # copies of one input: a zero-variance fit that scores everything else as odd
        raise BadInput(f"fit a detector on at least 5 distinct normal inputs; got {X.shape[0]} "
                       f"({distinct} distinct)")
    if method == "iforest":
        det = IsolationForest(n_estimators=200, random_state=seed)
    else:
        det = LocalOutlierFactor(n_neighbors=min(20, X.shape[0] - 1), novelty=True)
    return make_pipeline(StandardScaler(), det).fit(X)


def anomaly_scores(detector, features: torch.Tensor) -> torch.Tensor:
    """[N] float64 anomaly scores (higher = less like the normal inputs): minus the detector's
    ``score_samples``."""
    X = features.double().cpu().numpy()  # cpu: scikit-learn runs on the host
    return -torch.as_tensor(detector.score_samples(X), dtype=torch.float64)  # cpu: scores of the host detector


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` [N] for binary ``labels`` [N] (1 = anomalous).

    Raises:
        BadInput: labels not all 0/1, or only one class present.
    """
    from sklearn.metrics import roc_auc_score

    y = labels.long()
    if not bool(((y == 0) | (y == 1)).all()) or y.unique().numel() != 2:
        raise BadInput("AUROC needs labels 0 (normal) and 1 (anomalous), both present")
    return float(roc_auc_score(y.cpu().numpy(), scores.cpu().numpy()))  # cpu: scikit-learn


@dataclass(frozen=True)
class AnomalyReport:
    """Result of :func:`detect`.

    Attributes:
        scores: {"{kinds}/{detector}": [N_test] float64}; kinds is "logit", "tuned" or "logit+tuned".
        auroc: the same keys -> AUROC, when the test set is labelled (else empty).
        n_normal, n_test: inputs in each set.
    """

    scores: dict[str, torch.Tensor]
    auroc: dict[str, float]
    n_normal: int
    n_test: int


def detect(normal: Trajectories, test: Trajectories, labels: torch.Tensor | None = None,
           detectors: Sequence[str] = DETECTORS, seed: int = 0) -> AnomalyReport:
    """Fit each detector on ``normal`` and score ``test``, for each lens alone and both together.

    Raises:
        BadInput: the two sets were made with different lenses; labels of the wrong length.
    """
    if normal.kinds != test.kinds or normal.features.shape[1] != test.features.shape[1]:
        raise BadInput("the normal and test features come from different lenses or models")
    if labels is not None and labels.numel() != test.features.shape[0]:
        raise BadInput(f"{labels.numel()} labels for {test.features.shape[0]} test inputs")
    groups = [(k,) for k in normal.kinds] + ([tuple(normal.kinds)] if len(normal.kinds) > 1 else [])
    scores, aucs = {}, {}
    for g in groups:
        for method in detectors:
            key = f"{'+'.join(g)}/{method}"
            det = fit_detector(normal.select(g), method, seed)
            scores[key] = anomaly_scores(det, test.select(g))
            if labels is not None:
                aucs[key] = auroc(scores[key], labels)
    return AnomalyReport(scores=scores, auroc=aucs, n_normal=int(normal.features.shape[0]),
                         n_test=int(test.features.shape[0]))


__all__ = ["AnomalyReport", "DETECTORS", "KINDS", "Trajectories", "anomaly_scores", "auroc", "detect",
           "fit_detector", "read_inputs", "trajectory_features"]
