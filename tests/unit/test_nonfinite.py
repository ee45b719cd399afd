"""Weights with NaN or inf: refused where they poison a result, excluded and reported where they need not."""

import pytest
import torch

from tiny_models import ids, make_tiny
from vocablens.errors import BadInput, NonFiniteWeights
from vocablens.lens import logit_lens
from vocablens.models import Borders


def _borders(family="llama"):
    return Borders.from_model(make_tiny(family))


def test_healthy_model_has_nothing_to_report():
    b = _borders()
    assert b.nonfinite() == {} and b.nonfinite_rows().numel() == 0
    b.check_finite()


def test_count_is_exact_when_finite_values_overflow_a_sum():
    """The scan skips chunks whose sum is finite; a chunk of huge finite values (its float32 sum is inf)
    is counted exactly, so it holds no non-finite value, and +inf and -inf in one chunk are both seen."""
    b = _borders()
    with torch.no_grad():
        b.unembedding.weight[:4] = 3e38
        assert b.nonfinite() == {}
        b.unembedding.weight[7, 0], b.unembedding.weight[7, 1] = float("inf"), -float("inf")
        assert b.nonfinite() == {"lm_head.weight": 2}


def test_nan_row_in_the_head_refuses_the_lens():
    b = _borders("llama")                      # untied: W_U is its own matrix
    with torch.no_grad():
        b.unembedding.weight[5, 3] = float("nan")
    assert b.nonfinite() == {"lm_head.weight": 1}
    assert b.nonfinite_rows().tolist() == [5]
    with pytest.raises(NonFiniteWeights, match=r"lm_head\.weight.*rows \[5\]"):
        logit_lens(b, ids(batch=1))
    # the real-vocabulary mask leaves the row out, so row-wise analyses can go on without it
    assert not bool(b.real_token_mask()[5]) and int(b.real_token_mask().sum()) == b.vocab_size - 1


def test_inf_in_a_block_refuses_any_forward():
    b = _borders("qwen3")
    with torch.no_grad():
        b.blocks[1].mlp.down_proj.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteWeights, match="down_proj"):
        b.residual_stream(ids(batch=1))


def test_nan_embedding_row_matters_only_for_its_tokens():
    b = _borders("llama")
    x = ids(batch=1)
    unused = int(torch.tensor([i for i in range(b.vocab_size) if i not in x.flatten().tolist()])[0])
    with torch.no_grad():
        b.W_E[unused] = float("nan")
    b.residual_stream(x)                       # the bad row is not read
    with pytest.raises(NonFiniteWeights):
        b.residual_stream(torch.tensor([[unused, 1, 2]]))
    assert issubclass(NonFiniteWeights, BadInput) is False  # a damaged file, not a bad argument


def test_neighbors_exclude_nan_rows():
    from vocablens.geometry.embedding import nearest_neighbors

    class Tok:
        def get_vocab(self):
            return {f"t{i}": i for i in range(96)}

        def __call__(self, text, add_special_tokens=False):
            class R:
                input_ids = [int(text[1:])]
            return R()

        def __len__(self):
            return 96

        def convert_ids_to_tokens(self, i):
            return f"t{i}"

        def decode(self, ids, **kw):
            return "".join(f"t{i}" for i in ids)

    b = Borders.from_model(make_tiny("llama_tied"))
    with torch.no_grad():
        b.W_E[7] = float("nan")
    res = nearest_neighbors(b, Tok(), ["t3"], k=95 - 1)
    got = [int(i) for lst in res.results[0].lists for i in lst.ids]
    assert 7 not in got and all(torch.isfinite(torch.tensor([float(c) for lst in res.results[0].lists for c in lst.cosines])))
