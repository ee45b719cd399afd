"""The translators a lens kind reads through, on :class:`vocablens.Model`: ``tuned_lens``, ``load_lens``,
``load_jacobian_lens``, ``add_lens`` and ``translator``.

A lens ``kind`` names a translator: ``logit`` is the identity (the logit lens), ``tuned`` the tuned
lens loaded with :meth:`LensLoading.load_lens` or shipped for the model (read on first use), and
any other name one added with :meth:`LensLoading.add_lens` (e.g. a Jacobian lens). A kind with no
translator is refused in one line; it is never read as a relabelled logit lens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vocablens.errors import BadInput
from vocablens.handle.protocols import NeedsLensLoading
from vocablens.models.files.spec import DEFAULT_MODEL


class LensLoading:
    """Mixed into :class:`~vocablens.handle.Model` (what it needs: :class:`~vocablens.handle.protocols.NeedsLensLoading`)."""

    @property
    def tuned_lens(self: NeedsLensLoading):
        """The tuned lens of this model: the one loaded with :meth:`load_lens`, else the one shipped for
        its spec (read once).

        Raises:
            BadInput: none loaded and none shipped for this model (train one: :meth:`train_lens`).
            CheckpointMismatch: the shipped lens belongs to another model.
        """
        lens = self.translators.get("tuned")
        if lens is None:
            from vocablens.lens.tuned import load_for_model

            lens = self.translators["tuned"] = load_for_model(self.borders, self.spec or DEFAULT_MODEL, None)
        return lens

    def load_lens(self: NeedsLensLoading, path: str | Path):
        """Read a tuned lens directory (ours, or the tuned-lens library's), check it against this model
        and use it as this model's ``tuned`` lens from now on; returns it.

        Raises:
            BadInput: no lens there. CheckpointMismatch: it belongs to another model.
        """
        from vocablens.lens.tuned import TunedLens, find_lens

        lens = TunedLens.load(find_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        self.translators["tuned"] = lens
        return lens

    def add_lens(self: NeedsLensLoading, kind: str, translator) -> None:
        """Read the stream through ``translator`` (``translate(layer, h) -> h'``) as lens ``kind``."""
        if kind in ("logit", "both") or not kind:
            raise BadInput(f"{kind!r} names a built-in lens; choose another kind")
        own = getattr(translator, "kind", None)
        if own is not None and own != kind:
            raise BadInput(f"this translator names itself a {own} lens; add it as kind={own!r}")
        self.translators[kind] = translator if own == kind else _Named(translator, kind)

    def translator(self: NeedsLensLoading, kind: str, path=None):
        """The translator of lens ``kind`` (None for ``logit``), carrying its quality figures (measured on
        first use when it has none: :meth:`~vocablens.handle.lenses.quality.LensQuality.ensure_lens_quality`).

        Args:
            path: as :meth:`_translator`.

        Raises:
            BadInput, CheckpointMismatch: as :meth:`_translator`.
        """
        lens = self._translator(kind, path)
        if lens is not None:
            self.ensure_lens_quality(lens, getattr(lens, "kind", kind))
        return lens

    def _translator(self: NeedsLensLoading, kind: str, path=None):
        """The translator of lens ``kind`` (None for ``logit``).

        Args:
            path: for ``tuned`` or ``jacobian``, a lens folder or file read for this call only (not
                kept), or a lens already loaded (handed back as it is); None: the one this model holds,
                else the one shipped for it (then kept).

        Raises:
            BadInput: an unknown kind, or ``tuned`` / ``jacobian`` with none there, loaded or shipped.
            CheckpointMismatch: the lens belongs to another model.
        """
        if kind == "logit":
            return None
        if path is not None and not isinstance(path, (str, Path)):
            return path
        if path is not None and kind == "tuned":
            from vocablens.lens.tuned import TunedLens, find_lens

            return TunedLens.load(find_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        if path is not None and kind == "jacobian":
            from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens

            return JacobianLens.load(find_jacobian_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        if kind == "tuned":
            return self.tuned_lens
        if kind in self.translators:
            return self.translators[kind]
        if kind == "jacobian":  # the Jacobian lens shipped for the model, read on first use
            return self.load_jacobian_lens(None)
        known = ", ".join(["logit", "tuned", "jacobian", "both",
                           *sorted(k for k in self.translators if k not in ("tuned", "jacobian"))])
        raise BadInput(f"`kind` must be one of {known}; got {kind!r}")

    def _lens_for_call(self: NeedsLensLoading, kind: str, lens_dir=None):
        """The translator of ``kind``; ``tuned`` read from ``lens_dir`` when given (this call only)."""
        return self.translator(kind, lens_dir if kind == "tuned" else None)

    def load_jacobian_lens(self: NeedsLensLoading, path: str | Path | None = None):
        """Read a Jacobian lens (our folder, a published ``lens.pt``, a hub id from the local cache; None:
        the one shipped for this model), check it against this model and use it as lens ``jacobian``.

        Raises:
            BadInput: no lens there. CheckpointMismatch: d_model, layer count or unembedding do not fit.
        """
        from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens

        lens = JacobianLens.load(find_jacobian_lens(self.spec or DEFAULT_MODEL, path), self.borders)
        self.translators["jacobian"] = lens
        return lens


class _Named:
    """A translator read as lens ``kind`` (the name a result's ``kind`` carries: :mod:`vocablens.lens.kinds`)."""

    def __init__(self, translator, kind: str) -> None:
        self.translator, self.kind = translator, kind

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.translator.translate(layer, h)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "translator":
            raise AttributeError(name)
        return getattr(self.translator, name)


__all__ = ["LensLoading"]
