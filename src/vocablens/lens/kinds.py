"""The name of a lens: a result's ``kind`` always names what was computed.

No translator is the logit lens (nostalgebraist 2020); a translator names itself by a ``kind``
attribute when it has one, else it is a tuned lens (Belrose et al. 2023, §3).
"""

from __future__ import annotations

from vocablens.errors import BadInput


def lens_kind(translator, kind: str | None = None) -> str:
    """The ``kind`` of a lens read through ``translator`` (None: the logit lens), checked against ``kind``.

    Args:
        translator: None, or an object with ``translate(layer, h [P, d]) -> [P, d]`` and optionally a
            ``kind`` string (a translator without one is a tuned lens).
        kind: the label a caller asks for; None takes the lens's own name.

    Returns:
        ``"logit"`` without a translator, else the translator's ``kind`` (default ``"tuned"``).

    Raises:
        BadInput: ``kind`` names another lens than the one computed (e.g. ``kind="tuned"`` without a
            translator).
    """
    own = "logit" if translator is None else str(getattr(translator, "kind", None) or "tuned")
    if kind is None or kind == own:
        return own
    if translator is None:
        raise BadInput(f"kind={kind!r} needs a translator (a {kind} lens, e.g. vocablens.lens.tuned.find_lens); "
                       "without one the lens computed is the logit lens (kind='logit')")
    raise BadInput(f"kind={kind!r} does not name the lens computed: the translator given is a {own} lens "
                   f"(leave kind out, or give kind={own!r})")
