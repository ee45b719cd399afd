"""Trim a vocabulary to what a corpus uses, keeping the tokenizer lossless on that corpus.

Kept: every token the corpus (or a token list) uses, every added/special token and the ids the
config names (bos/eos/pad), the base alphabet (the 256 byte symbols of byte-level BPE, the
``<0xXX>`` byte-fallback tokens, else the single characters), and the closure of all of these
under BPE merges (both parts of every merge that produces a kept token). Kept merges are those
whose two parts and result are kept, in their original order.

Why the trimmed BPE tokenizes the corpus identically: BPE applies, at each step, the lowest-rank
merge whose pair is present. Every merge the original applies on a corpus word produces a token
that is itself a used token or a part of one (it is later merged into one), so it is kept, and
with it its parts; the trimmed merge list is a subset in the same order, so the lowest-rank
applicable merge is the same one at every step. Token ids are renumbered in their old order
(old id -> new id map returned) and the two matrices are sliced with the same index (once when
tied). Only fast BPE tokenizers are rewritten; others raise :class:`UnsupportedTokenizer`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from vocablens.errors import BadInput
from vocablens.models.borders import Borders
from vocablens.models.tokens import check_ids_fit
from vocablens.surgery.bpe_plan import backend_json, plan_bpe_trim
from vocablens.surgery.expand import other_vocab_tensors, shallow_copy, replace_matrices

_CONFIG_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id",
                     "unk_token_id")


def corpus_token_ids(tokenizer, texts: Iterable[str], progress=None) -> set[int]:
    """The set of token ids the tokenizer produces on ``texts`` (no special tokens added).

    ``progress(stage, done, total)``: after each batch of 64 documents (stage ``tokenizing the
    corpus``; total: the number of texts when ``texts`` has a length, else 0)."""
    used: set[int] = set()
    total = len(texts) if hasattr(texts, "__len__") else 0
    batch: list[str] = []
    done = 0
    if progress is not None:
        progress("tokenizing the corpus", 0, total)
    for t in texts:
        batch.append(t)
        if len(batch) >= 64:
            for ids in tokenizer(batch, add_special_tokens=False).input_ids:
                used.update(ids)
            done += len(batch)
            batch = []
            if progress is not None:
                progress("tokenizing the corpus", done, total)
    if batch:
        for ids in tokenizer(batch, add_special_tokens=False).input_ids:
            used.update(ids)
        if progress is not None:
            progress("tokenizing the corpus", done + len(batch), total)
    return used


@dataclass(frozen=True)
class TrimResult:
    """What :func:`trim_vocab` did.

    Attributes:
        rows_before / rows_after: matrix rows V before and after.
        tokenizer_size_before / tokenizer_size_after: ``len(tokenizer)``.
        used_tokens: distinct ids the corpus (or token list) used.
        kept_for_lossless: ids kept beyond those (specials, alphabet, merge parts).
        merges_before / merges_after: BPE merges.
        tied: whether W_U is W_E (sliced once).
        params_before / params_after: all parameters of the model (tied matrix counted once).
        params_saved: parameters removed; bytes_saved: their memory in the weights' dtype (bytes).
        bytes_per_param: element size of the matrices.
    """

    rows_before: int
    rows_after: int
    tokenizer_size_before: int
    tokenizer_size_after: int
    used_tokens: int
    kept_for_lossless: int
    merges_before: int
    merges_after: int
    tied: bool
    params_before: int
    params_after: int
    params_saved: int
    bytes_saved: int
    bytes_per_param: int

    @property
    def rows_saved(self) -> int:
        return self.rows_before - self.rows_after

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["rows_saved"] = self.rows_saved
        d["params_saved_fraction"] = self.params_saved / self.params_before if self.params_before else 0.0
        return d


@dataclass
class Trimmed:
    """:func:`trim_vocab`'s output: new model and tokenizer, kept old ids (new id i = kept[i]), result."""

    model: Any
    tokenizer: Any
    kept_old_ids: list[int]
    result: TrimResult

    @property
    def old_to_new(self) -> dict[int, int]:
        return {o: n for n, o in enumerate(self.kept_old_ids)}


def _count_params(model: nn.Module) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def _remap_config_ids(cfg, o2n: dict[int, int]) -> None:
    if cfg is None:
        return
    for f in _CONFIG_ID_FIELDS:
        v = getattr(cfg, f, None)
        if isinstance(v, int):
            setattr(cfg, f, o2n.get(v))
        elif isinstance(v, (list, tuple)):
            setattr(cfg, f, [o2n[i] for i in v if i in o2n])


def config_ids(cfg) -> set[int]:
    out: set[int] = set()
    for f in _CONFIG_ID_FIELDS:
        v = getattr(cfg, f, None) if cfg is not None else None
        if isinstance(v, int) and v >= 0:
            out.add(v)
        elif isinstance(v, (list, tuple)):
            out.update(int(i) for i in v)
    return out


def trim_vocab(model: nn.Module, tokenizer, used_ids: Iterable[int]) -> Trimmed:
    """Keep ``used_ids`` plus what the tokenizer needs; slice the embedding and head accordingly.

    Args:
        model: a transformers causal LM (not modified; the result shares its blocks).
        tokenizer: its fast BPE tokenizer (not modified).
        used_ids: token ids to keep (e.g. :func:`corpus_token_ids` of a corpus).

    Returns:
        :class:`Trimmed`; the new embedding [V', d] and head [V', d] (+ bias [V']) are
        ``W[kept_old_ids]`` in the same dtype; V' = number of kept tokens (padding rows dropped).

    Raises:
        UnsupportedTokenizer: not a fast BPE tokenizer (nothing is changed).
        UnsupportedArchitecture: another parameter is indexed by the vocabulary.
        BadInput: no used ids, or an id without a matrix row.
        UnsupportedQuantization: a model quantized by a transformers quantizer (its matrices are
            read dequantized; an edit would not reach it).
    """
    from tokenizers import Tokenizer

    from vocablens.models.files.quantized import refuse_edit

    refuse_edit(model, "trim")

    used = {int(i) for i in used_ids}
    if not used:
        raise BadInput("the corpus uses no token: nothing to keep")
    borders = Borders.from_model(model, tokenizer)
    tj = backend_json(tokenizer)
    keep = used | {i for i in config_ids(model.config) if i < len(tokenizer)}
    gen = getattr(model, "generation_config", None)
    keep |= {i for i in config_ids(gen) if i < len(tokenizer)}
    kept, new_json = plan_bpe_trim(tj, keep)
    rows = borders.vocab_size
    check_ids_fit(kept, rows, tokenizer)
    E = borders.input_embedding.weight  # W_E [V, d], the stored rows
    others = other_vocab_tensors(model, rows, [E, borders.unembedding.weight, borders.unembedding.bias])
    if others:
        from vocablens.errors import UnsupportedArchitecture

        raise UnsupportedArchitecture(borders.family, others, "these parameters are indexed by the vocabulary too")
    o2n = {o: n for n, o in enumerate(kept)}

    new_tok = copy.deepcopy(tokenizer)
    new_tok._tokenizer = Tokenizer.from_str(json.dumps(new_json))
    idx = torch.tensor(kept, dtype=torch.long, device=E.device)
    with torch.no_grad():
        W_E = E.detach().index_select(0, idx).clone()
        W_U = None if borders.tied else borders.unembedding.weight.detach().index_select(0, idx).clone()
        b_U = None if borders.unembedding.bias is None else borders.unembedding.bias.detach().index_select(0, idx).clone()
    new_model = shallow_copy(model)
    replace_matrices(new_model, W_E, W_U, b_U, borders.tied)
    _remap_config_ids(new_model.config, o2n)
    if getattr(new_model, "generation_config", None) is not None:
        new_model.generation_config = copy.deepcopy(new_model.generation_config)
        _remap_config_ids(new_model.generation_config, o2n)

    p_before, p_after = _count_params(model), _count_params(new_model)
    elt = E.element_size()
    res = TrimResult(
        rows_before=rows, rows_after=len(kept), tokenizer_size_before=len(tokenizer),
        tokenizer_size_after=len(new_tok), used_tokens=len(used), kept_for_lossless=len(kept) - len(used & set(kept)),
        merges_before=len(tj["model"].get("merges", [])), merges_after=len(new_json["model"]["merges"]),
        tied=borders.tied, params_before=p_before, params_after=p_after, params_saved=p_before - p_after,
        bytes_saved=(p_before - p_after) * elt, bytes_per_param=elt,
    )
    return Trimmed(new_model, new_tok, kept, res)


def tokenization_mismatches(old_tokenizer, new_tokenizer, kept_old_ids: Sequence[int],
                            texts: Iterable[str], progress=None) -> int:
    """How many texts the trimmed tokenizer encodes differently from ``old_to_new[old ids]`` (0 = lossless).

    Returns the count of differing texts; an old id that was not kept counts as a difference.
    ``progress(stage, done, total)``: after each batch of 64 texts (stage ``comparing tokenizations``).
    """
    o2n = {int(o): n for n, o in enumerate(kept_old_ids)}
    bad = 0
    texts = list(texts)
    for i in range(0, len(texts), 64):
        batch = texts[i:i + 64]
        olds = old_tokenizer(batch, add_special_tokens=False).input_ids
        news = new_tokenizer(batch, add_special_tokens=False).input_ids
        for a, b in zip(olds, news):
            bad += [o2n.get(j, -1) for j in a] != list(b)
        if progress is not None:
            progress("comparing tokenizations", i + len(batch), len(texts))
    return bad


def read_token_list(lines: Sequence[str], tokenizer) -> set[int]:
    """Ids from a token list: one token per line, a vocabulary string (the tokenizer's own piece, e.g.
    ``Ġthe``; ``4`` is the piece "4") or an id written ``id:N``
    (:func:`~vocablens.models.token_input.parse_token`: the rule of every place that names a token).

    Raises:
        BadInput: a line that is neither a token of the vocabulary nor ``id:N`` (a bare number that
            is no piece is refused with that hint).
    """
    from vocablens.models.token_input import parse_token

    vocab = tokenizer.get_vocab()
    out: set[int] = set()
    for n, line in enumerate(lines, 1):
        s = line.rstrip("\n")
        if not s.strip():
            continue
        got = parse_token(s.strip() if s.strip().startswith("id:") else s, f"token list line {n}")
        if isinstance(got, int):
            out.add(got)
        elif s in vocab:
            out.add(int(vocab[s]))
        else:
            hint = f" (an id is written id:{s.strip()})" if s.strip().lstrip("-").isdigit() else ""
            raise BadInput(f"token list line {n}: {s!r} is not a token of the vocabulary{hint}")
    return out
