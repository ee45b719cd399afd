"""Corpora as token rows for :class:`vocablens.Model`: a split packed into rows [N, seq_len] with EOS
between documents (lens training and evaluation, the Jacobian lens's fit, ``settle``, the bottleneck),
named by corpus name and content hash, never by a local path. One split packing serves every lens
scored on a corpus (:meth:`CorpusRows.eval_rows`: ``lens eval``, with ``--split all`` too)."""

from __future__ import annotations

import torch

from vocablens.errors import BadInput
from vocablens.handle.protocols import NeedsPacking


class CorpusRows:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsPacking`)."""

    def corpus_rows(self: NeedsPacking, corpus: str, split: str, seq_len: int, max_tokens: int | None = None,
                    val_fraction: float = 0.1, split_seed: int = 0, shuffle_seed: int | None = None, docs=None,
                    shrink: bool = False):
        """One split of a corpus packed into rows [N, seq_len] int64 with EOS between documents; returns
        ``(rows, info)``, ``info`` naming the corpus by name and content hash, never by a local path.

        Raises:
            BadInput: the corpus is missing, or the split holds no document.
        """
        import random

        from vocablens.corpus import corpus_record, load_documents, split_documents

        docs = load_documents(corpus) if docs is None else docs
        train_docs, val_docs = split_documents(docs, val_fraction=val_fraction, seed=split_seed)
        part = train_docs if split == "train" else val_docs
        if not part:
            raise BadInput(f"corpus {corpus!r} has no {split} documents (it holds {len(docs)}); give more text")
        if shuffle_seed is not None:
            part = list(part)
            random.Random(shuffle_seed).shuffle(part)
        rows = self.pack(part, seq_len, max_tokens=max_tokens, shrink=shrink)
        rec = corpus_record(corpus, docs)
        return rows, {"corpus": rec["corpus"], "corpus_sha256": rec["corpus_sha256"], "split": split,
                      "val_fraction": val_fraction, "split_seed": split_seed, "documents": len(part),
                      "tokens": int(rows.numel()), "seq_len": int(rows.shape[1])}

    def eval_rows(self: NeedsPacking, corpus: str, split: str, seq_len: int, max_tokens: int, val_fraction: float = 0.1,
                  split_seed: int = 0, docs=None):
        """The rows a lens is scored on (``lens eval``): at most ``max_tokens`` tokens [N, T] int64 of one
        split, T = ``seq_len`` or the longest run the text allows (``shrink``); ``all`` packs every
        document (no split, nothing held out). Returns ``(rows, info)`` as :meth:`corpus_rows` (for
        ``all``: ``{"corpus", "corpus_sha256", "split": "all"}``).

        Raises:
            BadInput: the corpus is missing, or the split holds no document.
        """
        from vocablens.corpus import corpus_record, load_documents

        docs = load_documents(corpus) if docs is None else docs
        if split == "all":
            rows = self.pack(docs, seq_len, max_tokens=max_tokens, shrink=True)
            rec = corpus_record(corpus, docs)
            info = {"corpus": rec["corpus"], "corpus_sha256": rec["corpus_sha256"], "split": "all"}
        else:
            rows, info = self.corpus_rows(corpus, split, seq_len, max_tokens, val_fraction, split_seed, None, docs,
                                          shrink=True)
        return rows[: max(1, max_tokens // rows.shape[1])], info

    def first_rows(self: NeedsPacking, corpus: str, seq_len: int, max_tokens: int) -> torch.Tensor:
        """Token rows [N, seq_len] from the first documents of a corpus (more are read only when needed).

        Raises:
            BadInput: the corpus is missing or too short.
        """
        from vocablens.corpus import load_documents

        n = 4
        while True:
            docs = load_documents(corpus, max_docs=n)
            short = len(docs) < n
            try:
                rows = self.pack(docs, seq_len, max_tokens=max_tokens)
            except BadInput:
                if short:
                    raise
                rows = None
            if rows is not None and (rows.numel() + seq_len > max_tokens or short):
                return rows
            n *= 4


__all__ = ["CorpusRows"]
