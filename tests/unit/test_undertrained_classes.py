"""Tokenizer classes of ``vocablens.undertrained`` on hand-built tokenizers (every class hand-checked),
and the indicators against float64 oracles."""

from __future__ import annotations

import pytest
import torch

from vocablens.errors import BadInput
from vocablens.undertrained import classify_tokens
from vocablens.undertrained.indicators import (
    choose_indicator, cosine_to_reference, embedding_norm, first_principal_component,
)


def _bytelevel():
    """Byte-level BPE: the 256 byte characters, merges a+b, ab+c, Ġ+ab, â+Ģ (bytes E2 80), and
    ``bc`` / ``xy`` in the vocabulary without a merge that makes them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for piece in ("ab", "abc", "Ġab", "âĢ", "bc", "xy"):
        vocab[piece] = len(vocab)
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "ab"), ("â", "Ģ")]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    tok.add_tokens(["<|reserved_special_token_0|>"])
    return tok, tok.get_vocab()


def _sentencepiece():
    """SentencePiece-style BPE (▁, byte fallback) with merges ▁+t, ▁t+h, ▁th+e, t+h; ``▁cat`` has no merge."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ("▁", "t", "h", "e", "c", "a", "▁t", "▁th", "▁the", "th", "▁cat"):
        vocab[piece] = len(vocab)
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("t", "h")]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>"), vocab


def _wordlevel():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "a b": 3, "x.y": 4, "é": 5, "z": 6}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]"), vocab


def test_bytelevel_classes_hand_checked():
    tok, v = _bytelevel()
    c = classify_tokens(tok)
    assert c.kind == "bytelevel"
    want = {"ab": "normal", "abc": "normal", "Ġab": "normal",       # made by the merges
            "bc": "unreachable", "xy": "unreachable",                # in the vocabulary, no merge makes them
            "âĢ": "partial_utf8",                                   # bytes E2 80: two thirds of '—'
            "a": "single_byte", "â": "single_byte", "Ġ": "single_byte",
            "<|endoftext|>": "special", "<|reserved_special_token_0|>": "special"}
    assert {p: c.name(v[p]) for p in want} == want
    # 256 byte characters, 2 specials, 6 pieces: 3 normal, 2 unreachable, 1 partial
    assert c.counts() == {"normal": 3, "special": 2, "single_byte": 256, "partial_utf8": 1, "unreachable": 2,
                          "padding": 0}
    assert bool(c.round_trips[v["a"]]) and not bool(c.round_trips[v["â"]])  # a lone 0xE2 is no text


def test_sentencepiece_classes_hand_checked():
    tok, v = _sentencepiece()
    c = classify_tokens(tok, vocab_size=len(tok) + 5)                  # five padding rows
    assert c.kind == "sentencepiece"
    want = {"▁the": "normal", "▁th": "normal", "th": "normal",       # "the" -> ▁the; "\nth" -> <0x0A> th
            "▁t": "normal", "t": "single_byte",                     # one byte, and it round-trips
            "▁cat": "unreachable",                                  # no merge builds it: ▁ c a t
            "<0xE2>": "single_byte", "<0x41>": "single_byte",
            "<s>": "special", "<unk>": "special"}
    assert {p: c.name(v[p]) for p in want} == want
    assert c.counts()["padding"] == 5 and c.counts()["special"] == 3
    # 'A' has no piece: byte fallback gives [▁, <0x41>], and after a newline [▁, <0x0A>, <0x41>]: it comes back;
    # a lone 0xE2 is no text
    assert bool(c.round_trips[v["t"]]) and bool(c.round_trips[v["<0x41>"]]) and not bool(c.round_trips[v["<0xE2>"]])
    assert c.name(len(tok) + 4) == "padding"


def test_wordlevel_classes_hand_checked():
    tok, v = _wordlevel()
    c = classify_tokens(tok)
    assert c.kind == "plain"
    want = {"hello": "normal", "world": "normal", "é": "normal",      # 'é' is two bytes, one character
            "a b": "unreachable",                                   # the text splits at the space
            "x.y": "unreachable",                                   # ... and at the punctuation
            "z": "single_byte", "[UNK]": "special"}
    assert {p: c.name(v[p]) for p in want} == want


def test_first_principal_component_equals_float64_svd():
    g = torch.Generator().manual_seed(0)
    d = 24
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    scales = torch.linspace(3.0, 0.2, d, dtype=torch.float64)
    W = (torch.randn(3000, d, generator=g, dtype=torch.float64) * scales) @ basis.T + 5.0  # an offset too
    pc, mean = first_principal_component(W.float())
    Wc = W - W.mean(0)
    ref = torch.linalg.svd(Wc, full_matrices=False).Vh[0]              # the oracle: float64 SVD
    assert abs(abs(float(pc.double() @ ref)) - 1.0) < 1e-6
    assert torch.allclose(mean.double(), W.mean(0), atol=1e-4)
    mask = torch.zeros(3000, dtype=torch.bool)
    mask[:1500] = True
    pc_half, _ = first_principal_component(W.float(), rows=mask)
    ref_half = torch.linalg.svd(W[:1500] - W[:1500].mean(0), full_matrices=False).Vh[0]
    assert abs(abs(float(pc_half.double() @ ref_half)) - 1.0) < 1e-6


def test_cosine_to_reference_equals_float64_formula():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(500, 16, generator=g, dtype=torch.float64)
    W[7] = 0.0                                                         # a zero row: distance 1
    pc = torch.nn.functional.normalize(torch.randn(16, generator=g, dtype=torch.float64), dim=0)
    ref = torch.tensor([3, 10, 42])
    got = cosine_to_reference(W.float(), ref, pc.float())
    Wp = W - (W @ pc)[:, None] * pc
    m = Wp[ref].mean(0)
    want = 1 - (Wp @ m) / (Wp.norm(dim=1) * m.norm()).clamp_min(1e-300)
    want[7] = 1.0
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert torch.allclose(embedding_norm(W.float()).double(), W.norm(dim=1), atol=1e-5)


def test_choose_indicator():
    assert choose_indicator(True)[0] == "unembedding_cosine"
    assert choose_indicator(False)[0] == "embedding_norm"
    assert choose_indicator(False, "unembedding_cosine")[0] == "unembedding_cosine"
    with pytest.raises(BadInput, match="untied"):
        choose_indicator(True, "embedding_norm")
    with pytest.raises(BadInput, match="indicator must be"):
        choose_indicator(True, "l2")


@pytest.mark.parametrize("build", [_bytelevel, _sentencepiece, _wordlevel])
def test_fast_classification_equals_the_first_one(build):
    """The batched path (one convert_ids_to_tokens, the backend's encode_batch) gives the classes and
    round trips of the first, token-by-token implementation (tests/undertrained_classes_v1.py)."""
    from undertrained_classes_v1 import classify_tokens_v1

    tok, _ = build()
    for V in (None, len(tok) + 3):
        new, old = classify_tokens(tok, V), classify_tokens_v1(tok, V)
        assert torch.equal(new.cls, old.cls) and torch.equal(new.round_trips, old.round_trips)
        assert new.kind == old.kind and new.n_tokens == old.n_tokens


def test_fast_classification_equals_the_first_one_on_the_default_tokenizer(smollm2):
    from undertrained_classes_v1 import classify_tokens_v1

    tok = smollm2.tokenizer
    new, old = classify_tokens(tok, 49152), classify_tokens_v1(tok, 49152)
    assert torch.equal(new.cls, old.cls) and torch.equal(new.round_trips, old.round_trips)
    assert new.counts()["normal"] == 48_700 and new.counts()["single_byte"] == 235
