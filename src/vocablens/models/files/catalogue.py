"""The built-in catalogue: published configs of well-known models (no weights, no network).

Each ``vocablens/data/configs/*.json`` holds a hub id, short aliases, the tokenizer's size and the
architecture values of the model's ``config.json``; ``vocablens anatomy qwen3-8b`` reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class CatalogueEntry:
    """One model of the built-in catalogue.

    Attributes:
        hub_id: the Hugging Face id (``Qwen/Qwen3-0.6B``).
        aliases: short names (``qwen3-0.6b``).
        tokenizer_vocab_size: ``len(tokenizer)`` of the published tokenizer, or None when not recorded.
        config: the published config.json's architecture values.
    """

    hub_id: str
    aliases: tuple[str, ...]
    tokenizer_vocab_size: int | None
    config: dict


@lru_cache(maxsize=1)
def catalogue() -> dict[str, CatalogueEntry]:
    """The built-in catalogue, keyed by hub id."""
    out: dict[str, CatalogueEntry] = {}
    root = resources.files("vocablens") / "data" / "configs"
    for f in sorted(root.iterdir(), key=lambda p: p.name):
        if not f.name.endswith(".json"):
            continue
        d = json.loads(f.read_text())
        out[d["hub_id"]] = CatalogueEntry(d["hub_id"], tuple(d.get("aliases", ())),
                                          d.get("tokenizer_vocab_size"), d["config"])
    return out


def catalogue_entry(spec: str) -> CatalogueEntry | None:
    """The catalogue entry whose hub id or alias is ``spec`` (case-insensitive), or None."""
    s = str(spec).strip().lower()
    for e in catalogue().values():
        if s == e.hub_id.lower() or s in (a.lower() for a in e.aliases):
            return e
    return None


def catalogue_names() -> str:
    """The catalogue's first aliases, comma-separated (for error messages)."""
    return ", ".join(sorted(a for e in catalogue().values() for a in e.aliases[:1]))


__all__ = ["CatalogueEntry", "catalogue", "catalogue_entry", "catalogue_names"]
