"""`neighbors` speed (issue 28 §2): the untrained-row mask in one chunked pass, the token lookup a kept
table, the non-finite row scan over the two matrices only — with results unchanged.

Oracles: an exact grouping of rows (``unique(dim=0)`` on the rows themselves), a counting wrapper around
``get_vocab``, and the rows a NaN was written into.
"""

from __future__ import annotations

import pytest
import torch

from tiny_models import make_tiny
from vocablens.models import Borders, untrained_rows
from vocablens.models.tokens import single_token_id, vocab_table


def _brute_untrained(W: torch.Tensor, min_group: int = 8) -> torch.Tensor:
    out = (W == 0).all(1)
    _, inv, counts = torch.unique(W.float(), dim=0, return_inverse=True, return_counts=True)  # exact rows
    return out | (counts[inv] >= min_group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("V", [97, 8193])
def test_untrained_rows_equal_exact_grouping(dtype, V):
    g = torch.Generator().manual_seed(V)
    W = torch.randn(V, 16, generator=g).to(dtype)
    W[10:20] = W[5]        # a group of 11
    W[30:35] = 0           # zero rows
    W[36] = -0.0           # a negative zero row is all zeros too
    W[40:46] = W[7]        # 7 identical rows: below the group size
    W[V - 13:] = W[3]      # a group ending on the last row (a BLAS mat-vec rounded that one differently)
    got = untrained_rows(W)
    assert torch.equal(got, _brute_untrained(W))
    assert bool(got[V - 1]) and not bool(got[40])


class _CountingTok:
    """A tokenizer-like object counting ``get_vocab`` calls."""

    def __init__(self, n: int = 50) -> None:
        self.n, self.calls = n, 0

    def __len__(self) -> int:
        return self.n

    def get_vocab(self) -> dict:
        self.calls += 1
        return {f"w{i}": i for i in range(self.n)}

    def __call__(self, text, add_special_tokens=False):
        class _Enc:
            input_ids = [int(t[1:]) for t in text.split()]
        return _Enc()


def test_single_token_lookup_reads_the_vocabulary_once():
    tok = _CountingTok()
    for q in ["w3", "w7", "w3", "w12"]:
        assert single_token_id(tok, q) == ([int(q[1:])], None)
    assert tok.calls == 1
    tok.n = 51  # an added token: the table is rebuilt
    assert vocab_table(tok)["w50"] == 50 and tok.calls == 2


def test_nonfinite_rows_read_the_matrices_not_the_blocks():
    b = Borders.from_model(make_tiny("llama"))
    with torch.no_grad():
        b.blocks[0].mlp.down_proj.weight[0, 0] = float("nan")  # a block: no vocabulary row is bad
    assert b.nonfinite_rows().numel() == 0
    with torch.no_grad():
        b.W_E[9, 1] = float("inf")
        b.unembedding.weight[4, 0] = float("nan")
    assert b.nonfinite_rows().tolist() == [4, 9]
    assert not bool(b.real_token_mask()[4]) and not bool(b.real_token_mask()[9])
