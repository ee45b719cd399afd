"""Argument validation at the public boundary of vocablens.ops: BadInput naming the argument."""

from __future__ import annotations

import pytest
import torch

from vocablens.errors import BadInput
from vocablens.ops import (
    VocabParallelEmbedding, VocabParallelLMHead, embedding_lookup, linear_cross_entropy, lm_head_last, shard_range,
    token_logprobs, vocab_parallel_cross_entropy, vocab_parallel_embedding, vocab_parallel_topk,
)

V, d = 11, 4
H = torch.randn(3, d)
W = torch.randn(V, d)
T = torch.tensor([0, 5, 10])
Z = torch.randn(3, V)

NOT_INTS = [True, False, 2.0, "3", None, torch.tensor(2), [2]]


@pytest.mark.parametrize("bad", NOT_INTS + [-1, V + 1])
def test_top_k_must_be_an_int_in_range(bad):
    with pytest.raises(BadInput, match="top_k"):
        token_logprobs(H, W, T, top_k=bad)


@pytest.mark.parametrize("bad", NOT_INTS + [0, V + 1])
def test_k_of_vocab_parallel_topk_must_be_an_int_in_range(bad):
    with pytest.raises(BadInput, match=r"\bk\b"):
        vocab_parallel_topk(Z, bad, 0, V)


def test_valid_ints_pass_and_numpy_ints_count_as_ints():
    np = pytest.importorskip("numpy")
    r = token_logprobs(H, W, T, top_k=np.int64(2))
    assert r.topk_ids.shape == (3, 2)
    v, i = vocab_parallel_topk(Z, V, 0, V)
    assert torch.equal(v, torch.sort(Z, -1, descending=True).values) and i.shape == (3, V)


@pytest.mark.parametrize("bad", ["avg", "MEAN", None, 1, ("mean",)])
def test_reduction_from_its_set(bad):
    with pytest.raises(BadInput, match="reduction"):
        linear_cross_entropy(H, W, T, reduction=bad)
    with pytest.raises(BadInput, match="reduction"):
        vocab_parallel_cross_entropy(Z, T, 0, V, reduction=bad)


@pytest.mark.parametrize("name,bad", [
    ("label_smoothing", 1.5), ("label_smoothing", -0.1), ("label_smoothing", "0.1"), ("label_smoothing", True),
    ("label_smoothing", float("nan")), ("z_loss", -1e-3), ("z_loss", None), ("ignore_index", 1.5),
    ("ignore_index", None), ("chunk_tokens", 0), ("chunk_tokens", 2.5), ("chunk_tokens", True),
    ("chunk_vocab", -3), ("chunk_bytes", "1MB"), ("logit_scale", 0.0), ("logit_scale", float("inf")),
    ("logit_scale", "2"), ("softcap", -1.0), ("softcap", 0), ("softcap", True),
])
def test_linear_cross_entropy_arguments(name, bad):
    with pytest.raises(BadInput, match=name):
        linear_cross_entropy(H, W, T, **{name: bad})


@pytest.mark.parametrize("name,bad", [
    ("entropy", "yes"), ("entropy", 1), ("chunk_tokens", 0), ("chunk_vocab", 1.0), ("chunk_bytes", -1),
    ("logit_scale", float("nan")), ("softcap", -2.0),
])
def test_token_logprobs_arguments(name, bad):
    with pytest.raises(BadInput, match=name):
        token_logprobs(H, W, T, **{name: bad})


def test_lm_head_and_embedding_arguments():
    with pytest.raises(BadInput, match="positions"):
        lm_head_last(H[None], W, positions=[1.5])
    with pytest.raises(BadInput, match="positions"):
        lm_head_last(H[None], W, positions=torch.tensor([0.0]))
    with pytest.raises(BadInput, match="softcap"):
        lm_head_last(H[None], W, softcap=-1.0)
    with pytest.raises(BadInput, match="logit_scale"):
        lm_head_last(H[None], W, logit_scale=0)
    with pytest.raises(BadInput, match="backward"):
        embedding_lookup(W, T, backward="scatter")
    with pytest.raises(BadInput, match="padding_idx"):
        embedding_lookup(W, T, padding_idx=1.0)
    with pytest.raises(BadInput, match="scale"):
        embedding_lookup(W, T, scale="2")


def test_vocab_parallel_arguments():
    for kw, name in [(dict(V=10.0, world_size=2, rank=0), "V"), (dict(V=10, world_size=True, rank=0), "world_size"),
                     (dict(V=10, world_size=2, rank=None), "rank")]:
        with pytest.raises(BadInput, match=name):
            shard_range(**kw)
    with pytest.raises(BadInput, match="vocab_start"):
        vocab_parallel_embedding(T, W, -1, V)
    with pytest.raises(BadInput, match="vocab_start"):
        vocab_parallel_cross_entropy(Z, T, 0.0, V)
    with pytest.raises(BadInput, match="ignore_index"):
        vocab_parallel_cross_entropy(Z, T, 0, V, ignore_index="x")
    with pytest.raises(BadInput, match="label_smoothing"):
        vocab_parallel_cross_entropy(Z, T, 0, V, label_smoothing=2)
    with pytest.raises(BadInput, match="dtype"):
        VocabParallelEmbedding(V, d, dtype=torch.int32)
    with pytest.raises(BadInput, match="embedding_dim"):
        VocabParallelEmbedding(V, 0)
    with pytest.raises(BadInput, match="bias"):
        VocabParallelLMHead(d, V, bias="yes")
    with pytest.raises(BadInput, match="softcap"):
        VocabParallelLMHead(d, V, softcap=-3.0)
