"""vocablens: the embedding and the unembedding (LM head) of decoder-only language models.

The main entry points, importable from the package root (each is loaded on first use, so
``import vocablens`` stays fast)::

    import vocablens
    m = vocablens.load("smollm2")                       # a vocablens.Model
    m.lens(["The capital of France is", "2 + 2 ="], kind="both").figure()
    m.score("The cat sat on the mat.").to_json()        # = `vocablens score ... --json`
    model, tok, borders, prov = m                       # the four parts, for the functions below

Library code inside the package imports from the topic modules (``vocablens.lens``,
``vocablens.ops`` ...), never from this root (layer rule: only the CLI and users stand above it).

In Jupyter or IPython every result displays itself (its tables, as the CLI prints them):
``import vocablens`` registers the display formatters of :mod:`vocablens.render.notebook` when it
runs inside IPython, and :func:`load` hands that module the tokenizer it loaded.
"""

from __future__ import annotations

import importlib
import sys

from vocablens.version import __version__

#: public name -> the module that defines it
_ENTRY_POINTS: dict[str, str] = {
    # models: loading and the two borders
    "load": "vocablens.handle",
    "Model": "vocablens.handle",
    "LoadedModel": "vocablens.models.files.loader",
    "Borders": "vocablens.models.borders",
    "Provenance": "vocablens.models.files.provenance",
    "Embedding": "vocablens.models.embed",
    "Unembedding": "vocablens.models.unembed",
    # accounting and geometry
    "anatomy": "vocablens.accounting.anatomy",
    "anatomy_of": "vocablens.accounting.anatomy",
    "tie_check": "vocablens.geometry.tying",
    "nearest_neighbors": "vocablens.geometry.embedding",
    "word_pca": "vocablens.geometry.embedding",
    # reading the residual stream
    "logit_lens": "vocablens.lens.logit",
    "TunedLens": "vocablens.lens.tuned",
    "explain": "vocablens.vocab_space",
    "project_vectors": "vocablens.vocab_space",
    "search_token": "vocablens.vocab_space",
    "settle": "vocablens.vocab_space",
    # argmax geometry
    "find_unargmaxable": "vocablens.argmax",
    "argmax_for_borders": "vocablens.argmax",
    "softmax_bottleneck": "vocablens.argmax",
    # under-trained tokens (Land & Bartolo 2024)
    "undertrained": "vocablens.undertrained",
    # computing through the head
    "token_logprobs": "vocablens.ops",
    "linear_cross_entropy": "vocablens.ops",
    "score_ids": "vocablens.generate.score",
    # surgery
    "expand_vocab": "vocablens.surgery",
    "trim_vocab": "vocablens.surgery",
    "verify_expansion": "vocablens.surgery",
    "verify_trim": "vocablens.surgery",
    # the report's plan and runner (the page itself: vocablens.render.report)
    "run_report": "vocablens.report.runner",
}

__all__ = ["__version__", *_ENTRY_POINTS]


def __getattr__(name: str):
    """Import an entry point on first use (PEP 562) and keep it as a module attribute."""
    module = _ENTRY_POINTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vocablens' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name == "load":
        value = _telling_the_notebook(value)
    globals()[name] = value
    return value


def _telling_the_notebook(load):
    """``load`` that, once :mod:`vocablens.render.notebook` is in use (inside IPython), shows the
    tokens of the results that follow with the tokenizer it loaded."""
    import functools

    @functools.wraps(load)
    def loaded(*args, **kwargs):
        lm = load(*args, **kwargs)
        notebook = sys.modules.get("vocablens.render.notebook")
        if notebook is not None:
            notebook.use_tokenizer(lm.tokenizer)
        return lm

    return loaded


def _in_ipython() -> None:
    """Register the notebook display of results when IPython is running (never imports IPython)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    if shell is not None:
        from vocablens.render import notebook

        notebook.register(shell=shell)


_in_ipython()


def __dir__() -> list[str]:
    """The public names and the submodules imported so far (not this module's own imports)."""
    return sorted((set(globals()) - {"annotations", "importlib", "sys"}) | set(__all__))
