"""Why a tokenizer cannot be built from its files: one line naming the file and what in it disagrees.

The ``tokenizers`` library refuses a BPE model whose merges name a token its vocabulary lacks, with
a message (``Error while initializing BPE: Token `Ġsmoky` out of vocabulary``) that names neither
the file nor the list at fault, under a 75-line traceback. :func:`building_tokenizer` wraps every
place vocablens builds a tokenizer (a GGUF file, a model directory, a hub snapshot) and turns any
failure into :class:`~vocablens.errors.CorruptModelFile`, its cause found by reading the files:
a merge whose pieces or product are not in the token list (BPE builds each merge's product as a
token: Sennrich et al. 2016, §3.1), special-token ids past the list's end, per-token arrays of
another length than the list. :func:`light_tokenizer` reads a model directory's tokenizer through the
class its config names, without transformers' ``Auto*`` config machinery.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable

from vocablens.errors import CorruptModelFile, VocabLensError


def merge_problem(vocab: Iterable[str], merges: list, where: str) -> str | None:
    """The first merge that needs a token ``vocab`` lacks, as words, or None.

    Args:
        vocab: the token strings (a set or a dict's keys).
        merges: ``"a b"`` strings or ``[a, b]`` pairs, in rank order.
        where: what ``vocab`` is called in the line (``its token list (tokenizer.ggml.tokens, 200 entries)``).
    """
    vocab = vocab if isinstance(vocab, (set, dict)) else set(vocab)
    for i, m in enumerate(merges):
        a, b = m.split(" ", 1) if isinstance(m, str) else (m[0], m[1])
        for need in (a, b, a + b):
            if need not in vocab:
                return (f"merge {i + 1:,} of {len(merges):,} ({a!r} + {b!r}) needs the token {need!r}, "
                        f"which {where} does not hold")
    return None


def gguf_tokenizer_problem(path: Path) -> str | None:
    """What in a GGUF file's tokenizer metadata disagrees, or None: merges against the token list,
    per-token arrays (types, scores) against its length, special-token ids past its end."""
    from vocablens.models.files.gguf_header import read_header

    h = read_header(path, strings=("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    tokens = h.strings.get("tokenizer.ggml.tokens")
    if tokens is None:
        return "it holds no token list (tokenizer.ggml.tokens)"
    n = len(tokens)
    where = f"its token list (tokenizer.ggml.tokens, {n:,} entries)"
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in h.values and h.values[key] != n:
            return f"{key} has {h.values[key]:,} entries, the token list (tokenizer.ggml.tokens) {n:,}"
    for key, v in sorted(h.values.items()):
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and isinstance(v, int) and v >= n:
            return f"{key} is {v:,}, past the end of the token list (tokenizer.ggml.tokens, {n:,} entries)"
    merges = h.strings.get("tokenizer.ggml.merges")
    return merge_problem(tokens, merges, where) if merges else None


def json_tokenizer_problem(d: Path) -> str | None:
    """What in a directory's ``tokenizer.json`` disagrees, or None: a BPE model's merges against its
    vocab, ids of added tokens shared with other tokens."""
    p = d / "tokenizer.json"
    if not p.is_file():
        return None
    try:
        tj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not JSON: the directory's own check names it
    model = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(model, dict):
        return None
    vocab = model.get("vocab")
    if model.get("type") == "BPE" and isinstance(vocab, dict) and isinstance(model.get("merges"), list):
        why = merge_problem(vocab, model["merges"], f"its model.vocab ({len(vocab):,} entries)")
        if why:
            return f"tokenizer.json: {why}"
    return None


def hub_tokenizer_problem(repo_id: str) -> str | None:
    """:func:`json_tokenizer_problem` of a hub model's ``tokenizer.json`` in the local cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo_id, "tokenizer.json")
    return json_tokenizer_problem(Path(hit).parent) if isinstance(hit, str) else None


@contextmanager
def building_tokenizer(shown: str, problem: Callable[[], str | None]):
    """Turn a failure to build a tokenizer into one line naming the file and what in it disagrees.

    Args:
        shown: how the line names the model (the spec or file the user gave).
        problem: reads the files and says what in them disagrees (e.g. :func:`gguf_tokenizer_problem`),
            or None.

    Raises:
        CorruptModelFile: ``cannot build the tokenizer of SHOWN: WHAT``. A failure ``problem`` cannot
            explain that is an ``OSError``/``ValueError``-like reader error propagates unchanged (the
            caller's :func:`vocablens.models.files.spec.reading` names a missing or damaged file); any other
            becomes the same line with the reader's first line as WHAT.
    """
    from vocablens.models.files.spec import file_errors

    try:
        yield
    except VocabLensError:
        raise
    except Exception as exc:
        try:
            why = problem()
        except Exception:  # the files are damaged beyond what the check reads: the reader's own words
            why = None
        if why:
            raise CorruptModelFile(f"cannot build the tokenizer of {shown}: {why}") from None
        if isinstance(exc, file_errors()):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise CorruptModelFile(f"cannot build the tokenizer of {shown}: {first}") from None


def light_tokenizer(d: Path, trust_remote_code: bool = False, shown: str | None = None):
    """The tokenizer of a model directory through the class its ``tokenizer_config.json`` names
    (the class ``AutoTokenizer`` would pick), without importing transformers' config machinery;
    ``AutoTokenizer`` when the class is not named, not exported or needs remote code.

    Raises:
        CorruptModelFile: the tokenizer cannot be built; the line names ``shown`` (default: ``d``) and
            what in its files disagrees (:func:`vocablens.models.files.tokenizer_files.building_tokenizer`).
    """
    with building_tokenizer(shown or str(d), lambda: json_tokenizer_problem(d)):
        return _light_tokenizer(d, trust_remote_code)


def _light_tokenizer(d: Path, trust_remote_code: bool):
    import transformers

    cfg_path = d / "tokenizer_config.json"
    try:
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    except (OSError, ValueError):
        cfg = {}
    name = cfg.get("tokenizer_class")
    if name and not trust_remote_code and "auto_map" not in cfg and (d / "tokenizer.json").is_file():
        # the fast class, as AutoTokenizer(use_fast=True) picks it (transformers 4 names the slow one)
        cls = None if name.endswith("Fast") else getattr(transformers, name + "Fast", None)
        cls = cls or getattr(transformers, name, None)
        if cls is not None:
            return cls.from_pretrained(str(d))
    return transformers.AutoTokenizer.from_pretrained(str(d), trust_remote_code=trust_remote_code)


__all__ = ["light_tokenizer", "building_tokenizer", "gguf_tokenizer_problem", "hub_tokenizer_problem", "json_tokenizer_problem",
           "merge_problem"]
