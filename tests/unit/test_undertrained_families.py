"""``vocablens.undertrained`` on a tiny random model of every family ``tiny_models`` covers.

Properties, not one machine's floats: an indicator per row, finite on every token; classes that sum
to V; verification's probabilities in [0, 1]; and a row planted near where training never moves a
row (the head row the mean of the known-unused rows, the input row shrunk to 1e-3 of its norm) is
the lowest-indicator candidate whichever indicator the family gets (tied or untied)."""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from vocablens.models import Borders

#: the planted row (a WordLevel word, testable) and the unreachable entries (the reference set)
PLANTED, N_UNREACHABLE = 10, 4


def _tokenizer(n: int):
    """WordLevel of ``n`` entries: [UNK], words w1..; the last N_UNREACHABLE hold a space (unreachable)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]"] + [f"w{i}" for i in range(1, n - N_UNREACHABLE)] + [f"r{i} r" for i in range(N_UNREACHABLE)]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_indicators_and_verification_on_every_family(family):
    from vocablens.undertrained import undertrained

    model = tm.make_tiny(family)
    b0 = Borders.from_model(model)
    V = b0.vocab_size
    tok = _tokenizer(V - 3)  # three padding rows beyond the tokenizer
    b = Borders.from_model(model, tok)
    ref = list(range(len(tok) - N_UNREACHABLE, V))  # unreachable + padding: what the analysis finds
    with torch.no_grad():
        W_U, W_E = b.unembedding.weight, b.W_E
        W_U[PLANTED] = W_U[ref].mean(0) + 1e-4 * torch.randn(W_U.shape[1])
        if not b.tied:
            W_E[PLANTED] *= 1e-3
    res = undertrained(b, tok, candidates=4)
    c = res.counts()
    assert sum(c.values()) == V and c["padding"] == 3 and c["unreachable"] == N_UNREACHABLE
    assert sorted(res.indicators.reference.tolist()) == ref
    vals = res.indicators.values
    assert vals.shape == (V,) and vals.dtype == torch.float32
    assert bool(torch.isfinite(vals[: len(tok)]).all())
    assert res.indicators.name == ("unembedding_cosine" if b.tied else "embedding_norm"), family
    assert int(res.candidates[0]) == PLANTED, (family, res.candidates.tolist())
    p = res.verification.per_template
    assert p.shape == (4, 3) and bool(((p >= 0) & (p <= 1)).all())
    assert res.verified.numel() <= 4
