"""Parameters read in vocabulary space, on :class:`vocablens.Model`: what built a prediction (``explain``),
FFN vectors and head circuits read through the head (``project``), steering by FFN value vectors
(``steer``) and two models' units aligned through their shared vocabulary (``align``); Geva et al. 2022,
Dar et al. 2022."""

from __future__ import annotations

from typing import Sequence

import torch

from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsVocabSpace


class VocabSpace:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsVocabSpace`)."""

    def explain(self: NeedsVocabSpace, text: str | torch.Tensor, position: int = -1,
                target: str | int | None = None, k: int = 5, subs: int = 5, chat: bool = False) -> R.Explanation:
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

    def project(self: NeedsVocabSpace, token: str | int | Sequence[str | int] | None = None, block: int | None = None,
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

    def steer(self: NeedsVocabSpace, promote: Sequence[str] = (), suppress: Sequence[str] = (), top_n: int = 10,
              scale: float = 8.0, blocks: Sequence[int] | None = None, suppress_mode: str = "boost", prompt: str = "",
              corpus: str = "", heldout: str = "pydoc-topics", new_tokens: int = 24, progress=None,
              notes=None, started=None) -> R.Steering:
        """Scale the FFN value vectors that promote / suppress tokens, and measure the effect on the
        tokens' mass, held-out perplexity and a greedy continuation (``vocablens steer --json``;
        Geva et al. 2022, §5.1). The hook is removed again; ``res.steering.folded()`` edits the weights.

        Args:
            promote: token strings whose vectors are boosted.
            suppress: token strings whose vectors are suppressed.
            blocks: block indices (default all).
            prompt: the probe text (default ``"The weather today is"``).
            corpus: or a corpus whose texts are the probes.
            heldout: the corpus whose held-out texts measure perplexity.
            new_tokens: greedy tokens of the continuation compared (0..512; none with ``corpus``).
            progress: ``progress(stage, done, total)`` over the forward passes.
            notes: called with a note when a token string is several tokens.
            started: called as ``started(vectors, probe texts, held-out texts)`` before measuring.

        Raises:
            BadInput: no tokens, both prompt and corpus, new_tokens outside 0..512.
        """
        from vocablens.render.steer import vector_rows
        from vocablens.surgery.io import heldout_texts
        from vocablens.vocab_space.steer import steer, vector_top_tokens
        from vocablens.vocab_space.steer_eval import measure

        checks.steer_options(promote, suppress, prompt, corpus, new_tokens)

        def ids_of(texts):
            got = []
            for t in texts:
                tid, note = self._first_token(t)
                if note and notes is not None:
                    notes(note)
                got.append(tid)
            return list(dict.fromkeys(got))

        sets = {"promote": ids_of(promote), "suppress": ids_of(suppress)}
        st = steer(self.borders, promote=sets["promote"], suppress=sets["suppress"], top_n=top_n, scale=scale,
                   blocks=blocks, suppress_mode=suppress_mode)
        probes = ([self.encode_raw(prompt or "The weather today is", 256)] if not corpus else
                  [self.encode_raw(t, 256) for t in heldout_texts(corpus, 4, 600)])
        held = [self.encode_raw(t, 256) for t in heldout_texts(heldout, 4, 800)]
        if started is not None:
            started(len(st.vectors), len(probes), len(held))
        eff = measure(self.borders, st, probes, sets, heldout=held, max_new_tokens=new_tokens if not corpus else 0,
                      progress=progress)
        rows = vector_rows(st.vectors, vector_top_tokens(self.borders, st.vectors, k=6), self.tokenizer)
        return self._result(R.Steering, eff, sets=sets, rows=rows, top_n=top_n, scale=scale,
                            suppress_mode=suppress_mode, steering=st, probes=len(probes), heldout=len(held))

    def align(self: NeedsVocabSpace, other, what: str = "ffn", blocks_a: Sequence[int] | None = None,
              blocks_b: Sequence[int] | None = None, top: int = 8, progress=None) -> R.Alignment:
        """Match this model's FFN neurons or attention heads to ``other``'s through their shared vocabulary,
        no forward pass (``vocablens align A B --json``; Dar et al. 2022, §5;
        :func:`vocablens.vocab_space.align.align_models`): each unit read in vocabulary space, compared by
        correlation, each block of this model matched one-to-one (Hungarian) to its most similar block
        of ``other``; the ``top`` best pairs listed with their 5 top tokens.

        Args:
            other: a :class:`~vocablens.handle.Model` sharing this one's vocabulary, fully or in part
                (itself works).
            what: ``ffn`` (value vectors) or ``heads`` (OV circuits).
            blocks_a: blocks of this model (default all).
            blocks_b: blocks of ``other`` (default all).
            top: best matched pairs listed with their top tokens.
            progress: ``progress(stage, done, total)``.

        Raises:
            BadInput: a bad ``what``, ``top`` < 0, a block out of range, no shared tokens.
        """
        from vocablens.render.align import token_names, top_matches
        from vocablens.vocab_space.align import align_models, unit_top_tokens

        checks.align_options(what, top)
        res = align_models(self.borders, self.tokenizer, other.borders, other.tokenizer, what=what,
                           blocks_a=blocks_a, blocks_b=blocks_b, progress=progress)

        def names(side: str, block: int, unit: int) -> list[str]:
            lm = self if side == "a" else other
            return token_names(lm.tokenizer, unit_top_tokens(lm.borders, what, block, unit, k=5))

        best = top_matches(res, names, top)
        return self._result(R.Alignment, res, best=best, other=other.provenance,
                            names=(self.spec or self.provenance.name, other.spec or other.provenance.name))


__all__ = ["VocabSpace"]
