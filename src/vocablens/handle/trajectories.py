"""Predictions followed through the layers, on :class:`vocablens.Model`: one token's trajectory at one
position (``trajectory``, the explorer's click), odd inputs told apart by their trajectories
(``anomaly``, ``vocablens lens anomaly``; Belrose et al. 2023, §5), and where predictions settle over a
corpus with what an early exit would save (``settle``, ``vocablens settle``).

A kind is read through the translator the handle holds for it
(:meth:`~vocablens.handle.lenses.loading.LensLoading.translator`), so the explorer, the CLI and a
notebook read the same lens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from vocablens.errors import BadInput
from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsTrajectories


@dataclass(frozen=True)
class AnomalyInputs:
    """What ``lens anomaly`` reads, checked before a model loads (:func:`anomaly_inputs`).

    Attributes:
        normal: the normal texts the detectors are fitted on (at least 5 distinct).
        test: the texts scored.
        labels: int64 [len(test)] (0 normal, 1 odd) or None.
        kinds: the lenses (``("logit",)``, ``("tuned",)`` or both).
        detectors: ``iforest`` and/or ``lof``.
    """

    normal: list[str]
    test: list[str]
    labels: torch.Tensor | None
    kinds: tuple[str, ...]
    detectors: tuple[str, ...]


def anomaly_inputs(normal, test, kind: str = "both", detector: str = "both", labels=None) -> AnomalyInputs:
    """Check the options of an anomaly run and read its inputs: a path (a .txt with one input per line, a
    .jsonl of ``{"text"}`` -- ``"label"`` on every test line gives the AUROC -- or a directory of them;
    :func:`vocablens.lens.anomaly.read_inputs`) or a list of texts (then ``labels`` for the test texts).

    Raises:
        BadInput: an unknown kind or detector, an unreadable file, fewer than 5 distinct normal inputs.
    """
    from vocablens.lens.anomaly import DETECTORS, read_inputs

    if kind not in ("logit", "tuned", "both"):
        raise BadInput(f"`kind` must be logit, tuned or both; got {kind!r}")
    if detector not in (*DETECTORS, "both"):
        raise BadInput(f"`detector` must be iforest, lof or both; got {detector!r}")
    normal_texts, _ = read_inputs(normal) if isinstance(normal, (str, Path)) else (list(normal), None)
    if isinstance(test, (str, Path)):
        test_texts, labels = read_inputs(test)
    else:
        test_texts = list(test)
        labels = None if labels is None else torch.as_tensor(labels, dtype=torch.int64)
    distinct = len(set(normal_texts))
    if distinct < 5:
        where = f"{normal} holds" if isinstance(normal, (str, Path)) else "got"
        raise BadInput(f"`normal` needs at least 5 distinct inputs to fit a detector; {where} "
                       f"{len(normal_texts)} ({distinct} distinct)")
    return AnomalyInputs(normal_texts, test_texts, labels, ("logit", "tuned") if kind == "both" else (kind,),
                         DETECTORS if detector == "both" else (detector,))


class Trajectories:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsTrajectories`)."""

    def trajectory(self: NeedsTrajectories, text, position: int = -1, token: str | int | None = None,
                   kinds: Sequence[str] = ("logit", "tuned"), chat: bool = False, stream=None,
                   images=None) -> R.Trajectory:
        """One token's rank (0 = top) and probability, and the top-1, at every layer 0..L at one position,
        through each lens of ``kinds`` (the explorer's ``/api/trajectory``;
        :func:`vocablens.lens.trajectory.layer_readout`: one streamed pass over the head).

        Ranks count real tokens whose logit exceeds the token's, as the lens's ``final_top1_rank`` does;
        the tuned lens translates layers < L, as the lens does.

        Args:
            text: the prompt, or its ids [T] / [1, T].
            position: the position read (negative from the end).
            token: the token followed (its text, one token, or its id as an int or ``"id:N"``:
                :meth:`token_id`; default: the model's top-1 there).
            kinds: lenses read (``logit``, ``tuned`` or any kind with a translator).
            stream: the prompt's :meth:`forward`, read instead of running the model again.
            images: for a vision-language model, images read with the prompt ``text`` by the model's
                own processor (:meth:`image_prompt`); ``position`` counts the image positions too.

        Raises:
            BadInput: a position outside the prompt, an unknown kind or one with no translator.
            TokenNotInVocabulary: ``token`` is not one token.
        """
        from vocablens.lens.trajectory import layer_readout

        inputs = None
        if images is not None:
            ids, inputs = self.image_prompt(text, images)
        else:
            ids = self._ids(text, chat=chat)
        p = self.position(ids, position)
        translators = {kd: self.translator(kd) for kd in kinds}
        resid, logits = stream if stream is not None else self.forward(ids, inputs)
        if token is None:
            tid = int(logits[0, p, : self.borders.real_vocab_size].argmax())
        else:
            tid = self.token_id(token, "token")
        L = self.borders.n_layers
        with torch.no_grad():
            value = {kd: layer_readout(self.borders, resid[:, 0, p], range(L + 1), torch.tensor(tid), k=1,
                                       translator=tr) for kd, tr in translators.items()}  # [L+1] each
        return self._result(R.Trajectory, value, input_ids=ids[0].detach().cpu(), position=p, token_id=tid,
                            n_layers=L, input_labels=self.position_labels(ids))

    def anomaly(self: NeedsTrajectories, normal, test, labels=None, kind: str = "both", detector: str = "both",
                seed: int = 0, lens_dir: str | Path | None = None, progress=None) -> R.Anomaly:
        """Score inputs by how odd their lens trajectories are (``vocablens lens anomaly --json``;
        Belrose et al. 2023, §5): detectors fitted on the normal inputs' trajectories (per layer: KL to
        the final distribution, entropy, rank of the final token; logit and tuned lens) score the test
        inputs, higher = odder.

        Args:
            normal: the normal inputs: a path or a list of texts (:func:`anomaly_inputs`), or the
                :class:`AnomalyInputs` it returns (then ``test``, ``labels``, ``kind`` and ``detector``
                are its).
            test: the inputs scored: a path or a list of texts.
            labels: 0 normal / 1 odd per test text (a list of tests; a .jsonl gives its own).
            kind: ``logit``, ``tuned`` (this model's tuned lens, or ``lens_dir`` for this call) or ``both``.
            detector: ``iforest``, ``lof`` or ``both``.
            seed: the isolation forest's seed.
            lens_dir: a tuned-lens directory read as ``tuned`` for this call only.
            progress: ``progress(stage, done, total)`` per input.

        Raises:
            BadInput: as :func:`anomaly_inputs`; no tuned lens for ``tuned``.
        """
        from vocablens.lens.anomaly import detect, trajectory_features

        inp = normal if isinstance(normal, AnomalyInputs) else anomaly_inputs(normal, test, kind, detector, labels)
        lens = self._lens_for_call("tuned", lens_dir) if "tuned" in inp.kinds else None
        feats = []
        for name, texts in (("normal inputs", inp.normal), ("test inputs", inp.test)):
            stage = f"trajectories of {name}"
            if progress is not None:
                progress(stage, 0, len(texts))
            feats.append(trajectory_features(self.borders, self.tokenizer, texts, lens=lens, kinds=inp.kinds,
                                             progress=None if progress is None else
                                             (lambda d, n, s=stage: progress(s, d, n))))
        rep = detect(feats[0], feats[1], inp.labels, detectors=inp.detectors, seed=seed)
        return self._result(R.Anomaly, rep, kinds=inp.kinds, detectors=inp.detectors, texts=inp.test,
                            labels=inp.labels)

    def settle(self: NeedsTrajectories, corpus: str, max_tokens: int = 2048, seq_len: int = 256, batch: int = 2,
               thresholds: Sequence[float] = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99), lens: str = "logit",
               min_layer: int = 0, rows: torch.Tensor | None = None, batches=None,
               lens_dir: str | Path | None = None, on_tokens=None) -> R.Settle:
        """Where predictions settle over a corpus, and what an early exit would save and keep
        (``vocablens settle --corpus C --json``; :func:`vocablens.vocab_space.settle`).

        Args:
            corpus: a named corpus, a file or a directory (its first documents, ``max_tokens`` tokens
                in rows of ``seq_len``, ``batch`` rows per forward).
            lens: ``logit`` or a kind with a translator (``tuned``).
            batches: an iterable of row batches [b, seq_len] to read instead (the CLI's progress).
            lens_dir: a tuned-lens directory read as ``tuned`` for this call only.
            on_tokens: progress, ``on_tokens(tokens read)`` after each layer of each batch.

        Raises:
            BadInput: bad sizes, a missing corpus, an unknown lens.
        """
        from vocablens import vocab_space as vs

        checks.settle_options(seq_len, batch, max_tokens)
        translator = self._lens_for_call(lens, lens_dir)
        if batches is None:
            rows = self.first_rows(corpus, seq_len, max_tokens) if rows is None else rows
            batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
        res = vs.settle(self.borders, batches, thresholds=list(thresholds), translator=translator,
                        min_layer=min_layer, on_tokens=on_tokens)
        return self._result(R.Settle, res, corpus=corpus, plot=None)


__all__ = ["AnomalyInputs", "Trajectories", "anomaly_inputs"]
