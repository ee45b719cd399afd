"""``vocablens.Model``: one loaded model and every workflow on it, text in, results out.

``m = vocablens.load("smollm2")`` returns it. It holds the model, its tokenizer, its
:class:`~vocablens.models.Borders`, its provenance and the lenses loaded for it, and it is the one
place where text becomes ids (:meth:`~vocablens.models.LoadedModel.encode`: chat template, BOS,
batches with padding and an attention mask). Each method is one workflow: it encodes, calls the
analyses in order and hands back a :class:`~vocablens.handle.results.Result` that shows itself
(``.table()``, ``.figure()``, ``.to_json()`` -- the matching command's ``--json`` --, ``.to_pandas()``,
notebook HTML). It has no math of its own and knows no model family.

It still unpacks as ``model, tokenizer, borders, provenance = vocablens.load(...)``.
Surgery (``expand``, ``trim``, ``save``) lives in :mod:`vocablens.handle.surgery`, the lens and
report workflows in :mod:`vocablens.handle.lenses`, a token's trajectory and lens anomalies in
:mod:`vocablens.handle.trajectories`, the softmax bottleneck and the alignment of two models in
:mod:`vocablens.handle.matrices`, corpora as token rows in :mod:`vocablens.handle.corpus`, lenses
compared, the backward lens and the Jacobian fit in :mod:`vocablens.handle.lens_compare`, scoring
and generating in :mod:`vocablens.handle.scoring`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.corpus import CorpusWorkflows
from vocablens.handle.images import ImageWorkflows
from vocablens.handle.lens_compare import LensCompareWorkflows
from vocablens.handle.lens_decompose import LensDecompose
from vocablens.handle.lens_quality import LensQuality
from vocablens.handle.lens_training import LensTraining
from vocablens.handle.lenses import LensWorkflows
from vocablens.handle.matrices import MatrixWorkflows
from vocablens.handle.scoring import ScoringWorkflows
from vocablens.handle.surgery import SurgeryWorkflows
from vocablens.handle.tp_guard import guard_tensor_parallel
from vocablens.handle.trajectories import TrajectoryWorkflows
from vocablens.models.files.loaded_model import LoadedModel


@dataclass(eq=False)
class Model(ScoringWorkflows, SurgeryWorkflows, LensTraining, LensQuality, LensDecompose, LensWorkflows, TrajectoryWorkflows,
            MatrixWorkflows, CorpusWorkflows, LensCompareWorkflows, ImageWorkflows, LoadedModel):
    """A loaded model with its workflows (module docstring).

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

    # ------------------------------------------------------------------------- the two matrices
    def anatomy(self, batch: int = 1, context: int = 4096, dtype: str = "float32",
                name: str | None = None, notes: Sequence[str] | None = None) -> R.Anatomy:
        """Parameters, bytes and FLOPs of the embedding and LM head, counted on the loaded weights
        (``vocablens anatomy --load --json``; :func:`~vocablens.accounting.anatomy.anatomy`).

        Args:
            batch: the batch of the logits tensor [batch, context, V] sized.
            context: its context length, also for attention FLOPs.
            dtype: the logits' dtype (``float32``, ``bfloat16``, ``float16``).
            name: the column's name (default: the spec it was loaded from).
            notes: notes put first (default: the provenance's, e.g. a GGUF file's metadata that
                disagrees with its tensors).

        Raises:
            BadInput: batch or context < 1, an unknown dtype.
        """
        from vocablens.accounting.anatomy import anatomy, logits_memory

        logits_memory(1, batch, context, dtype)
        return self._result(R.Anatomy, anatomy(self.borders, name=name or self.spec or self.provenance.name,
                                               batch=batch, context=context, logits_dtype=dtype,
                                               source="loaded model",
                                               notes=tuple(getattr(self.provenance, "notes", ()) or ())
                                               if notes is None else tuple(notes)))

    def tie_check(self) -> R.TieCheck:
        """Whether the head is tied, by storage and by value (:func:`~vocablens.geometry.tying.tie_check`)."""
        from vocablens.geometry.tying import tie_check

        return self._result(R.TieCheck, tie_check(self.borders))

    def neighbors(self, tokens: str | Sequence[str], k: int = 10, mean: bool = False) -> R.Neighbors:
        """Cosine nearest neighbours of token strings in the embedding and an untied head
        (``vocablens neighbors TOKEN... -k K --json``; :func:`~vocablens.geometry.embedding.nearest_neighbors`).

        Args:
            tokens: a token string (``" king"``: the leading space is part of a word-initial token; ``"4"``
                is the text "4"), an id (an int or ``"id:N"``), or several.
            k: neighbours per token, >= 1.
            mean: a string of several tokens uses the mean of their rows (default: its first token).

        Raises:
            BadInput: k < 1. TokenNotInVocabulary: an empty string, or one that encodes to no token.
        """
        from vocablens.geometry.embedding import nearest_neighbors

        tokens = [tokens] if isinstance(tokens, (str, int)) else list(tokens)
        tokens = [f"id:{t}" if isinstance(t, int) and not isinstance(t, bool) else t for t in tokens]  # as shown
        checks.at_least("k", k)
        checks.token_strings(tokens)
        return self._result(R.Neighbors, nearest_neighbors(self.borders, self.tokenizer, tokens, k=k, use_mean=mean))

    def pca(self, words: Sequence[str] | dict[str, Sequence[str]] | None = None, prefix: str = " ",
            seed: int = 0) -> R.WordPCA:
        """3-D PCA of the embedding rows of words (the report's figure; ``.figure()`` draws it).

        Args:
            words: a list of words, or group name -> words (default: the report's groups).
            prefix: put in front of each word (a leading space: the word-initial token).
            seed: the random projection's seed.

        Raises:
            BadInput: fewer than 4 of the words are single tokens.
        """
        from vocablens.geometry.embedding import word_pca

        groups = {"words": list(words)} if words is not None and not isinstance(words, dict) else words
        return self._result(R.WordPCA, word_pca(self.borders, self.tokenizer, groups, prefix=prefix, seed=seed))

    # ------------------------------------------------------------------------- through the head
    def single_token(self, text: str | int) -> int:
        """The id of a token named by its text (exactly one token) or explicitly by its id (``"id:N"``
        or an int): :meth:`token_id`.

        Raises:
            TokenNotInVocabulary: several tokens or none, or an id outside the vocabulary.
        """
        return self.token_id(text)

    def explain(self, text: str | torch.Tensor, position: int = -1, target: str | int | None = None, k: int = 5,
                subs: int = 5, chat: bool = False) -> R.Explanation:
        """What built a prediction: per-block attention/FFN updates, FFN sub-updates and per-head logit
        attribution in vocabulary space (``vocablens explain TEXT -p POS -t TARGET --json``;
        :func:`vocablens.vocab_space.explain`, Geva et al. 2022).

        Args:
            text: the prompt (or its ids [T] / [1, T], an integer tensor or a list of ints).
            position: the position explained (negative from the end).
            target: a token to follow and attribute (default: the top-1): its text, or its id as an
                int or ``"id:N"`` (:meth:`token_id`).
            k: tokens per update.
            subs: FFN sub-updates kept per block.

        Raises:
            BadInput: empty prompt, k < 1, a position outside the prompt.
            TokenNotInVocabulary: ``target`` is not one token.
        """
        from vocablens import vocab_space as vs

        checks.at_least("k", k)
        ids = self._ids(text, chat=chat)
        tid = None if target is None else self.token_id(target, "target")
        e = vs.explain(self.borders, ids, position=position, token_id=tid, k=k, n_sub=subs)
        return self._result(R.Explanation, e)

    def project(self, token: str | int | Sequence[str | int] | None = None, block: int | None = None,
                neurons: Sequence[int] | None = None, k: int = 10, keys: bool = False, sample: int | None = None,
                seed: int = 0, norm_gain: bool = True, interpretable: int = 0, head: int | None = None,
                circuit: str = "ov", max_sources: int | None = None) -> R.Projection:
        """FFN value (or key) vectors in vocabulary space, or the reverse search: the vectors that
        promote and suppress a token (``vocablens project ... --json``; Geva et al. 2022, Dar et al. 2022).

        Args:
            token: token(s), each its text or its id (an int or ``"id:N"``, :meth:`token_id`): reverse
                search (with the top tokens of the vectors found).
            block: a block 0..L-1 (its vectors only).
            neurons: these value vectors of ``block``; without them, ``sample`` random ones
                (default 4) per block (of ``block`` when given).
            k: tokens (or pairs, or vectors) listed.
            keys: key vectors instead of value vectors.
            sample: random vectors per block (default 4; 32 with ``interpretable``).
            seed: the sample's seed.
            norm_gain: read through the final norm's gain (the map the model uses).
            interpretable: the most interpretable of that many sampled vectors per block instead.
            head: a head of ``block``: its OV or QK ``circuit`` (``max_sources`` source tokens).
            circuit: ``ov`` or ``qk``.
            max_sources: source tokens of the circuit (default: the analysis's).

        Raises:
            BadInput: k < 1, a block out of range, ``neurons`` without ``block``.
            TokenNotInVocabulary: a token that is not one token.
        """
        from vocablens import vocab_space as vs
        from vocablens.render.vocab_space import search_vectors

        b = self.borders
        checks.at_least("k", k)
        checks.block_in_range(block, b.n_layers)
        if interpretable:
            res = vs.interpretable_vectors(b, n=interpretable, per_block=sample or 32, k=k, seed=seed,
                                           apply_norm_gain=norm_gain)
            return self._result(R.Projection, res, how="interpretable")
        if head is not None:
            checks.needs("head", head, "block", block)
            kw = {} if max_sources is None else {"max_sources": max_sources}
            res = vs.head_circuit(b, block, head, circuit=circuit, k=k, apply_norm_gain=norm_gain, **kw)
            return self._result(R.Projection, res, how="circuit")
        if token is not None and token != [] and token != "":
            items = [token] if isinstance(token, (str, int)) else list(token)
            tids = [self.token_id(t, "token") for t in items]
            res = vs.search_tokens(b, tids, k=k, apply_norm_gain=norm_gain)
            layers, ns = search_vectors(res)
            tops = vs.project_vectors(b, layers, ns, k=min(8, b.real_vocab_size), apply_norm_gain=norm_gain)
            return self._result(R.Projection, res, how="search", tops=tops)
        if neurons:
            checks.needs("neurons", neurons, "block", block)
            layers, ns = [block] * len(neurons), list(neurons)
        else:
            layers, ns = vs.sample_neurons(b, 4 if sample is None else sample, seed)
            if block is not None:
                pairs = [(ly, n) for ly, n in zip(layers, ns) if ly == block]
                layers, ns = [p[0] for p in pairs], [p[1] for p in pairs]
        res = vs.project_vectors(b, layers, ns, k=k, kind="key" if keys else "value", apply_norm_gain=norm_gain)
        return self._result(R.Projection, res, how="vectors")

    def argmax(self, bias: str = "auto", include_padding: bool = False, norm: bool = True,
               verify_all: bool = False, budget_s: float | None = None, stored: str = "readwrite",
               progress=None, reserved: torch.Tensor | None = None) -> R.Argmax:
        """Tokens that can never be the top prediction, with certificates (``vocablens argmax --json``;
        :func:`~vocablens.argmax.argmax_for_borders`, Grivas et al. 2022).

        Args:
            bias: ``auto``, ``on`` or ``off`` (the head's bias). include_padding: let padding and
                never-trained rows compete. norm: bound the highest probability under the final norm.
            verify_all: re-check every certificate in float64. budget_s: wall seconds (None: no limit).
            stored: ``readwrite`` (reuse and store completed scans), ``read`` or ``off``.
            progress: ``progress(stage, done, total)``.
            reserved: bool [V], the tokens named reserved or unused (default: :meth:`reserved_tokens`;
                read them first to let go of the tokenizer during the scan).

        Raises:
            BadInput: a bad ``bias`` or budget.
        """
        from vocablens.argmax.model import argmax_for_borders

        checks.one_of("bias", bias, ("auto", "on", "off"))
        dev = str(self.borders.device)
        ma = argmax_for_borders(self.borders, bias=bias, include_padding=include_padding,
                                include_untrained=include_padding, norm=norm,
                                verify="all" if verify_all else "borderline", progress=progress,
                                time_budget_s=budget_s or None, stored=stored,
                                reserved=self.reserved_tokens() if reserved is None else reserved,
                                device=dev if dev.startswith("cuda") else "cpu")
        return self._result(R.Argmax, ma)

    def reserved_tokens(self) -> torch.Tensor:
        """Bool [V]: the tokens whose name marks them reserved or unused (Llama 3's
        ``<|reserved_special_token_N|>``, Gemma's ``<unusedN>``); all False without a tokenizer
        (:func:`vocablens.argmax.model.reserved_tokens`)."""
        from vocablens.argmax.model import reserved_tokens

        return reserved_tokens(self.tokenizer, self.borders.vocab_size)

    def undertrained(self, candidates: int | None = 500, indicator: str = "auto", verify: bool = True,
                     batch_size: int = 64, argmax_verdicts=None,
                     progress=None) -> R.Undertrained:
        """Under-trained tokens: tokenizer classes, an indicator from the matrices, verification by
        prompting (``vocablens undertrained --json``; Land & Bartolo 2024).

        Args:
            candidates: lowest-indicator tokens verified (None: the paper's lowest 2%).
            indicator: ``auto``, ``unembedding_cosine`` or ``embedding_norm``.
            argmax_verdicts: an argmax scan shown beside each row: its per-token verdicts [V], an
                :meth:`argmax` result, or the dict ``vocablens argmax --json`` printed
                (:func:`vocablens.undertrained.beside.argmax_verdicts`).

        Raises:
            BadInput: candidates < 0 or batch_size < 1; a scan of another vocabulary size, or a dict
                that is not an argmax result.
        """
        from vocablens.undertrained import undertrained
        from vocablens.undertrained.beside import argmax_verdicts as verdicts_of

        checks.undertrained_options(candidates, batch_size)
        if argmax_verdicts is not None and not isinstance(argmax_verdicts, (list, tuple)):
            argmax_verdicts = verdicts_of(getattr(argmax_verdicts, "value", argmax_verdicts), self.borders.vocab_size)
        res = undertrained(self.borders, self.tokenizer, candidates=candidates or None, indicator=indicator,
                           verify=verify, batch_size=batch_size, progress=progress)
        return self._result(R.Undertrained, res, verdicts=argmax_verdicts)

    # ------------------------------------------------------------------------------------ helpers
    def _ids(self, x, chat: bool = False, prefix: str = "", what: str = "text") -> torch.Tensor:
        """Text (encoded by :meth:`encode`) or the ids of one prompt (checked by :meth:`prompt_ids`,
        never cast) -> [1, T] int64.

        Raises:
            BadInput: as :meth:`encode` / :meth:`prompt_ids` (ids of several prompts included).
        """
        if isinstance(x, str):
            return self.encode(x, chat=chat, prefix=prefix)
        return self.prompt_ids(x, what=what)[0].reshape(1, -1)

    def __repr__(self) -> str:
        b = self.borders
        return (f"vocablens.Model({self.provenance.describe()}; V={b.vocab_size:,}, d={b.d_emb}, "
                f"{b.n_layers} layers, {'tied' if b.tied else 'untied'} head)")


guard_tensor_parallel(Model, LoadedModel)  # tp=True: the workflows that do not run split refuse in one line

Any  # noqa: B018  (typing name kept for the docs' signatures)
__all__ = ["Model"]
