"""Layer 1: everything that knows about model families, files and the default model."""

from vocablens.models.borders import Borders, untrained_rows
from vocablens.models.loading import (
    DEFAULT_MODEL,
    LoadedModel,
    Provenance,
    default_gguf_path,
    gguf_provenance,
    load,
    load_config,
    resolve_spec,
)

__all__ = [
    "Borders", "untrained_rows", "DEFAULT_MODEL", "LoadedModel", "Provenance", "default_gguf_path",
    "gguf_provenance", "load", "load_config", "resolve_spec",
]
