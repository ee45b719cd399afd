"""The tokens the head can and cannot rank first, on :class:`vocablens.Model`: the argmax scan with its
certificates (``argmax``, Grivas et al. 2022), the tokens named reserved (``reserved_tokens``) and the
softmax bottleneck (``bottleneck``, Yang et al. 2018)."""

from __future__ import annotations

import torch

from vocablens.errors import BadInput
from vocablens.handle import checks
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsArgmax


class ArgmaxAndBottleneck:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsArgmax`)."""

    def argmax(self: NeedsArgmax, bias: str = "auto", include_padding: bool = False, norm: bool = True,
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

    def reserved_tokens(self: NeedsArgmax) -> torch.Tensor:
        """Bool [V]: the tokens whose name marks them reserved or unused (Llama 3's
        ``<|reserved_special_token_N|>``, Gemma's ``<unusedN>``); all False without a tokenizer
        (:func:`vocablens.argmax.model.reserved_tokens`)."""
        from vocablens.argmax.model import reserved_tokens

        return reserved_tokens(self.tokenizer, self.borders.vocab_size)

    def bottleneck(self: NeedsArgmax, corpus: str = "pydoc-topics", contexts: int = 0, seq_len: int = 128,
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

__all__ = ["ArgmaxAndBottleneck"]
