"""Layer 0: the package version (one place; ``vocablens.__version__`` re-exports it)."""

__version__ = "0.1.0"
