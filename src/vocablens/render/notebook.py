"""Results that display themselves in Jupyter and IPython: the CLI's rich tables, as HTML.

Analyses return frozen dataclasses and never print (DESIGN.md), so no result carries a
``_repr_html_`` that would reach up into rendering. Instead this module, in the rendering layer,
registers IPython display formatters for the result classes (``text/html``: the tables exported by
rich with inline styles; ``text/plain``: the same tables as text, for terminal IPython). The classes are
named, not imported (``for_type_by_name``), so registering costs nothing until a result is shown.

``import vocablens`` calls :func:`register` by itself when it runs inside IPython (a notebook
kernel or the IPython shell), and :func:`vocablens.load` hands this module the tokenizer it loaded,
so token ids display as tokens. Elsewhere, or for another tokenizer::

    from vocablens.render import notebook
    notebook.register(tokenizer=tok)      # the current IPython shell
    notebook.to_html(result, tok)         # the HTML itself

Without a tokenizer, tokens show as ``<id N>``.
"""

from __future__ import annotations

import io
from typing import Any, Callable

#: the tokenizer tokens are shown with (the last :func:`vocablens.load`, or :func:`register`'s)
_state: dict[str, Any] = {"tokenizer": None}

PRE = ("<pre style=\"font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace;"
        "font-size:12px;line-height:1.3;white-space:pre;overflow-x:auto\">{code}</pre>")
WIDTH = 120  # characters of the rendered tables


class _NoTokenizer:
    """Stands in for a tokenizer when none is known: every token is ``<id N>``."""

    def convert_ids_to_tokens(self, token_id):
        return None


def use_tokenizer(tokenizer) -> None:
    """Show tokens of the results that follow with ``tokenizer`` (None: as ``<id N>``)."""
    _state["tokenizer"] = tokenizer


def _tok(tokenizer):
    t = tokenizer if tokenizer is not None else _state["tokenizer"]
    return t if t is not None else _NoTokenizer()


# ------------------------------------------------------------------------- one builder per result
def _anatomy(a, tok) -> list:
    from vocablens.render.anatomy import anatomy_table

    return [anatomy_table([a]), *(f"{a.name}: {n}" for n in getattr(a, "notes", ()) or ())]


def _lens(res, tok) -> list:
    from vocablens.render.lens import lens_table

    return [*(lens_table(res, tok, j) for j in range(len(res.positions))),
            f"layer {res.n_layers} vs the model's own output: max |Δp| = {res.model_max_abs_diff:.2e}"]


def _neighbors(res, tok) -> list:
    from vocablens.render.neighbors import neighbors_header, neighbors_tables, query_label

    out: list = [neighbors_header(res)]
    for q, t in zip(res.results, neighbors_tables(res, tok)):
        out += [query_label(q, tok), *([q.note] if q.note else []), t]
    return out


def _model_argmax(ma, tok) -> list:
    from vocablens.render.argmax import argmax_tables

    return argmax_tables(ma, tok)


def _argmax_result(res, tok) -> list:
    from rich.table import Table

    t = Table()
    t.add_column("verdict")
    t.add_column("rows", justify="right")
    for k, n in res.counts().items():
        t.add_row(k, f"{n:,}")
    return [f"argmax verdicts over {res.verdict.numel():,} rows", t]


def _undertrained(res, tok) -> list:
    from vocablens.render.undertrained import undertrained_tables, undertrained_to_dict

    return undertrained_tables(undertrained_to_dict(res, tok))


def _explanation(e, tok) -> list:
    from vocablens.render.vocab_space.explain import explanation_footer, explanation_tables

    return [*explanation_tables(e, tok), explanation_footer(e)]


def _vectors(res, tok) -> list:
    from vocablens.render.vocab_space.project import vectors_table

    return [vectors_table(res, tok)]


def _search(res, tok) -> list:
    from vocablens.render.vocab_space.project import search_table

    return [search_table(res, tok)]


def _interpretable(res, tok) -> list:
    from vocablens.render.vocab_space.project import interpretable_table

    return [interpretable_table(res, tok)]


def _circuit(res, tok) -> list:
    from vocablens.render.vocab_space.project import circuit_table

    return [circuit_table(res, tok)]


def _settle(res, tok) -> list:
    from vocablens.render.vocab_space.settle import settle_tables

    return settle_tables(res)


def _score(res, tok) -> list:
    from vocablens.render.score import score_table
    from vocablens.units import plural

    return [score_table(res, tok),
            f"total log-prob {res.total_logprob:.3f} nats over {plural(res.logprobs.numel(), 'token')} "
            f"({res.n_bytes} bytes): {res.logprob_per_byte:.4f} nats/byte, {res.bits_per_byte:.4f} bits/byte, "
            f"perplexity {res.perplexity:.2f}"]


def _bottleneck(b, tok) -> list:
    from vocablens.render.bottleneck import bottleneck_tables

    return bottleneck_tables(b)


#: (module, class) -> the renderables of one result; the classes are never imported here
BUILDERS: dict[tuple[str, str], Callable[[Any, Any], list]] = {
    ("vocablens.accounting.anatomy", "Anatomy"): _anatomy,
    ("vocablens.lens.logit", "LensResult"): _lens,
    ("vocablens.geometry.embedding", "Neighbors"): _neighbors,
    ("vocablens.argmax.model", "ModelArgmax"): _model_argmax,
    ("vocablens.argmax.result", "ArgmaxResult"): _argmax_result,
    ("vocablens.argmax.bottleneck", "Bottleneck"): _bottleneck,
    ("vocablens.undertrained.analysis", "UndertrainedResult"): _undertrained,
    ("vocablens.vocab_space.explain", "Explanation"): _explanation,
    ("vocablens.vocab_space.vectors", "VectorProjection"): _vectors,
    ("vocablens.vocab_space.search", "TokenSearch"): _search,
    ("vocablens.vocab_space.interpretable", "InterpretableVectors"): _interpretable,
    ("vocablens.vocab_space.circuits", "HeadCircuit"): _circuit,
    ("vocablens.vocab_space.settle", "SettleResult"): _settle,
    ("vocablens.generate.score", "ScoreResult"): _score,
}


def _builder(result) -> Callable[[Any, Any], list]:
    for cls in type(result).__mro__:
        b = BUILDERS.get((cls.__module__, cls.__name__))
        if b is not None:
            return b
    raise TypeError(f"vocablens has no display for {type(result).__name__}")


def recording_console(width: int = WIDTH):
    """A recording console that prints nothing: strings are literal (tokens with brackets stay text)."""
    from rich.console import Console

    return Console(file=io.StringIO(), record=True, width=width, markup=False, highlight=False, emoji=False,
                   color_system="truecolor", force_terminal=False, force_jupyter=False)


def _record(result, tokenizer):
    console = recording_console()
    for part in _builder(result)(result, _tok(tokenizer)):
        console.print(part)
    return console


def to_html(result, tokenizer=None) -> str:
    """The HTML a notebook shows for one result: its tables, as ``vocablens COMMAND`` prints them, in a
    ``<pre>`` with inline styles (no stylesheet, no script).

    Args:
        result: a vocablens result (:data:`BUILDERS` lists the classes: anatomy, lenses, neighbours,
            argmax, bottleneck, under-trained tokens, explain/project/search/settle, score).
        tokenizer: shows token ids as tokens (default: the one :func:`use_tokenizer` set).

    Raises:
        TypeError: not a result vocablens can display.
    """
    return _record(result, tokenizer).export_html(inline_styles=True, code_format=PRE)


def to_text(result, tokenizer=None) -> str:
    """The same tables as plain text (what terminal IPython shows)."""
    return _record(result, tokenizer).export_text()


def register(tokenizer=None, shell=None) -> bool:
    """Make every result class of :data:`BUILDERS` display itself in IPython (``text/html`` and
    ``text/plain`` formatters of ``shell``, default: the running one).

    Args:
        tokenizer: tokens are shown with it from now on (None: keep the current one).
        shell: an IPython ``InteractiveShell``; default ``IPython.get_ipython()``.

    Returns:
        True when a shell was found and the formatters are registered, False outside IPython.
    """
    if tokenizer is not None:
        use_tokenizer(tokenizer)
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    fmt = shell.display_formatter.formatters
    for module, name in BUILDERS:
        fmt["text/html"].for_type_by_name(module, name, lambda r: to_html(r))
        fmt["text/plain"].for_type_by_name(module, name, lambda r, p, cycle: p.text(to_text(r).rstrip("\n")))
    return True


__all__ = ["BUILDERS", "PRE", "WIDTH", "recording_console", "register", "to_html", "to_text", "use_tokenizer"]
