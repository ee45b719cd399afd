"""Each option's rule, written once: the CLI calls it before the model loads, the handle on entry.

A message names the argument as a Python caller wrote it, in backticks (`` `k` must be at least 1``);
the CLI prints the option of the command being run in its place (``-k must be at least 1``), through
:func:`vocablens.cli.common.in_cli_words`. Every function raises :class:`vocablens.errors.BadInput`
(or :class:`vocablens.errors.OutputExists`) and returns nothing; nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path

from vocablens.errors import BadInput, OutputExists, TokenNotInVocabulary


def at_least(name: str, value: int, low: int = 1, whole: bool = False) -> None:
    """``value`` >= ``low`` ("`k` must be at least 1; got 0"); ``whole``: an int too (not a bool)."""
    if (whole and (isinstance(value, bool) or not isinstance(value, int))) or value < low:
        raise BadInput(f"`{name}` must be at least {low}; got {value}")


def at_least_ge(name: str, value: int, low: int = 1) -> None:
    """``value`` >= ``low``, worded "`batch_size` must be >= 1; got 0"."""
    if value < low:
        raise BadInput(f"`{name}` must be >= {low}; got {value}")


def one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    """``value`` is one of ``choices`` ("`bias` must be auto, on or off; got 'x'")."""
    if value not in choices:
        listed = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise BadInput(f"`{name}` must be {listed}; got {value!r}")


def needs(name: str, value, other: str, other_value) -> None:
    """``value`` given only with ``other_value`` ("`head` needs `block`")."""
    if value is not None and other_value is None:
        raise BadInput(f"`{name}` needs `{other}`")


def free_output(path, force: bool) -> None:
    """An output file not there yet, unless ``force`` (``None``: no output asked for).

    Raises:
        OutputExists: ``path`` exists and not ``force``.
    """
    if path and Path(path).exists() and not force:
        raise OutputExists(f"{path} exists; pass `force` to replace it")


def token_window(max_tokens: int, seq_len: int) -> None:
    """Scoring a corpus reads ``max_tokens`` >= 2 tokens in prompts of ``seq_len`` >= 2."""
    if max_tokens < 2 or seq_len < 2:
        raise BadInput("`max_tokens` and `seq_len` must be at least 2")


def plot_path(plot, force: bool) -> None:
    """A figure path (``None``: none): .html or .png, not an existing file unless ``force``."""
    if plot is None:
        return
    free_output(plot, force)
    if Path(plot).suffix.lower() not in (".html", ".png"):
        raise BadInput(f"`plot` must end in .html or .png; got {plot}")


def scoring_options(max_tokens: int, seq_len: int, plot, force: bool) -> None:
    """:func:`token_window`, then :func:`plot_path`."""
    token_window(max_tokens, seq_len)
    plot_path(plot, force)


SPLITS = ("validation", "train", "all")


def undertrained_options(candidates: int | None, batch_size: int) -> None:
    """``candidates`` >= 0 (0: the paper's lowest 2%) and ``batch_size`` >= 1."""
    if candidates is not None and candidates < 0:
        raise BadInput(f"`candidates` must be >= 0 (0: the paper's lowest 2%); got {candidates}")
    at_least_ge("batch_size", batch_size)


def steer_options(promote, suppress, prompt, corpus, new_tokens: int) -> None:
    """Steering takes a target (``promote`` and/or ``suppress``), one text source and 0..512 new tokens."""
    if not promote and not suppress:
        raise BadInput("give `promote` TOKEN and/or `suppress` TOKEN")
    if prompt and corpus:
        raise BadInput("give `prompt` or `corpus`, not both")
    if isinstance(new_tokens, bool) or not 0 <= new_tokens <= 512:
        raise BadInput(f"`new_tokens` must be in 0..512; got {new_tokens}")


def settle_options(seq_len: int, batch: int, max_tokens: int) -> None:
    """Settling reads ``max_tokens`` >= ``seq_len`` >= 2 tokens in batches of ``batch`` >= 1."""
    if seq_len < 2 or batch < 1 or max_tokens < seq_len:
        raise BadInput(f"need `seq_len` >= 2, `batch` >= 1 and `max_tokens` >= `seq_len`; got "
                       f"{seq_len}, {batch}, {max_tokens}")


def eval_text_options(eval_texts: int, eval_chars: int) -> None:
    """Held-out text for surgery: ``eval_texts`` >= 1 chunks of ``eval_chars`` >= 10 characters."""
    if eval_texts < 1 or eval_chars < 10:
        raise BadInput("`eval_texts` must be >= 1 and `eval_chars` >= 10")


def align_options(what: str, top: int) -> None:
    """Alignment reads ``what`` (ffn or heads) and lists ``top`` >= 0 units."""
    one_of("what", what, ("ffn", "heads"))
    if isinstance(top, bool) or top < 0:
        raise BadInput(f"`top` must be 0 or more; got {top}")


def prompt_text(text) -> None:
    """A prompt given as a string holds some text (token ids and tensors pass)."""
    if isinstance(text, str) and not text.strip():
        raise BadInput("empty prompt: give some text")


def score_text(text) -> None:
    """A text to score holds some text (token ids and tensors pass)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise BadInput("empty text: nothing to score")


def token_strings(tokens) -> None:
    """No token is given as the empty string.

    Raises:
        TokenNotInVocabulary: an empty token string.
    """
    if any(t == "" for t in tokens):
        raise TokenNotInVocabulary("empty token string")


def block_in_range(block: int | None, n_layers: int) -> None:
    """``block`` (``None``: none chosen) names one of the model's ``n_layers`` blocks."""
    if block is not None and not 0 <= block < n_layers:
        raise BadInput(f"block {block} is out of range: this model has blocks 0..{n_layers - 1}")
