"""Vocabulary surgery on :class:`vocablens.Model`: ``expand`` and ``trim`` each return a new, verified
Model (its ``surgery`` result holds what changed and the checks), and ``save`` writes any Model as a
Hugging Face model directory (with the surgery's record beside it).

The chains live here, once: expand -> verify on held-out text -> the new rows' under-training
indicator; trim -> (drop verified under-trained tokens) -> verify against the original -> compare the
corpus's tokenization (Gee et al. 2022 for the sub-token mean; Land & Bartolo 2024 for the indicator).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from vocablens.handle import checks
from vocablens.errors import BadInput
from vocablens.handle import results as R
from vocablens.handle.protocols import NeedsSurgery
from vocablens.handle.stages import stage


class VocabularySurgery:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsSurgery`)."""

    #: the record of the surgery that made this model (None for a loaded one)
    surgery: R.Surgery | None = None
    #: what :meth:`save` writes beside the weights: ``(probe_texts, extra_json)``
    _save_with: tuple = ((), {})

    def _derived(self: NeedsSurgery, model, tokenizer, surgery: R.Surgery, probe_texts, extra_json):
        from vocablens.models.borders import Borders

        new = type(self)(model, tokenizer, Borders.from_model(model, tokenizer=tokenizer), self.provenance,
                         spec=self.spec)
        new.surgery = surgery
        new._save_with = (list(probe_texts), dict(extra_json))
        return new

    def expand(self: NeedsSurgery, tokens: Sequence[str] | str, init: str = "subtoken-mean", interpolation: float = 0.5,
               special: bool = False, eval_corpus: str = "pydoc-topics", eval_text: str = "", eval_texts: int = 4,
               eval_chars: int = 800, sample: str = "", seed: int = 0, heldout: Sequence[str] | None = None,
               status=None):
        """Add tokens: new rows on both ends (tied stays tied), verified on held-out text
        (``vocablens expand --add T ... --json``; :func:`vocablens.surgery.expand_vocab`,
        :func:`~vocablens.surgery.verify_expansion`, the new rows' indicator).

        Args:
            tokens: the token strings to add (a leading space is kept).
            init: ``subtoken-mean`` (default), ``mean``, ``interpolate``, ``zeros`` or ``random``.
            eval_corpus: the held-out text is this corpus's validation split, ``eval_texts`` chunks of
                ``eval_chars`` characters.
            eval_text: or this text, chunked the same way.
            sample: a sentence shown tokenized before and after (default: built from the new tokens).
            seed: the seed of ``init="random"``.
            heldout: the held-out texts themselves (instead of reading ``eval_corpus`` / ``eval_text``).
            status: ``status(message)`` context manager factory for each stage (the CLI's spinner).

        Returns:
            a new :class:`~vocablens.handle.Model`; ``.surgery`` its verified record
            (``.surgery.to_json()`` is ``expand --json`` with ``"out": null`` until :meth:`save`).

        Raises:
            BadInput: no tokens, bad sizes, an unknown init. As the analyses otherwise.
        """
        from vocablens.render.surgery_undertrained import new_rows_to_dict
        from vocablens.surgery import expand_vocab, verify_expansion
        from vocablens.surgery.io import chunk_texts, heldout_texts
        from vocablens.undertrained.newrows import new_row_indicators

        tokens = [tokens] if isinstance(tokens, str) else list(tokens)
        if not tokens:
            raise BadInput("no tokens to add: give `tokens`")
        checks.eval_text_options(eval_texts, eval_chars)
        texts = list(heldout) if heldout is not None else chunk_texts([eval_text], eval_texts, eval_chars) \
            if eval_text.strip() else heldout_texts(eval_corpus, eval_texts, eval_chars)
        with stage(status, "expanding the vocabulary ..."):
            ex = expand_vocab(self.model, self.tokenizer, tokens, init=init, special=special,
                              interpolation=interpolation, seed=seed)
        res = ex.result
        sample = sample or ("In this note," + "".join(t if t.startswith(" ") else " " + t for t in tokens) + ".")
        with stage(status, "verifying on held-out text ..."):
            v = verify_expansion(self.model, self.tokenizer, ex.model, ex.tokenizer, res.new_ids, texts,
                                 res.trained_rows_head, sample)
        new = self._derived(ex.model, ex.tokenizer, None, [sample, *texts], {})
        with stage(status, "the new rows' under-training indicator ..."):
            nb, idx = new.borders, res.new_ids
            ind = new_rows_to_dict(res, new_row_indicators(self.borders, self.tokenizer, nb.input_embedding.weight[idx],
                                                           None if nb.tied else nb.unembedding.weight[idx]))
        record = {"command": "expand", "source_model": self.provenance.to_dict(), "expansion": res.to_dict(),
                  "verification": v.to_dict(), "indicator": ind}
        new.surgery = self._result(R.Surgery, res, command="expand", verification=v, indicator=ind, out=None)
        new._save_with = ([sample, *texts], {"vocablens_surgery.json": record})
        return new

    def trim(self: NeedsSurgery, corpus: str = "", token_list: Sequence[str] = (), max_docs: int | None = None,
             verify_texts: int = 3, verify_tokens: int = 128, drop_undertrained: bool = False,
             undertrained_candidates: int = 500, documents: Sequence[str] | None = None, status=None,
             progress=None):
        """Keep only the tokens a corpus uses (plus specials, bytes and merge parts): both matrices
        sliced, the tokenizer rebuilt, the result checked against this model on corpus documents
        (``vocablens trim --corpus C --json``; :func:`vocablens.surgery.trim_vocab`).

        Args:
            corpus: a file, a directory or a named corpus whose tokens are kept.
            token_list: more tokens to keep: vocabulary strings or ids written ``id:N``, one per item
                (:func:`~vocablens.surgery.trim.read_token_list`).
            max_docs: read at most this many corpus documents (None: all).
            verify_texts: corpus documents the trimmed model is checked on.
            verify_tokens: tokens read from the start of each check document.
            drop_undertrained: also remove the tokens verified under-trained (Land & Bartolo 2024).
            undertrained_candidates: lowest-indicator tokens verified for ``drop_undertrained``.
            documents: the corpus's texts themselves (instead of reading ``corpus``).
            status: ``status(message)`` context manager factory for each stage (the CLI's spinner).
            progress: ``progress(phase) -> (callback, close)`` for the phases ``corpus`` (reading its
                tokens), ``undertrained`` and ``tokenization`` (the corpus compared); callbacks take
                ``(stage, done, total)``.

        Returns:
            a new :class:`~vocablens.handle.Model`; ``.surgery`` its verified record.

        Raises:
            BadInput: no corpus, documents or token list, bad sizes. TrimRejected: the check failed.
        """
        from vocablens.corpus import load_documents
        from vocablens.surgery import corpus_token_ids, trim_vocab, verify_trim
        from vocablens.surgery.trim import read_token_list, tokenization_mismatches
        from vocablens.surgery.verify import accept_trim
        from vocablens.units import plural

        if not corpus and not token_list and documents is None:
            raise BadInput("give corpus, documents or token_list: the tokens to keep")
        checks.at_least_ge("undertrained_candidates", undertrained_candidates)
        texts = list(documents) if documents is not None else \
            [d.text for d in load_documents(corpus, max_docs=max_docs or None)] if corpus else []
        tok = self.tokenizer
        used = _in_phase(progress, "corpus", lambda cb: corpus_token_ids(tok, texts, progress=cb)
                         | read_token_list(list(token_list), tok))
        seeds, ut, rows_without = used, None, None
        if drop_undertrained:
            seeds, ut, rows_without = _without_undertrained(self, used, undertrained_candidates, progress)
        with stage(status, "trimming the vocabulary ..."):
            tr = trim_vocab(self.model, tok, seeds)
        checked, drop = _documents_to_check(tok, texts, used, tr, ut, rows_without)
        check_texts = checked[:verify_texts] if checked else [tok.decode(sorted(seeds)[:200])]
        with stage(status, f"checking the trimmed model against the original on {plural(len(check_texts), 'text')} ..."):
            v = verify_trim(self.model, tok, tr.model, tr.tokenizer, tr.kept_old_ids, check_texts,
                            max_tokens=verify_tokens)
        mismatches = _in_phase(progress, "tokenization", lambda cb: tokenization_mismatches(
            tok, tr.tokenizer, tr.kept_old_ids, checked, progress=cb))
        accept_trim(v, mismatches)
        surgery = self._result(R.Surgery, tr.result, command="trim", verification=v, out=None, corpus=corpus or None,
                               docs_checked=len(checked), mismatches=mismatches, drop=drop)
        return self._derived(tr.model, tr.tokenizer, surgery, check_texts,
                             _trim_files(self.provenance, corpus, tr, v, checked, drop))

    def save(self: NeedsSurgery, out: str | os.PathLike, force: bool = False) -> Path:
        """Write this model as a Hugging Face model directory (safetensors, config, tokenizer; written
        to a temporary directory and renamed), with the surgery's record (``vocablens_surgery.json``,
        and ``vocab_map.json`` after a trim) when it came from :meth:`expand` or :meth:`trim`; the
        tokenizer is reloaded from the directory and checked on the probe texts. Returns the path.

        Raises:
            OutputExists: ``out`` exists and not ``force``. BadInput: ``out`` empty.
        """
        from vocablens.surgery.io import check_out, save_model_dir

        from vocablens.handle.quiet import quiet_loading

        path = check_out(str(out), force)
        probes, extra = self._save_with
        with quiet_loading():  # no transformers progress bar ("Writing model shards") in a notebook
            save_model_dir(self.model, self.tokenizer, path, force=force, probe_texts=list(probes) or None,
                           extra_json=dict(extra) or None)
        if self.surgery is not None:
            import dataclasses

            self.surgery = dataclasses.replace(self.surgery, options={**self.surgery.options, "out": path})
        return path


def _in_phase(progress, name: str, work):
    """``work(callback)`` under the progress phase ``name`` (``progress(name) -> (callback, close)``,
    None: no progress), closed also when ``work`` raises."""
    cb, close = progress(name) if progress else ((lambda *_: None), (lambda: None))
    try:
        return work(cb)
    finally:
        close()


def _without_undertrained(m, used: set[int], candidates: int, progress):
    """The ``candidates`` lowest-indicator tokens of ``m`` verified under-trained by prompting (stages as
    ``vocablens undertrained``) dropped from ``used``: -> (ids to keep, the verification, rows_without)."""
    from vocablens.surgery import trim_undertrained as tu

    ut = _in_phase(progress, "undertrained", lambda cb: tu.verified_undertrained(m.borders, m.tokenizer, candidates,
                                                                                 progress=cb))
    seeds, rows_without = tu.drop_undertrained(m.model, m.tokenizer, used, ut.verified.tolist())
    return seeds, ut, rows_without


def _documents_to_check(tok, texts: list[str], used: set[int], tr, ut, rows_without):
    """The corpus documents the trim is checked on, and the drop's summary (None without a drop):
    documents holding a dropped under-trained token are spelled otherwise, so they are left out."""
    if ut is None:
        return texts, None
    from vocablens.surgery import trim_undertrained as tu

    gone = set(ut.verified.tolist()) - set(tr.kept_old_ids)
    checked, respelled = tu.check_documents(tok, texts, gone)
    return checked, tu.summarize(ut, used, tr.kept_old_ids, rows_without, respelled)


def _trim_files(provenance, corpus: str, tr, v, checked: list[str], drop) -> dict:
    """What :meth:`VocabularySurgery.save` writes beside a trimmed model: ``vocab_map.json`` (old id -> new
    id) and ``vocablens_surgery.json`` (the record of the trim and its checks)."""
    vocab_map = {"kept_old_ids": tr.kept_old_ids, "old_to_new": {str(o): n for n, o in enumerate(tr.kept_old_ids)},
                 "rows_before": tr.result.rows_before}
    record = {"command": "trim", "source_model": provenance.to_dict(), "corpus": corpus or None,
              "trim": tr.result.to_dict(), "verification": v.to_dict(), "corpus_documents_checked": len(checked),
              "undertrained": None if drop is None else drop.to_dict()}
    return {"vocab_map.json": vocab_map, "vocablens_surgery.json": record}


__all__ = ["VocabularySurgery"]
