"""The head and the FFNs as matrices, on :class:`vocablens.Model`: the softmax bottleneck (``bottleneck``:
the spectra of W_U and of the log-probabilities over real contexts; Yang et al. 2018) and the alignment of
two models' units through their shared vocabulary (``align``; Dar et al. 2022, §5)."""

from __future__ import annotations

from typing import Sequence

from vocablens.handle import checks
from vocablens.errors import BadInput
from vocablens.handle import results as R


class MatrixWorkflows:
    """Mixed into :class:`~vocablens.handle.Model` (fields, :meth:`pack`)."""

    def bottleneck(self, corpus: str = "pydoc-topics", contexts: int = 0, seq_len: int = 128,
                   progress=None) -> R.Bottleneck:
        """Softmax bottleneck (``vocablens bottleneck --json``; Yang et al. 2018): singular spectra and
        numerical ranks of W_U [V, d] and of the log-probabilities [N, V] over N > d real contexts
        (:func:`vocablens.argmax.bottleneck.softmax_bottleneck`).

        Args:
            corpus: a named corpus or a path; its documents packed into rows of ``seq_len`` tokens.
            contexts: N positions read (default d + 64; must exceed d).
            progress: ``progress(stage, done, total)``.

        Raises:
            BadInput: seq_len < 2, contexts <= d, a corpus with fewer than N tokens.
        """
        from vocablens.argmax.bottleneck import context_hidden, softmax_bottleneck
        from vocablens.corpus import load_documents
        from vocablens.units import plural

        checks.at_least("seq_len", seq_len, 2)
        b = self.borders
        n = contexts or (b.d_emb + 64)
        if n <= b.d_emb:
            raise BadInput(f"`contexts` must exceed d = {b.d_emb} to test the rank bound; got {n}")
        rows = -(-n // seq_len)
        ids = self.pack(load_documents(corpus), seq_len, max_tokens=rows * seq_len)
        if ids.numel() < n:
            raise BadInput(f"corpus {corpus!r} gives {plural(ids.numel(), 'token')}, fewer than `contexts` {n}")
        H = context_hidden(b, ids, progress=progress)[:n]
        U = b.unembedding
        res = softmax_bottleneck(U.weight, H, bias=U.bias, logit_scale=U.logit_scale, softcap=U.softcap,
                                 progress=progress)
        return self._result(R.Bottleneck, res, corpus=corpus)

    def align(self, other, what: str = "ffn", blocks_a: Sequence[int] | None = None,
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
