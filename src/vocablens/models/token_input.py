"""What a caller gives where tokens are taken: token ids (checked, never coerced) and a token named
by its text or, asked for explicitly, by its id.

* Ids (:func:`prompt_ids`): an integer tensor [T] or [1, T] is one prompt, [B, T] (B > 1) is B prompts;
  a list of ints is one prompt, a list of id lists (or of [T] tensors) is a batch. Float, bool and
  complex tensors are refused, never cast; so are ids outside [0, V) and prompts longer than the
  model's context (:func:`~vocablens.models.tokens.check_context`, the same check text passes).
* A token (:func:`parse_token`, :func:`resolve_token`): a string is always its text (``"4"`` is the
  text "4"); ``"id:4"`` or the int 4 names id 4. Every surface (handle, CLI, explorer) names a token
  through these two functions.
"""

from __future__ import annotations

import numbers

import torch

from vocablens.errors import BadInput, TokenNotInVocabulary

#: the prefix that makes a token string an id: ``"id:4"`` is token id 4, ``"4"`` the text "4"
ID_PREFIX = "id:"


def _int_tensor(x, what: str) -> torch.Tensor:
    """``x`` (a tensor, array, list of ints) as an int64 tensor, refusing anything that is not integer."""
    if not torch.is_tensor(x):
        if isinstance(x, (list, tuple)):
            for v in x:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                    raise BadInput(f"{what}: token ids must be integers; got {type(v).__name__} {v!r}")
            x = torch.tensor([int(v) for v in x], dtype=torch.int64)
        elif hasattr(x, "__array__"):
            x = torch.as_tensor(x)
        else:
            raise BadInput(f"{what}: give text, or token ids as an integer tensor or a list of ints; "
                           f"got {type(x).__name__}")
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise BadInput(f"{what}: token ids must be an integer tensor; got dtype "
                       f"{str(x.dtype).replace('torch.', '')} (never cast: cast it yourself if it holds ids)")
    return x.detach().to(torch.int64)


def _checked(t: torch.Tensor, rows: int | None, context: int | None, what: str) -> torch.Tensor:
    from vocablens.models.tokens import check_context, check_ids_fit

    if t.numel() == 0:
        raise BadInput(f"{what}: no token ids (an empty prompt)")
    if rows is not None:
        check_ids_fit(t, rows)
    check_context(int(t.shape[-1]), context)
    return t


def prompt_ids(x, rows: int | None = None, context: int | None = None, batch: bool = False,
               what: str = "ids") -> list[torch.Tensor]:
    """Token ids a caller gave -> one int64 tensor [T] per prompt, checked.

    Args:
        x: an integer tensor [T], [1, T] or [B, T]; a list of ints; a list of id lists or [T] tensors.
        rows: the matrices' rows V (every id in [0, V)).
        context: the model's context length (longer prompts are refused), or None.
        batch: whether the caller takes several prompts; when False, ids of more than one prompt are
            refused.
        what: how the caller named the argument (in the messages).

    Returns:
        ``[ids [T] int64, ...]``: one prompt, or B.

    Raises:
        BadInput: a float, bool or complex tensor (named by its dtype), non-integer list items, an
            empty prompt, more than 2 dimensions, several prompts where one is taken.
        TokenNotInVocabulary: an id outside [0, V). PromptTooLong: a prompt over the context.
    """
    items = None
    if isinstance(x, (list, tuple)) and x and all(torch.is_tensor(v) or isinstance(v, (list, tuple)) for v in x):
        items = [_int_tensor(v, what) for v in x]
        if any(v.dim() > 2 or (v.dim() == 2 and v.shape[0] != 1) for v in items):
            raise BadInput(f"{what}: each prompt of a list is ids [T] or [1, T]")
        items = [v.reshape(-1) for v in items]
    else:
        t = _int_tensor(x, what)
        if t.dim() > 2 or t.dim() == 0:
            raise BadInput(f"{what}: token ids must be [T] (one prompt) or [B, T] (B prompts); got shape "
                           f"{list(t.shape)}")
        items = [t] if t.dim() == 1 else list(t)
    if len(items) > 1 and not batch:
        raise BadInput(f"{what}: ids of {len(items)} prompts (shape {_shape(x, items)}); this call reads one "
                       "prompt: give one row, or call it once per prompt")
    return [_checked(v, rows, context, what if len(items) == 1 else f"{what}, prompt {i + 1}")
            for i, v in enumerate(items)]


def _shape(x, items) -> str:
    return str(list(x.shape)) if torch.is_tensor(x) else f"{len(items)} lists"


def parse_token(token, what: str = "token") -> str | int:
    """A token as a caller named it -> its text (a str) or its id (an int): THE rule of every surface.

    A string is its text, digits included (``"4"`` and ``" 4"`` are texts); ``"id:4"`` is id 4; an
    int (not a bool) is an id.

    Raises:
        BadInput: ``id:`` followed by something that is not a non-negative integer; a type that is
            neither str nor int.
    """
    if isinstance(token, bool) or not isinstance(token, (str, numbers.Integral)):
        raise BadInput(f"{what}: give a token's text or its id; got {type(token).__name__}")
    if isinstance(token, numbers.Integral):
        return int(token)
    if token.startswith(ID_PREFIX):
        num = token[len(ID_PREFIX):].strip()
        if not num.isdigit() or not num.isascii():
            raise BadInput(f"{what} {token!r}: {ID_PREFIX}N names a token by its id; N must be a "
                           "non-negative integer")
        return int(num)
    return token


def resolve_token(tokenizer, token, vocab_size: int, real_vocab_size: int | None = None,
                  several: str = "refuse", what: str = "token") -> tuple[list[int], str | None]:
    """A token named by text or id (:func:`parse_token`) -> ``(ids, note)``: THE resolver of every place
    that takes a token (the handle, the CLI's token options, the explorer).

    Args:
        tokenizer: the model's tokenizer.
        token: a string (its text; ``"id:N"``: id N) or an int (an id).
        vocab_size: the matrices' rows V (a text's ids must have rows).
        real_vocab_size: ids at or past it are refused (default: ``vocab_size``).
        several: a text of several tokens: ``refuse`` (TokenNotInVocabulary), ``first`` or ``mean``
            (all its ids are returned with a note naming them; the caller uses the first or the mean).
        what: how the caller named the argument (``--target``, ``target`` ...).

    Returns:
        ``([id], None)`` for one token; for several (``first`` / ``mean``) all ids and a note.

    Raises:
        BadInput: as :func:`parse_token`. TokenNotInVocabulary: an id outside 0..V-1, an empty text, a
            text of no token, or (``refuse``) of several tokens.
    """
    from vocablens.models.tokens import single_token_id, token_str

    real = vocab_size if real_vocab_size is None else real_vocab_size
    got = parse_token(token, what)
    if isinstance(got, int):
        if not 0 <= got < real:
            raise TokenNotInVocabulary(f"{what}: token id {got} is outside the vocabulary 0..{real - 1}")
        return [got], None
    ids, note = single_token_id(tokenizer, got, vocab_size, use_mean=several == "mean")
    if len(ids) > 1 and several == "refuse":
        shown = [token_str(tokenizer, i) for i in ids[:6]] + (["..."] if len(ids) > 6 else [])
        raise TokenNotInVocabulary(f"{what}: {got[:40]!r}{'...' if len(got) > 40 else ''} is {len(ids)} tokens "
                                   f"{shown}; give a single token (its text with its leading space, or "
                                   f"{ID_PREFIX}N for id N)")
    if any(not 0 <= int(i) < real for i in ids):
        raise TokenNotInVocabulary(f"{what}: {got!r} is token {ids[0]}, outside the real vocabulary 0..{real - 1}")
    return [int(i) for i in ids], note


__all__ = ["ID_PREFIX", "parse_token", "prompt_ids", "resolve_token"]
