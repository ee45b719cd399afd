"""Complete-row chunks of :func:`vocablens.ops.token_logprobs` (the path of ``score``): exp-sums read in
blocks of ``EXP_ROWS`` rows, with and without the entropy, and the default chunk plan.

Oracle: a float64 log-softmax of the same logits (log-probs, logsumexp, entropy), the entropy's
definition -Σ p log p with 0·log 0 = 0 where columns are masked, and the chunk-size rule written in
the module's constants (512 complete rows when they fit 96 MiB).
"""

from __future__ import annotations

import math

import pytest
import torch

from tiny_models import ids as tiny_ids, make_tiny
from vocablens.errors import BadInput
from vocablens.generate.score import score_ids
from vocablens.models import Borders
from vocablens.ops import token_logprobs
from vocablens.ops.logprobs import EXP_ROWS, FULL_ROW_CHUNK_BYTES, MIN_FULL_ROW_TOKENS, _chunk_plan


def _case(N: int, V: int, d: int = 8, offset: float = 0.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g)
    W = torch.randn(V, d, generator=g)
    b = torch.full((V,), offset)
    t = torch.randint(0, V, (N,), generator=g)
    return h, W, b, t


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_full_rows_over_several_exp_blocks_match_float64(offset):
    N = 2 * EXP_ROWS + 5  # three blocks of rows, the last one short
    h, W, b, t = _case(N, 300, offset=offset)
    z = torch.addmm(b, h, W.T).double()  # the float32 logits the head computes, then exact arithmetic
    lp = z.log_softmax(-1)
    r = token_logprobs(h, W, t, bias=b, entropy=True, top_k=3, chunk_tokens=N)
    assert float((r.logprob.double() - lp.gather(1, t[:, None])[:, 0]).abs().max()) <= 1e-5
    assert float((r.lse.double() - torch.logsumexp(z, -1)).abs().max()) <= 1e-5 + 1e-7 * offset
    assert float((r.entropy.double() + (lp.exp() * lp).sum(-1)).abs().max()) <= 1e-5
    assert float((r.topk_logprobs.double() - lp.topk(3).values).abs().max()) <= 1e-5
    # without the entropy the exp goes over the logits in place: the same normalizer, bit for bit
    r0 = token_logprobs(h, W, t, bias=b, entropy=False, top_k=3, chunk_tokens=N)
    assert r0.entropy is None
    assert torch.equal(r0.logprob, r.logprob) and torch.equal(r0.lse, r.lse)
    assert torch.equal(r0.topk_ids, r.topk_ids) and torch.equal(r0.topk_logprobs, r.topk_logprobs)


def test_full_rows_entropy_with_masked_columns():
    N, V = EXP_ROWS + 3, 40
    h, W, b, t = _case(N, V, seed=1)
    b[: V // 2] = -math.inf  # half the vocabulary masked: 0·(-inf) must not turn the entropy into NaN
    t = t % (V // 2) + V // 2
    r = token_logprobs(h, W, t, bias=b, entropy=True, chunk_tokens=N)
    lp = (h.double() @ W.double().T + b.double()).log_softmax(-1)
    p = lp.exp()
    ent = -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(-1)
    assert bool(torch.isfinite(r.entropy).all())
    assert float((r.entropy.double() - ent).abs().max()) <= 1e-5
    assert float((r.logprob.double() - lp.gather(1, t[:, None])[:, 0]).abs().max()) <= 1e-5


def test_default_chunks_are_512_complete_rows_when_they_fit():
    V = 49_152
    assert MIN_FULL_ROW_TOKENS * V * 4 == FULL_ROW_CHUNK_BYTES  # the default model's 512 rows fill the budget
    assert _chunk_plan(127, V, None, None, None) == (127, V)
    assert _chunk_plan(511, V, None, None, None) == (511, V)  # 512 tokens: one GEMM, not two of 256
    assert _chunk_plan(4095, V, None, None, None) == (512, V)
    big = 256_000  # a larger vocabulary: as many complete rows as fit the same budget
    assert _chunk_plan(4095, big, None, None, None) == (FULL_ROW_CHUNK_BYTES // (4 * big), big)
    assert _chunk_plan(4095, V, None, 100, 1000) == (100, 1000)  # the caller's sizes win


def test_score_ids_without_entropy_gives_the_same_logprobs():
    model = make_tiny("llama")
    b = Borders.from_model(model)
    ids = tiny_ids(1, 11, seed=2)[0]
    full = score_ids(b, ids, top_k=2)
    lean = score_ids(b, ids, top_k=2, entropy=False)
    assert lean.entropy is None and full.entropy is not None
    assert torch.equal(lean.logprobs, full.logprobs)
    assert torch.equal(lean.topk_ids, full.topk_ids)
    with pytest.raises(BadInput, match="entropy"):
        score_ids(b, ids, entropy="no")
