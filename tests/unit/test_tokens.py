"""Tokens shown as they are: complete characters as text, stray bytes as <0xNN>, round trip to bytes."""

import pytest

from vocablens.models.tokens import show_bytes, shown_to_bytes, token_bytes, token_str


def _sentencepiece_tokenizer():
    """A SentencePiece-style fast tokenizer (▁ for spaces, <0xNN> byte-fallback tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ("▁", "▁the", "▁cat", "é", "▁naïve", "ab", "\\"):
        vocab[piece] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>"), vocab


def test_show_and_back():
    for b in (b" \xe2\x80", b"\xd0\xbe\xd0", b"a\\nb", b"\n\t\r\x1b", b"\xff", "naïve ☃ 𝄞".encode(), b"<0x41>"[:0]):
        assert shown_to_bytes(show_bytes(b)) == b
    assert show_bytes(b" \xe2\x80") == " <0xE2><0x80>"
    assert show_bytes(b"\xd0\xbe\xd0") == "о<0xD0>"
    assert show_bytes(b"\n") == "\\n" and show_bytes(b"\\") == "\\\\"


def test_sentencepiece_byte_fallback():
    tok, vocab = _sentencepiece_tokenizer()
    assert token_str(tok, vocab["<0xE2>"]) == "<0xE2>"          # a lone lead byte
    assert token_str(tok, vocab["<0x41>"]) == "<0x41>"          # a byte row: never shown as the piece A
    assert token_str(tok, vocab["▁the"]) == " the"
    assert token_str(tok, vocab["▁naïve"]) == " naïve"
    assert token_str(tok, vocab["\\"]) == "\\\\"
    assert token_str(tok, vocab["<s>"]) == "<s>"                # special tokens are their own text
    for i in range(len(tok)):
        assert shown_to_bytes(token_str(tok, i)) == token_bytes(tok, i)
    assert token_str(tok, 10_000) == "<id 10000>"


@pytest.mark.slow
def test_every_token_of_the_default_vocabulary_round_trips():
    import vocablens.models as M

    tok = M.load("smollm2").tokenizer
    assert token_str(tok, 459) == " <0xE2><0x80>"               # was ' âĢ' (byte-level mojibake)
    assert token_str(tok, 10003) == "о<0xD0>"                   # was 'Ð¾Ð'
    assert token_str(tok, 260) == " the" and token_str(tok, 198) == "\\n"
    partial = 0
    for i in range(len(tok)):
        s = token_str(tok, i)
        assert shown_to_bytes(s) == token_bytes(tok, i), i
        partial += "<0x" in s
        # a token's bytes are what the tokenizer decodes it to (when that is valid UTF-8)
        if i >= 17 and "<0x" not in s:
            assert token_bytes(tok, i).decode() == tok.decode([i], clean_up_tokenization_spaces=False)
    assert partial == 313


def _bos_tokenizer():
    """The SentencePiece-style tokenizer, adding <s> in front of every text (as Llama-2 / Mistral do)."""
    from tokenizers import processors

    tok, vocab = _sentencepiece_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok, vocab


def test_never_a_doubled_bos():
    from vocablens.models.tokens import adds_bos, encode_prompt

    tok, vocab = _bos_tokenizer()
    assert adds_bos(tok)
    with pytest.warns(UserWarning, match="special tokens"):
        ids = encode_prompt(tok, "<s> the cat")[0].tolist()
    assert ids[0] == 1 and ids[1] != 1                      # one BOS, then the text
    assert ids == encode_prompt(tok, " the cat")[0].tolist()


def test_special_tokens_parse_or_plain():
    import warnings

    from vocablens.errors import VocabLensNote
    from vocablens.models.tokens import encode_text

    tok, vocab = _sentencepiece_tokenizer()
    with pytest.warns(VocabLensNote, match="</s>"):
        parsed = encode_text(tok, "ab</s>ab", add_special_tokens=False)
    assert vocab["</s>"] in parsed
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # plain: no note, no special token
        plain = encode_text(tok, "ab</s>ab", "plain", add_special_tokens=False)
    assert vocab["</s>"] not in plain


def test_lone_surrogate_is_bad_input():
    from vocablens.errors import BadInput
    from vocablens.models.tokens import encode_prompt, encode_text

    tok, _ = _sentencepiece_tokenizer()
    for fn in (lambda: encode_prompt(tok, "x\udced\udca0\udc80y"), lambda: encode_text(tok, "a\udc80"),
               lambda: encode_text(tok, b"bytes")):
        with pytest.raises(BadInput):
            fn()


def test_lone_surrogate_in_a_token_is_bad_input():
    from vocablens.errors import BadInput
    from vocablens.models.tokens import single_token_id

    tok, _ = _sentencepiece_tokenizer()
    with pytest.raises(BadInput, match="U\\+DCED"):
        single_token_id(tok, "x\udced\udca0\udc80y")
