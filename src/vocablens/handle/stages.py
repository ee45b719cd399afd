"""A workflow's stages shown while they run: the one helper every workflow names its stages through."""

from __future__ import annotations

from contextlib import nullcontext


def stage(status, message: str):
    """The context a workflow runs one stage in: ``status(message)`` (a context manager factory, e.g. the
    CLI's spinner), or one that does nothing when ``status`` is None."""
    return nullcontext() if status is None else status(message)


__all__ = ["stage"]
