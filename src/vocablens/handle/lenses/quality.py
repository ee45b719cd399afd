"""A lens's quality measured and kept with it (:mod:`vocablens.lens.quality`): when a lens is fitted or
trained (:meth:`LensQuality.measure_lens_quality`), and on first use of a lens that carries none (a
published file, a merged lens; :meth:`LensQuality.ensure_lens_quality`, cached on disk)."""

from __future__ import annotations

import os

from vocablens.handle.protocols import NeedsLensQuality

#: the held-out text a lens without stored figures is measured on at first use: general English when
#: Debian's ``fortunes`` is installed, else CPython's pydoc topics (always there)
FIRST_USE_CORPORA = ("fortunes", "pydoc-topics")
#: tokens measured at first use (rows of 128)
FIRST_USE_TOKENS = 1024


class LensQuality:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLensQuality`)."""

    def measure_lens_quality(self: NeedsLensQuality, lens, kind: str, corpus: str | None = None,
                             val_fraction: float = 0.1, tokens: int = 2048, seq_len: int = 256, docs=None,
                             cache: bool = False) -> dict:
        """Measure ``lens``'s per-layer KL to the final distribution and top-1 agreement beside the logit
        lens's on the validation split of ``corpus`` (the documents held out from its fit), store them in
        ``lens.settings["quality"]`` (saved with the lens) and return them.

        Args:
            kind: ``tuned`` or ``jacobian``. tokens: held-out tokens scored, in rows of ``seq_len``.
            cache: read / write the on-disk cache (:func:`vocablens.lens.quality.cache_path`).

        Raises:
            BadInput: a missing corpus or one without validation documents. CheckpointMismatch: a lens
                of another model.
        """
        from vocablens.lens.quality import cache_path, measure_quality, read_cached, write_cached

        rows, info = self.eval_rows(corpus or FIRST_USE_CORPORA[-1], "validation", min(seq_len, tokens), tokens,
                                    val_fraction, 0, docs)
        path = cache_path(lens, self.borders, info) if cache else None  # None: VOCABLENS_CACHE=off
        rec = read_cached(path) if path is not None else None
        if rec is None:
            rec = measure_quality(self.borders, lens, kind, rows, info)
            if path is not None:
                write_cached(path, rec)
        lens.settings["quality"] = rec
        return rec

    def quality_after_fit(self: NeedsLensQuality, lens, kind: str, corpus: str, val_fraction: float, tokens: int,
                          docs=None) -> None:
        """:meth:`measure_lens_quality` on the held-out part of the corpus a lens was just fitted or trained
        on; a corpus with no held-out text leaves a note in ``settings["quality_note"]`` instead (the
        figures are then measured on first use)."""
        from vocablens.errors import BadInput

        if tokens < 2:
            return
        try:
            self.measure_lens_quality(lens, kind, corpus, val_fraction, tokens, docs=docs)
        except BadInput as exc:
            lens.settings["quality_note"] = f"not measured at fit time: {exc}"

    def ensure_lens_quality(self: NeedsLensQuality, lens, kind: str) -> None:
        """Give a tuned or Jacobian lens that carries no quality figures its figures on first use: measured
        on :data:`FIRST_USE_TOKENS` held-out tokens of the first of :data:`FIRST_USE_CORPORA` that is here,
        cached on disk (keyed by the lens, the model's head and the text), so later reads cost nothing.
        ``VOCABLENS_LENS_QUALITY=0`` turns this off; on a model loaded tensor-parallel it is skipped (the
        measurement reads the whole head in one process)."""
        from vocablens.models.tensor_parallel import is_tensor_parallel

        settings = getattr(lens, "settings", None)
        if kind not in ("tuned", "jacobian") or not isinstance(settings, dict) or settings.get("quality"):
            return
        if is_tensor_parallel(self.borders):
            return
        if os.environ.get("VOCABLENS_LENS_QUALITY", "1") == "0":
            return
        from vocablens.corpus import NAMED_CORPORA
        from pathlib import Path

        corpus = next(c for c in FIRST_USE_CORPORA if "path" not in NAMED_CORPORA[c] or Path(NAMED_CORPORA[c]["path"]).is_dir())
        self.measure_lens_quality(lens, kind, corpus, 0.1, FIRST_USE_TOKENS, 128, cache=True)


__all__ = ["FIRST_USE_CORPORA", "FIRST_USE_TOKENS", "LensQuality"]
