"""The tokenizer side of a vocabulary trim: which tokens a BPE ``tokenizer.json`` must keep (the
closure under its merges) and the rewritten ``tokenizer.json``, as plain dicts.

Why the kept set tokenizes a corpus identically: :mod:`vocablens.surgery.trim`'s docstring. Used by
:func:`vocablens.surgery.trim.trim_vocab` and :mod:`vocablens.surgery.trim_undertrained`.
"""

from __future__ import annotations

import copy
import json
from typing import Iterable

from vocablens.errors import BadInput, UnsupportedTokenizer


def backend_json(tokenizer) -> dict:
    be = getattr(tokenizer, "backend_tokenizer", None)
    if be is None:
        raise UnsupportedTokenizer(
            f"{type(tokenizer).__name__} is not a fast (tokenizers) tokenizer; vocablens can only rewrite "
            "fast BPE tokenizers consistently; nothing written")
    return json.loads(be.to_str())


def _byte_level(j: dict) -> bool:
    def has(node) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(j.get("pre_tokenizer"))


def byte_level_alphabet() -> list[str]:
    """The 256 symbols byte-level BPE uses for the bytes 0..255 (GPT-2's ``bytes_to_unicode``)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def _merge_pair(m) -> tuple[str, str]:
    if isinstance(m, str):
        a, _, b = m.partition(" ")
        return a, b
    return m[0], m[1]


def _merge_result(a: str, b: str, prefix: str) -> str:
    return a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)


def plan_bpe_trim(tok_json: dict, keep_ids: Iterable[int]) -> tuple[list[int], dict]:
    """Which old ids to keep, and the rewritten ``tokenizer.json`` (pure: dicts in, dicts out).

    Args:
        tok_json: a tokenizers ``Tokenizer`` serialized as a dict (model type BPE).
        keep_ids: ids that must be kept (used by the corpus, specials, config ids).

    Returns:
        ``(kept_old_ids, new_json)``: sorted old ids (new id i = ``kept_old_ids[i]``) and the
        rewritten tokenizer dict (vocab, merges, added tokens, post-processor and padding ids).

    Raises:
        UnsupportedTokenizer: the model is not BPE, or uses dropout.
        BadInput: a requested id is in neither the vocabulary nor the added tokens.
    """
    model = tok_json.get("model", {})
    if model.get("type") != "BPE":
        raise UnsupportedTokenizer(
            f"tokenizer model {model.get('type')!r} is not BPE; vocablens can only trim BPE vocabularies "
            "consistently (vocab + merges); nothing written")
    if model.get("dropout"):
        raise UnsupportedTokenizer("BPE with dropout tokenizes at random; cannot trim it losslessly; nothing written")
    kept_toks = _kept_tokens(tok_json, keep_ids)
    vocab: dict[str, int] = model["vocab"]
    added = {int(a["id"]) for a in tok_json.get("added_tokens", [])}
    kept = sorted({vocab[t] for t in kept_toks} | added)
    return kept, _rewritten(tok_json, kept, kept_toks)


def _kept_tokens(tok_json: dict, keep_ids: Iterable[int]) -> set[str]:
    """The vocabulary's tokens to keep: those of ``keep_ids`` and of the added tokens, the base
    alphabet, the unknown token, and the closure of these under the merges (both parts of every
    merge producing a kept token). Raises BadInput: an id in neither the vocabulary nor the added
    tokens."""
    model = tok_json["model"]
    vocab: dict[str, int] = model["vocab"]
    id_to_tok = {v: k for k, v in vocab.items()}
    added = {int(a["id"]): a["content"] for a in tok_json.get("added_tokens", [])}
    keep: set[int] = set()
    for i in keep_ids:
        i = int(i)
        if i not in id_to_tok and i not in added:
            raise BadInput(f"token id {i} is not in the tokenizer")
        keep.add(i)
    keep |= set(added)
    # base alphabet
    if _byte_level(tok_json):
        base = set(byte_level_alphabet())
    elif model.get("byte_fallback"):
        base = {f"<0x{b:02X}>" for b in range(256)}
    else:
        base = {t for t in vocab if len(t) == 1}
    keep |= {vocab[t] for t in base if t in vocab}
    unk = model.get("unk_token")
    if unk is not None and unk in vocab:
        keep.add(vocab[unk])
    # closure under merges: both parts of every merge producing a kept token
    prefix = model.get("continuing_subword_prefix") or ""
    producers: dict[str, list[tuple[str, str]]] = {}
    merges = model.get("merges", [])
    for m in merges:
        a, b = _merge_pair(m)
        producers.setdefault(_merge_result(a, b, prefix), []).append((a, b))
    stack = [id_to_tok[i] for i in keep if i in id_to_tok]
    kept_toks = set(stack)
    while stack:
        t = stack.pop()
        for a, b in producers.get(t, ()):
            for part in (a, b):
                if part not in kept_toks and part in vocab:
                    kept_toks.add(part)
                    stack.append(part)
    return kept_toks


def _rewritten(tok_json: dict, kept: list[int], kept_toks: set[str]) -> dict:
    """A copy of ``tok_json`` with the old ids ``kept`` renumbered 0.. in order: vocabulary, merges
    whose parts and result are kept (in their order), added tokens, post-processor and padding ids."""
    model = tok_json["model"]
    vocab: dict[str, int] = model["vocab"]
    prefix = model.get("continuing_subword_prefix") or ""
    merges = model.get("merges", [])
    o2n = {o: n for n, o in enumerate(kept)}
    new = copy.deepcopy(tok_json)
    nm = new["model"]
    nm["vocab"] = {t: o2n[i] for t, i in vocab.items() if i in o2n}

    def kept_merge(m) -> bool:
        a, b = _merge_pair(m)
        return a in kept_toks and b in kept_toks and _merge_result(a, b, prefix) in kept_toks

    nm["merges"] = [m for m in merges if kept_merge(m)]
    for a in new.get("added_tokens", []):
        a["id"] = o2n[int(a["id"])]

    def remap_post(node):
        if isinstance(node, dict):
            if node.get("type") == "TemplateProcessing":
                for st in node.get("special_tokens", {}).values():
                    st["ids"] = [o2n[int(i)] for i in st.get("ids", [])]
            if node.get("type") in ("BertProcessing", "RobertaProcessing"):
                for key in ("sep", "cls"):
                    if key in node:
                        node[key] = [node[key][0], o2n[int(node[key][1])]]
            for v in node.get("processors", []) or []:
                remap_post(v)

    remap_post(new.get("post_processor"))
    pad = new.get("padding")
    if isinstance(pad, dict) and "pad_id" in pad and int(pad["pad_id"]) in o2n:
        pad["pad_id"] = o2n[int(pad["pad_id"])]
    return new
