"""The input side as one object (:class:`vocablens.models.Embedding`): ``lookup`` equals what block 0
reads, bit for bit, for families beyond tests/tiny_models.py (built with AutoConfig.for_model), in
float32 and bfloat16; ``rows`` equals the same path computed by a float64 copy of the model.
(tests/unit/test_families.py checks ``lookup`` on every family of tests/tiny_models.py.)"""

import copy
import math

import pytest
import torch

from tiny_models import make_tiny
from vocablens.errors import BadInput
from vocablens.models import Borders, Embedding
from vocablens.models.find import find_stream

V, D = 96, 64
_KW = dict(vocab_size=V, hidden_size=D, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=128)

# family -> (config kwargs, the input scale the config sets, applied inside the embedding module?, learned positions?)
EXTRA = {
    "granitemoe": (dict(_KW, num_key_value_heads=2, embedding_multiplier=12.0, num_local_experts=2,
                        num_experts_per_tok=1), 12.0, False, False),
    "hyperclovax": (dict(_KW, num_key_value_heads=2, embedding_multiplier=5.0), 5.0, False, False),
    "falcon_h1": (dict(_KW, num_key_value_heads=2, embedding_multiplier=3.0, mamba_d_ssm=64, mamba_n_heads=4,
                       mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8), 3.0, False, False),
    "minicpm3": (dict(_KW, scale_emb=7.0), 7.0, True, False),
    "vaultgemma": (dict(_KW, num_key_value_heads=2, head_dim=16), math.sqrt(D), True, False),
    "recurrent_gemma": (dict(_KW, num_hidden_layers=3, lru_width=D, attention_window_size=16), math.sqrt(D),
                        False, False),
    "biogpt": (dict(_KW, scale_embedding=True), math.sqrt(D), True, True),
    "xglm": (dict(vocab_size=V, d_model=D, ffn_dim=96, num_layers=2, attention_heads=4,
                  max_position_embeddings=128, scale_embedding=True), math.sqrt(D), True, True),
    "gpt_bigcode": (dict(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=128), 1.0, False, True),
    "mpt": (dict(vocab_size=V, d_model=D, n_layers=2, n_heads=4, max_seq_len=128), 1.0, False, False),
    "codegen": (dict(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=128, rotary_dim=8), 1.0, False,
                False),
}


def _build(family: str, dtype=torch.float32, **kw):
    import transformers as T

    torch.manual_seed(0)
    cfg = T.AutoConfig.for_model(family, **kw)
    return T.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def _ids(T: int = 7) -> torch.Tensor:
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))


def _block0_input(model, x: torch.Tensor) -> torch.Tensor:
    """What the first decoder block receives, captured by a forward pre-hook (the oracle)."""
    got = {}

    def hook(_mod, args, kwargs):
        got["x"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    blocks = find_stream(model)[1]
    handle = blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=x, use_cache=False)
    finally:
        handle.remove()
    return got["x"]


def _zero_positions(E: Embedding) -> None:
    with torch.no_grad():
        for t in [*E.positions.parameters(), *E.positions.buffers()]:
            t.zero_()


@pytest.mark.parametrize("family", sorted(EXTRA))
def test_lookup_is_block_zero_input(family):
    kw, scale, inside, positions = EXTRA[family]
    model = _build(family, **kw)
    E = Borders.from_model(model).input_embedding
    if family == "recurrent_gemma":  # the model stores sqrt(d) as a bfloat16 buffer
        scale = float(torch.tensor(scale, dtype=torch.bfloat16))
    assert E.scale == pytest.approx(scale, rel=1e-7) and E.scale_in_module is inside
    assert (E.positions is not None) is positions
    assert E.weight is model.get_input_embeddings().weight and E.d_model == D
    if positions:
        _zero_positions(E)
    x = _ids()
    with torch.no_grad():
        got = E.lookup(x)
    assert got.shape == (2, 7, D)
    assert torch.equal(_block0_input(model, x), got)


@pytest.mark.parametrize("family,kw", [
    ("gemma", dict(num_key_value_heads=2, head_dim=12)),  # sqrt(48) = 6.93 is 6.9375 in bfloat16
    ("gemma3_text", dict(num_key_value_heads=2, head_dim=12)),
    ("granite", dict(num_key_value_heads=2, embedding_multiplier=0.3)),  # 0.3 is not a bfloat16 number
])
def test_lookup_exact_in_bfloat16(family, kw):
    """Granite multiplies bfloat16 rows by a Python float (rounded once, after a float32 product);
    multiplying by the multiplier rounded to bfloat16 first, as Borders.embed once did, differs."""
    model = _build(family, torch.bfloat16, **dict(_KW, hidden_size=48, **kw))
    b = Borders.from_model(model)
    x = _ids()
    with torch.no_grad():
        got = b.input_embedding.lookup(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(_block0_input(model, x), got)
    if family == "granite":
        with torch.no_grad():
            pre_rounded = b.embedding(x) * torch.tensor(0.3, dtype=torch.bfloat16)
        assert not torch.equal(pre_rounded, got)
    else:
        assert b.embed_scale == float(torch.tensor(math.sqrt(48), dtype=torch.bfloat16)) == 6.9375


@pytest.mark.parametrize("family", ["llama", "gemma", "granite", "bloom", "opt_project"])
def test_rows_equal_a_float64_model(family):
    """rows(ids, float64) from the float32 weights equals lookup() on a float64 copy of the model;
    rows(ids) in float32 equals lookup() of the float32 model (up to project_in's GEMM rounding)."""
    model = make_tiny(family)
    E = Borders.from_model(model).input_embedding
    ref = Embedding.from_model(copy.deepcopy(model).double())
    x = torch.tensor([0, 5, 17, V - 1, 5])
    with torch.no_grad():
        want64 = ref.lookup(x)
        want32 = E.lookup(x)
    torch.testing.assert_close(E.rows(x, torch.float64), want64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(E.rows(x), want32, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(E.rows(slice(3, 9)), E.rows(torch.arange(3, 9)), rtol=0, atol=0)
    assert E.rows().shape == (V, E.d_model)
    d = E.describe()
    assert (d["d_emb"], d["d_model"], d["project_in"]) == ((32, 64, True) if family == "opt_project" else (64, 64, False))
    assert d["input_norm"] == ("LayerNorm" if family == "bloom" else None) and d["scale"] == E.scale


def test_vocab_space_reads_the_input_side_through_it():
    """vocab_space's input embedding is Embedding.rows: with BLOOM's embedding norm applied (it
    used to be left out)."""
    from vocablens.vocab_space import input_embedding

    b = Borders.from_model(make_tiny("bloom"))
    ids = torch.arange(10)
    with torch.no_grad():
        normed = b.input_embedding.input_norm(b.W_E[ids])
    torch.testing.assert_close(input_embedding(b, ids), normed, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(input_embedding(b, ids), b.W_E[ids].detach())


def test_module_scale_is_what_a_replacement_module_applies():
    """The vocab-parallel embedding replaces the module: it must apply Gemma's in-module scale and
    leave Granite's (applied by the decoder after the module) to the model."""
    assert Borders.from_model(make_tiny("gemma")).input_embedding.module_scale == 8.0
    granite = Borders.from_model(make_tiny("granite"))
    assert granite.input_embedding.module_scale is None and granite.input_embedding.scale == 3.0
    assert Borders.from_model(make_tiny("llama")).input_embedding.module_scale is None


@pytest.mark.parametrize("bad", [[V], [-1], [0.5]])
def test_lookup_refuses_ids_outside_the_rows(bad):
    E = Borders.from_model(make_tiny("llama")).input_embedding
    with pytest.raises(BadInput):
        E.lookup(torch.tensor(bad))
    with pytest.raises(BadInput):
        E.rows(torch.tensor(bad))


def test_borders_only_load_reads_the_embedding_norm(tmp_path):
    """A borders-only load reads BLOOM's embedding norm with the matrices (it used to stay on the meta
    device), so the input side it gives equals the full load's."""
    from tiny_dirs import save_tiny, tiny_tokenizer
    from vocablens.models import load
    from vocablens.models.files.partial import load_borders_only

    save_tiny(tmp_path, tiny_tokenizer(), "bloom")
    full = load(str(tmp_path)).borders.input_embedding
    lazy = load_borders_only(str(tmp_path)).borders.input_embedding
    x = torch.arange(full.vocab_size)
    assert not any(p.is_meta for p in lazy.input_norm.parameters())
    assert torch.equal(lazy.rows(x), full.rows(x))
    with torch.no_grad():
        assert torch.equal(lazy.lookup(x), full.lookup(x))


def test_matrices_only_load_refuses_the_input_path(tmp_path):
    """The two-matrices view does not read the input scale (NaN): the path through it is refused in
    one line, never a NaN figure; the stored matrix is still there."""
    from tiny_dirs import save_tiny, tiny_tokenizer
    from vocablens.models.files.partial import load_matrices_only

    save_tiny(tmp_path, tiny_tokenizer(), "llama")
    E = load_matrices_only(str(tmp_path)).borders.input_embedding
    assert math.isnan(E.scale) and E.weight.shape[0] == E.vocab_size
    for call in (lambda: E.rows(slice(0, 4)), lambda: E.rows(torch.tensor([1])), lambda: E.lookup(torch.tensor([1]))):
        with pytest.raises(BadInput, match="input scale was not read"):
            call()
