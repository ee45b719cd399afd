"""vocablens: the embedding and the unembedding (LM head) of decoder-only language models."""

__version__ = "0.1.0"


def load(spec="smollm2", dtype=None, device="cpu", trust_remote_code=False):
    """Load a model with its tokenizer, :class:`Borders` and provenance; see :func:`vocablens.models.load`."""
    from vocablens.models import load as _load

    return _load(spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code)


def __getattr__(name):
    if name in ("Borders", "Provenance"):
        from vocablens import models

        return getattr(models, name)
    raise AttributeError(name)
