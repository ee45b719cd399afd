"""``vocablens.Model``: one loaded model and every workflow on it, text in, results out.

``m = vocablens.load("smollm2")`` returns it. It holds the model, its tokenizer, its
:class:`~vocablens.models.Borders`, its provenance and the lenses loaded for it, and it is the one
place where text becomes ids (:meth:`~vocablens.models.LoadedModel.encode`: chat template, BOS,
batches with padding and an attention mask). Each method is one workflow: it encodes, calls the
analyses in order and hands back a :class:`~vocablens.handle.results.Result` that shows itself
(``.table()``, ``.figure()``, ``.to_json()`` -- the matching command's ``--json`` --, ``.to_pandas()``,
notebook HTML). It has no math of its own and knows no model family.

It still unpacks as ``model, tokenizer, borders, provenance = vocablens.load(...)``.

``Model`` is a facade over one mixin per topic a researcher would name, each in its own module and
typed against the one protocol of :mod:`vocablens.handle.protocols` that says what it needs:

- tokens and positions (:mod:`~vocablens.handle.tokens`): ``token_id``, ``position``;
- geometry and neighbours (:mod:`~vocablens.handle.geometry`): ``anatomy``, ``tie_check``, ``neighbors``, ``pca``;
- scoring and generation (:mod:`~vocablens.handle.scoring`): ``score``, ``generate``, ``stop_ids``;
- lenses (:mod:`vocablens.handle.lenses`: loading, reading, training, evaluation, quality, decompose):
  ``lens``, ``forward``, ``backward_lens``, ``translator``, ``load_lens``, ``train_lens``, ``eval_lens``,
  ``compare_lenses``, ``fit_jacobian_lens``, ``decompose`` ...;
- trajectories, anomalies and settling (:mod:`~vocablens.handle.trajectories`): ``trajectory``,
  ``anomaly``, ``settle``;
- parameters in vocabulary space (:mod:`~vocablens.handle.vocab_space`): ``explain``, ``project``,
  ``steer``, ``align``;
- argmax and the softmax bottleneck (:mod:`~vocablens.handle.argmax`): ``argmax``, ``reserved_tokens``,
  ``bottleneck``;
- under-trained tokens (:mod:`~vocablens.handle.undertrained`): ``undertrained``, ``undertrained_within``;
- vocabulary surgery (:mod:`~vocablens.handle.surgery`): ``expand``, ``trim``, ``save``;
- the report (:mod:`~vocablens.handle.report`): ``report``;
- corpora as token rows (:mod:`~vocablens.handle.corpus`): ``corpus_rows``, ``eval_rows``, ``first_rows``;
- images with a prompt (:mod:`~vocablens.handle.images`): ``image_prompt``, ``position_labels``,
  ``image_patch``, ``with_images``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vocablens.handle import results as R
from vocablens.handle.argmax import ArgmaxAndBottleneck
from vocablens.handle.corpus import CorpusRows
from vocablens.handle.geometry import Geometry
from vocablens.handle.images import Images
from vocablens.handle.lenses.decompose import LensDecomposition
from vocablens.handle.lenses.evaluation import LensEvaluation
from vocablens.handle.lenses.loading import LensLoading
from vocablens.handle.lenses.quality import LensQuality
from vocablens.handle.lenses.reading import LensReading
from vocablens.handle.lenses.training import LensTraining
from vocablens.handle.report import ReportWorkflow
from vocablens.handle.scoring import Scoring
from vocablens.handle.surgery import VocabularySurgery
from vocablens.handle.tokens import TokenInput
from vocablens.handle.tp_guard import guard_tensor_parallel
from vocablens.handle.trajectories import Trajectories
from vocablens.handle.undertrained import UndertrainedTokens
from vocablens.handle.vocab_space import VocabSpace
from vocablens.models.files.loaded_model import LoadedModel


@dataclass(eq=False)
class Model(TokenInput, Geometry, Scoring, LensLoading, LensReading, LensTraining, LensEvaluation, LensQuality,
            LensDecomposition, Trajectories, VocabSpace, ArgmaxAndBottleneck, UndertrainedTokens,
            VocabularySurgery, ReportWorkflow, CorpusRows, Images, LoadedModel):
    """A loaded model with its workflows (module docstring). Made by :func:`vocablens.load`, not by
    calling the class: ``m = vocablens.load("smollm2")`` reads the whole model;
    ``vocablens.load(spec, read=("embedding", "head"))`` only the parts named;
    ``vocablens.load(spec, max_memory="200MB")`` streams the blocks beyond 200 MB;
    ``device_map=`` and ``tp=True`` place one model over several devices. :meth:`of` wraps a
    :class:`~vocablens.models.LoadedModel` already loaded.

    Attributes:
        model: the ``transformers`` causal LM (``PreTrainedModel``), as :class:`~vocablens.models.LoadedModel`.
        tokenizer: its tokenizer (a ``PreTrainedTokenizerBase``).
        borders: its :class:`~vocablens.models.Borders`: the embedding, the blocks, the final norm and the head.
        provenance: its :class:`~vocablens.models.Provenance`: what was loaded, from where, in which dtype.
        spec: what it was loaded from (``smollm2``, a directory ...): names the shipped tuned lens.
        translators: lens kind -> translator loaded for this model (``tuned`` once read; more kinds
            can be added with :meth:`add_lens`).
        surgery: the :class:`~vocablens.handle.results.Surgery` record of the :meth:`expand` or
            :meth:`trim` that made this model (None for a loaded one).
        processor: a vision-language model's own processor, read on the first call with images.
    """

    spec: str | None = None
    translators: dict = field(default_factory=dict, repr=False)
    processor: Any = field(default=None, repr=False)

    def __new__(cls, *args, **kwargs):
        """Refuse ``vocablens.Model("smollm2")`` in one line naming :func:`vocablens.load` (a Model is
        made by loading; its fields are the loaded model, tokenizer, borders and provenance).

        Raises:
            TypeError: a model name or path given where the loaded ``transformers`` model goes.
        """
        first = args[0] if args else kwargs.get("model")
        if isinstance(first, (str, os.PathLike)):
            raise TypeError(f"vocablens.Model is made by loading: m = vocablens.load({str(first)!r}) "
                            "(read=(...) for some parts, max_memory=... to stream the blocks)")
        return super().__new__(cls)

    @classmethod
    def of(cls, lm, spec: str | None = None) -> "Model":
        """``lm`` (a :class:`~vocablens.models.LoadedModel`) as a Model sharing its model, tokenizer
        and borders (itself when it is one already)."""
        if isinstance(lm, Model):
            return lm
        return cls(lm.model, lm.tokenizer, lm.borders, lm.provenance,
                   spec=spec if spec is not None else getattr(lm.provenance, "spec", None))

    def _result(self, cls, value, **options) -> R.Result:
        return cls(value, self.tokenizer, self.provenance, options)

    def __repr__(self) -> str:
        b = self.borders
        return (f"vocablens.Model({self.provenance.describe()}; V={b.vocab_size:,}, d={b.d_emb}, "
                f"{b.n_layers} layers, {'tied' if b.tied else 'untied'} head)")


guard_tensor_parallel(Model, LoadedModel)  # tp=True: the workflows that do not run split refuse in one line

__all__ = ["Model"]
