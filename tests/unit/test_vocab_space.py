"""vocablens.vocab_space and models.blocks: parameters and updates in vocabulary space.

Tiny random models of every family with a dense MLP (gated and plain MLPs, GQA and multi-query,
fused q/k/v and gate/up projections, parallel blocks, post-norms, residual multipliers), and the real
default model (session fixture ``smollm2``) for known cases.
"""

import json

import pytest
import torch

from tiny_models import FAMILIES, ids, make_tiny
from vocablens import vocab_space as vs
from vocablens.errors import BadInput, TokenNotInVocabulary, UnsupportedArchitecture
from vocablens.models import Borders
from vocablens.models.blocks import block_view, block_views, capture_updates, linear_weight, linearize_norm

UNSUPPORTED = {"mixtral": "mixture-of-experts", "qwen3_moe": "mixture-of-experts"}
NOT_ADDITIVE = {"opt_project"}  # post-LN blocks
DENSE = [f for f in FAMILIES if f not in UNSUPPORTED]
ADDITIVE = [f for f in DENSE if f not in NOT_ADDITIVE]


@pytest.fixture(scope="module")
def tiny_cache():
    return {}


def tiny(cache, family):
    if family not in cache:
        m = make_tiny(family)
        cache[family] = Borders.from_model(m)
    return cache[family]


# ---------------------------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("family", ADDITIVE)
def test_updates_sum_to_final_stream(tiny_cache, family):
    """x_0 + Σ_l (attention_l + FFN_l) equals the last block's output, at every position."""
    b = tiny_cache.get(family) or tiny(tiny_cache, family)
    views = block_views(b)
    x = ids(2, 7)
    with torch.no_grad(), capture_updates(views, tuple(x.shape)) as caps:
        resid, _ = b.residual_stream(x)
    total = resid[0] + sum(c.attn + c.mlp for c in caps)
    torch.testing.assert_close(total, resid[-1], rtol=0, atol=1e-5)
    for i, c in enumerate(caps):  # and block by block
        torch.testing.assert_close(resid[i] + c.attn + c.mlp, resid[i + 1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", DENSE)
def test_sub_updates_and_heads_sum_to_outputs(tiny_cache, family):
    """Σ_i a_i·v_i + b_out equals the FFN output; Σ_h z_h W_O[h] + b_O equals the attention output."""
    b = tiny(tiny_cache, family)
    views = block_views(b)
    x = ids(2, 7)
    with torch.no_grad(), capture_updates(views, tuple(x.shape)) as caps:
        b.residual_stream(x)
    for v, c in zip(views, caps):
        sub = torch.einsum("btf,fd->btd", c.act, v.W_out)
        if v.b_out is not None:
            sub = sub + v.b_out
        torch.testing.assert_close(sub, c.mlp_raw, rtol=0, atol=1e-5)
        z = c.z.reshape(*c.z.shape[:2], v.n_heads, v.d_head)
        heads = torch.einsum("btnk,nkd->btd", z, v.W_O)
        if v.b_O is not None:
            heads = heads + v.b_O
        torch.testing.assert_close(heads, c.attn_raw, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", DENSE)
def test_value_heads_mapped_at_position_zero(tiny_cache, family):
    """At position 0 a causal head attends only to itself, so z_h = x W_V[kv_head(h)] + b_V: checks the
    per-head split of separate and fused (concatenated, grouped, multi-query) projections and GQA."""
    b = tiny(tiny_cache, family)
    v = block_view(b, 0)
    store = {}

    def pre(_m, args, kwargs):
        store["x"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    h = v.attn.register_forward_pre_hook(pre, with_kwargs=True)
    x = ids(2, 5)
    try:
        with torch.no_grad(), capture_updates([v], tuple(x.shape)) as caps:
            b.model(input_ids=x, use_cache=False)
    finally:
        h.remove()
    _, _, Wv = v.qkv()
    _, _, bv = v.qkv_bias()
    xin = store["x"][:, 0]
    expect = torch.stack([xin @ Wv[v.kv_head(k)] + (0 if bv is None else bv[v.kv_head(k)])
                          for k in range(v.n_heads)], 1)
    got = caps[0].z[:, 0].reshape(-1, v.n_heads, v.d_head)
    torch.testing.assert_close(got, expect, rtol=0, atol=1e-5)


def test_gqa_mapping_llama(tiny_cache):
    b = tiny(tiny_cache, "llama")  # 4 query heads, 2 kv heads, d_head 16
    v = block_view(b, 1)
    assert (v.n_heads, v.n_kv_heads, v.d_head) == (4, 2, 16)
    assert [v.kv_head(h) for h in range(4)] == [0, 0, 1, 1]
    Wv, Wo = v.W_OV(3)
    torch.testing.assert_close(Wv, v.attn.v_proj.weight[16:32].t())
    torch.testing.assert_close(Wo, v.attn.o_proj.weight[:, 48:64].t())
    Wq, Wk = v.W_QK(2)
    torch.testing.assert_close(Wq, v.attn.q_proj.weight[32:48].t())
    torch.testing.assert_close(Wk, v.attn.k_proj.weight[16:32].t())


def test_fused_gate_up_phi3(tiny_cache):
    b = tiny(tiny_cache, "phi3")
    v = block_view(b, 0)
    w = v.mlp_in.weight  # [2·d_ff, d]: gate first, then up
    assert v.gated and v.d_ff == w.shape[0] // 2
    torch.testing.assert_close(v.W_gate, w[: v.d_ff])
    torch.testing.assert_close(v.W_in, w[v.d_ff:])
    torch.testing.assert_close(v.keys, w[: v.d_ff])


@pytest.mark.parametrize("family,parallel", [("llama", False), ("gpt_neox", True), ("gptj", True), ("phi", True),
                                             ("falcon", True), ("cohere", True), ("gpt2", False)])
def test_parallel_flag(tiny_cache, family, parallel):
    assert block_view(tiny(tiny_cache, family), 0).parallel is parallel


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2", "cohere", "olmo2"])
def test_norm_linearization_is_exact_at_input(tiny_cache, family):
    b = tiny(tiny_cache, family)
    x = torch.randn(3, b.d_model) * 2
    lin = linearize_norm(b.final_norm, x)
    with torch.no_grad():
        torch.testing.assert_close(lin.linear(x) + lin.bias, b.final_norm(x), rtol=0, atol=1e-5)
    r = torch.randn(b.d_model)
    u = torch.randn(3, b.d_model)
    torch.testing.assert_close((lin.linear(u) * r).sum(-1), (lin.pull_back(r) * u).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(UNSUPPORTED))
def test_moe_is_unsupported(tiny_cache, family):
    b = tiny(tiny_cache, family)
    with pytest.raises(UnsupportedArchitecture, match=f"'{family}'.*mixture-of-experts.*modules found"):
        block_view(b, 0)
    with pytest.raises(UnsupportedArchitecture):
        vs.project_vectors(b, [0], [0])
    with pytest.raises(UnsupportedArchitecture):
        vs.explain(b, ids(1, 5)[0])


def test_post_ln_explain_is_unsupported(tiny_cache):
    b = tiny(tiny_cache, "opt_project")
    with pytest.raises(UnsupportedArchitecture, match="post-LN"):
        vs.explain(b, ids(1, 5)[0])
    # parameters can still be read
    assert vs.project_vectors(b, [1], [2], k=3).top_ids.shape == (1, 3)


# ---------------------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("family", DENSE)
def test_value_projection_equals_direct(tiny_cache, family):
    """Without the gain: scores = v @ W_Uᵀ (projected out); v read from the down projection directly."""
    b = tiny(tiny_cache, family)
    layer, neuron = 1, 5
    v = block_view(b, layer)
    down = v.mlp_out
    vec = (down.weight[neuron] if type(down).__name__ == "Conv1D" else down.weight[:, neuron]).detach().float()
    h = vec if b.project_out is None else b.project_out(vec)
    direct = (h @ b.unembedding.weight.float().t()) * b.logit_scale
    res = vs.project_vectors(b, [layer], [neuron], k=7, apply_norm_gain=False)
    torch.testing.assert_close(res.top_scores[0], torch.topk(direct, 7).values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.bottom_scores[0], torch.topk(direct, 7, largest=False).values,
                               rtol=1e-5, atol=1e-6)
    assert res.top_ids[0].tolist() == torch.topk(direct, 7).indices.tolist()
    assert float(res.norms[0]) == pytest.approx(float(vec.norm()), rel=1e-6)


@pytest.mark.parametrize("family", ["llama", "gemma", "gemma2", "qwen3", "granite"])
def test_value_projection_with_gain_is_the_model_map(tiny_cache, family):
    """With the gain (RMSNorm families): U(g⊙v) equals the model's head on final_norm(v), times rms(v)."""
    b = tiny(tiny_cache, family)
    v = block_view(b, 0)
    vec = v.W_out[3].detach().float()
    eps = getattr(b.final_norm, "variance_epsilon", getattr(b.final_norm, "eps", 0.0))
    rms = torch.sqrt((vec ** 2).mean() + eps)
    with torch.no_grad():
        direct = b.lm_head(b.final_norm(vec[None]))[0].float() * rms * b.logit_scale
    res = vs.project_vectors(b, [0], [3], k=5)
    torch.testing.assert_close(res.top_scores[0], torch.topk(direct, 5).values, rtol=1e-4, atol=1e-6)
    assert res.top_ids[0].tolist() == torch.topk(direct, 5).indices.tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt_project", "phi3"])
def test_key_projection_equals_direct(tiny_cache, family):
    b = tiny(tiny_cache, family)
    v = block_view(b, 1)
    key = linear_weight(v.mlp_gate if v.mlp_gate is not None else v.mlp_in)[4].float()
    if v.gated and v.mlp_gate is None:  # phi3: fused [gate | up]
        key = linear_weight(v.mlp_in)[4].float()
    E = b.W_E.float() * b.embed_scale
    if b.project_in is not None:
        E = b.project_in(E)
    direct = E @ key
    res = vs.project_vectors(b, [1], [4], k=4, kind="key")
    torch.testing.assert_close(res.top_scores[0], torch.topk(direct, 4).values, rtol=1e-5, atol=1e-6)


def test_project_streams_in_chunks(tiny_cache):
    b = tiny(tiny_cache, "gpt2")
    layers, neurons = vs.sample_neurons(b, 6, seed=3)
    assert len(layers) == 12 and layers[:6] == [0] * 6 and len(set(neurons[:6])) == 6
    whole = vs.project_vectors(b, layers, neurons, k=5)
    chunked = vs.project_vectors(b, layers, neurons, k=5, chunk_rows=5)
    assert torch.equal(whole.top_ids, chunked.top_ids) and torch.equal(whole.bottom_ids, chunked.bottom_ids)


def _all_scores(b, gain=True):
    """Every value vector projected through the readout, [N, V] (brute force, tiny models only)."""
    R = vs.readout(b, gain)
    return torch.cat([v.W_out.detach().float() @ R.t() for v in block_views(b)])


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "falcon", "opt_project", "gemma2"])
def test_value_stats_equal_brute_force(tiny_cache, family):
    """The closed-form moments (μ·v, vᵀCv) equal the mean and std of each vector's projected logits."""
    b = tiny(tiny_cache, family)
    for gain in (True, False):
        S = _all_scores(b, gain)
        st = vs.value_stats(b, gain)
        std, mean = torch.std_mean(S, dim=1, correction=0)
        torch.testing.assert_close(st.mean, mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(st.std, std, rtol=1e-4, atol=1e-5)
        d_ff = block_view(b, 0).d_ff
        assert st.blocks.tolist() == [i // d_ff for i in range(len(S))]
        assert st.neurons.tolist() == [i % d_ff for i in range(len(S))]


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "falcon"])
def test_search_token_equals_brute_force(tiny_cache, family):
    """Rows are ranked by the token's z-score within each vector's own logits, found exactly."""
    b = tiny(tiny_cache, family)
    t = 11
    res = vs.search_token(b, t, k=6)
    S = _all_scores(b)
    std, mean = torch.std_mean(S, dim=1, correction=0)
    z = (S[:, t] - mean) / std
    d_ff = block_view(b, 0).d_ff
    top, bot = torch.topk(z, 6), torch.topk(z, 6, largest=False)
    assert (res.promote_blocks * d_ff + res.promote_neurons).tolist() == top.indices.tolist()
    assert (res.suppress_blocks * d_ff + res.suppress_neurons).tolist() == bot.indices.tolist()
    torch.testing.assert_close(res.promote_z, top.values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(res.suppress_z, bot.values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(res.promote_scores, S[top.indices, t])
    # rank: the token's place among the vector's logits, from the top (promote) or the bottom (suppress)
    assert res.promote_ranks.tolist() == [int((S[i] > S[i, t]).sum()) for i in top.indices.tolist()]
    assert res.suppress_ranks.tolist() == [int((S[i] < S[i, t]).sum()) for i in bot.indices.tolist()]
    assert res.criterion == vs.CRITERION and "z-score" in res.criterion


def test_search_ranks_by_specificity_not_norm(tiny_cache):
    """A vector scaled up 100x keeps its z-score: a high norm alone does not win the reverse search."""
    b = tiny(tiny_cache, "llama")
    t = 7
    before = vs.search_token(b, t, k=1)
    stats = vs.value_stats(b)
    assert vs.value_stats(b) is stats  # kept while the weights are unchanged
    ly, n = int(before.promote_blocks[0]), int(before.promote_neurons[0])
    other = (ly + 1) % b.n_layers
    W = block_view(b, other).mlp_out.weight  # [d, d_ff]: column j is value vector j
    saved = W.detach().clone()
    try:
        with torch.no_grad():
            W.mul_(100.0)
        assert vs.value_stats(b) is not stats  # an in-place edit is seen
        after = vs.search_token(b, t, k=1)
        assert (int(after.promote_blocks[0]), int(after.promote_neurons[0])) == (ly, n)
        assert float(after.promote_z[0]) == pytest.approx(float(before.promote_z[0]), rel=1e-4)
        # ranked by the raw logit, a vector of the scaled block would now come first
        raw = block_view(b, other).W_out.detach().float() @ vs.readout(b)[t]
        assert float(raw.max()) > float(after.promote_scores[0])
    finally:
        with torch.no_grad():
            W.copy_(saved)


def test_search_several_tokens(tiny_cache):
    b = tiny(tiny_cache, "gpt2")
    st = vs.value_stats(b)
    many = vs.search_tokens(b, [3, 9, 3], k=4, stats=st)
    assert [s.token_id for s in many] == [3, 9, 3]
    one = vs.search_token(b, 9, k=4)
    for f in ("promote_blocks", "promote_neurons", "suppress_blocks", "suppress_neurons", "promote_ranks"):
        assert torch.equal(getattr(many[1], f), getattr(one, f)), f
    assert torch.equal(many[0].promote_neurons, many[2].promote_neurons)
    from vocablens.render import vocab_space as rv

    L, N = rv.search_vectors(many)
    assert len(L) == 3 * 8 and (L[4], N[4]) == (int(many[0].suppress_blocks[0]), int(many[0].suppress_neurons[0]))
    tops = vs.project_vectors(b, L, N, k=2)
    d = rv.search_to_dict(many, None, tops)
    assert [r["target_id"] for r in d["promote"]] == [3] * 4 + [9] * 4 + [3] * 4
    assert d["token_ids"] == [3, 9, 3] and d["token_id"] == 3 and "z-score" in d["criterion"]
    assert d["suppress"][4]["neuron"] == int(many[1].suppress_neurons[0])
    assert d["suppress"][4]["top_tokens"] == [str(i) for i in tops.top_ids[12].tolist()]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_interpretable_vectors_criterion(tiny_cache, family):
    """The chosen rows are the sampled vectors with the largest mean z-score of their top-k logits,
    at most max_per_block per block, best first."""
    b = tiny(tiny_cache, family)
    res = vs.interpretable_vectors(b, n=3, per_block=10, k=4, max_per_block=1, seed=5, chunk_rows=7)
    layers, neurons = vs.sample_neurons(b, 10, seed=5)
    S = torch.cat([block_view(b, ly).W_out[n].detach().float()[None] for ly, n in zip(layers, neurons)]) @ vs.readout(b).t()
    std, mean = torch.std_mean(S, dim=1, correction=0)
    crit = ((torch.topk(S, 4).values - mean[:, None]) / std[:, None]).mean(1)
    expect, seen = [], set()
    for j in torch.argsort(crit, descending=True).tolist():
        if layers[j] not in seen and len(expect) < 3:
            expect.append(j)
            seen.add(layers[j])
    assert len(res.vectors.blocks) == min(3, b.n_layers)
    assert [(int(a), int(c)) for a, c in zip(res.vectors.blocks, res.vectors.neurons)] == \
        [(layers[j], neurons[j]) for j in expect]
    torch.testing.assert_close(res.top_z, crit[expect], rtol=1e-4, atol=1e-4)
    assert res.vectors.top_ids.tolist() == torch.topk(S[expect], 4).indices.tolist()
    assert res.n_candidates == 10 * b.n_layers and "z-score" in res.criterion and "10 per block" in res.criterion
    assert res.top_z.tolist() == sorted(res.top_z.tolist(), reverse=True)


@pytest.mark.parametrize("family,circuit", [("llama", "ov"), ("llama", "qk"), ("falcon", "ov"), ("gpt2", "ov"),
                                            ("gemma2", "qk")])
def test_head_circuit_equals_full_matrix(tiny_cache, family, circuit):
    """Top pairs of the streamed low-rank product equal those of the full [V, V] matrix."""
    b = tiny(tiny_cache, family)
    v = block_view(b, 1)
    h = v.n_heads - 1
    E = b.W_E.float() * b.embed_scale
    if circuit == "ov":
        Wv, Wo = v.W_OV(h)
        M = (E @ Wv.float() @ Wo.float()) @ vs.readout(b, True).t()
    else:
        Wq, Wk = v.W_QK(h)
        M = (E @ Wq.float()) @ (E @ Wk.float()).t() / v.d_head ** 0.5
    res = vs.head_circuit(b, 1, h, circuit=circuit, k=10, chunk_rows=7)
    top = torch.topk(M.flatten(), 10)
    V = M.shape[1]
    torch.testing.assert_close(res.scores, top.values, rtol=1e-4, atol=1e-6)
    assert (res.src_ids * V + res.tgt_ids).tolist() == top.indices.tolist()
    assert res.kv_head == v.kv_head(h)
    assert res.self_top1_fraction == pytest.approx(float((M.argmax(1) == torch.arange(V)).float().mean()))


def test_bad_parameters(tiny_cache):
    b = tiny(tiny_cache, "llama")
    with pytest.raises(BadInput, match="block 2 is out of range"):
        vs.project_vectors(b, [2], [0])
    with pytest.raises(BadInput, match="neuron 96 is out of range"):
        vs.project_vectors(b, [0], [96])
    with pytest.raises(BadInput, match="head 4 is out of range"):
        vs.head_circuit(b, 0, 4)
    with pytest.raises(BadInput, match="`k`"):
        vs.project_vectors(b, [0], [0], k=0)
    with pytest.raises(BadInput):
        vs.search_token(b, 10_000)
    for bad in (0, 2.0, True, "3"):
        with pytest.raises(BadInput, match="`k`"):
            vs.search_token(b, 3, k=bad)
    with pytest.raises(BadInput, match="no token"):
        vs.search_tokens(b, [])
    with pytest.raises(BadInput, match="apply_norm_gain"):
        vs.search_token(b, 3, stats=vs.value_stats(b, apply_norm_gain=False))
    for kw in ({"n": 0}, {"per_block": 0}, {"max_per_block": 0}, {"k": 10_000}, {"n": 2.5}):
        with pytest.raises(BadInput):
            vs.interpretable_vectors(b, **kw)
    with pytest.raises(BadInput, match="position 9"):
        vs.explain(b, ids(1, 5)[0], position=9)


# ---------------------------------------------------------------------------------------------- explain
@pytest.mark.parametrize("family", ADDITIVE)
def test_explanation_sums_to_logit_difference(tiny_cache, family):
    b = tiny(tiny_cache, family)
    x = ids(1, 9, seed=4)[0]
    e = vs.explain(b, x, position=6, token_id=5, k=3, n_sub=4)
    scale = max(1.0, abs(e.logit_diff_model))
    assert abs(e.logit_diff_sum - e.logit_diff_model) <= 1e-4 * scale
    assert abs(e.logit_target_sum - e.logit_target_model) <= 1e-4 * max(1.0, abs(e.logit_target_model))
    assert e.resid_error <= 1e-5
    for ly in e.blocks:
        assert float(ly.head_dla.sum()) + ly.attn_bias_dla == pytest.approx(ly.attn_dla, abs=1e-5)
        assert ly.sub_update_error <= 1e-5
        assert len(ly.sub_updates) == 4 and len(ly.attn_top_ids) == 3
        dl = [abs(s.dla) for s in ly.sub_updates]
        assert dl == sorted(dl, reverse=True)
    # the log-prob changes telescope from the lens at layer 0 to the model's own log-prob
    with torch.no_grad():
        resid, logits = b.residual_stream(x[None])
        lp0 = torch.log_softmax(b.unembedding(resid[0, 0, 6]).float(), -1)
    lpL = torch.log_softmax(logits[0, 6], -1)
    steps = sum(ly.attn_dlogprob_token + ly.mlp_dlogprob_token for ly in e.blocks)
    assert steps == pytest.approx(float(lpL[5] - lp0[5]), abs=1e-4)
    assert e.token_logprob == pytest.approx(float(lpL[5]), abs=1e-5)


def test_explanation_target_and_contrast(tiny_cache):
    b = tiny(tiny_cache, "llama")
    x = ids(1, 6)[0]
    e = vs.explain(b, x)
    with torch.no_grad():
        _, logits = b.residual_stream(x[None])
    top2 = torch.topk(logits[0, -1], 2).indices.tolist()
    assert (e.top1, e.target, e.contrast, e.token) == (top2[0], top2[0], top2[1], None)
    assert e.logit_diff_model == pytest.approx(float(logits[0, -1, top2[0]] - logits[0, -1, top2[1]]), abs=1e-5)
    e2 = vs.explain(b, x, token_id=top2[1] + 1 if top2[1] + 1 != top2[0] else 0)
    assert e2.contrast == top2[0]


def test_explanation_softcap_before_cap(tiny_cache):
    b = tiny(tiny_cache, "gemma2")  # final softcap 5.0
    e = vs.explain(b, ids(1, 6)[0])
    assert e.softcap == 5.0
    with torch.no_grad():
        _, logits = b.residual_stream(ids(1, 6))
    capped = 5.0 * torch.tanh(torch.tensor([e.logit_target_model]) / 5.0)
    assert float(capped) == pytest.approx(float(logits[0, -1, e.target]), abs=1e-5)


def test_explain_and_settle_skip_padding_rows():
    """The last rows are padding (beyond the tokenizer) and dominate the logits at the explained
    position: the real top-1 skips them, log-probabilities still normalize over all V rows."""
    from dataclasses import replace

    b = Borders.from_model(make_tiny("llama"))
    pad = 3
    real = b.vocab_size - pad
    x = ids(1, 6, seed=1)[0] % real
    with torch.no_grad():
        _, logits = b.residual_stream(x[None])
        top = int(logits[0, -1].argmax())
        b.unembedding.weight[-pad:] = 3.0 * b.unembedding.weight[top]  # unused as inputs (ids < real), so only the head changes
    b = replace(b, tokenizer_vocab_size=real)
    with torch.no_grad():
        resid, logits = b.residual_stream(x[None])
    lpL = torch.log_softmax(logits[0, -1].float(), -1)
    assert int(lpL.argmax()) >= real  # a padding row wins: the case under test
    e = vs.explain(b, x)
    assert e.top1 == int(lpL[:real].argmax()) and e.top1 < real
    assert e.top1_logprob == pytest.approx(float(lpL[e.top1]), abs=1e-5)
    rows = ids(2, 7, seed=3) % real
    res = vs.settle(b, rows, thresholds=(0.5,))
    with torch.no_grad():
        resid, logits = b.residual_stream(rows)
    lp = torch.stack([torch.log_softmax(b.unembedding(resid[i]).float(), -1) for i in range(b.n_layers + 1)])
    conf = lp[..., :real].max(-1).values.exp().reshape(b.n_layers + 1, -1)
    hit = conf >= 0.5
    hit[-1] = True
    assert res.exits[0].mean_exit_layer == pytest.approx(float(hit.int().argmax(0).float().mean()))
    assert float(res.top1_agreement[-1]) == 1.0


# ---------------------------------------------------------------------------------------------- settle
class _Shift:
    """A translator that adds a fixed vector (checks that settle uses it)."""

    def __init__(self, d):
        self.v = torch.randn(d, generator=torch.Generator().manual_seed(0)) * 50

    def translate(self, layer, h):
        return h + self.v


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_settle_matches_brute_force(tiny_cache, family):
    b = tiny(tiny_cache, family)
    rows = ids(3, 12, seed=2)
    res = vs.settle(b, [rows[:2], rows[2:]], thresholds=(0.05, 0.2, 1.0))
    res1 = vs.settle(b, rows, thresholds=(0.05, 0.2, 1.0), min_layer=1)
    assert torch.equal(res1.settle_layer, res.settle_layer)
    L = b.n_layers
    with torch.no_grad():
        resid, logits = b.residual_stream(rows)
    lp = torch.stack([torch.log_softmax(b.unembedding(resid[i]).float(), -1) for i in range(L + 1)])  # [L+1,B,T,V]
    top1 = lp.argmax(-1).reshape(L + 1, -1)
    conf = lp.max(-1).values.exp().reshape(L + 1, -1)
    final = logits.argmax(-1).reshape(-1)
    assert torch.equal(top1[L], final)
    expect = []
    for j in range(top1.shape[1]):
        s = L
        while s > 0 and top1[s - 1, j] == final[j]:
            s -= 1
        expect.append(s)
    assert res.settle_layer.tolist() == expect
    assert int(res.histogram.sum()) == res.n_positions == 36
    assert float(res.settled_fraction[-1]) == 1.0
    for m, ex in [(0, x) for x in res.exits] + [(1, x) for x in res1.exits]:
        hit = conf >= ex.threshold
        hit[:m] = False
        hit[L] = True
        e = hit.int().argmax(0)
        assert int(e.min()) >= m
        assert ex.mean_exit_layer == pytest.approx(float(e.float().mean()))
        assert ex.agreement == pytest.approx(float((top1.gather(0, e[None])[0] == final).float().mean()))
        assert ex.saved_block_fraction == pytest.approx(float(((L - e) / L).float().mean()))
    never = res.exits[-1]  # threshold 1.0: (almost) never exits early -> full agreement, no blocks saved
    if never.mean_exit_layer == L:
        assert never.agreement == 1.0 and never.saved_block_fraction == 0.0
        # paying a lens read at each of the L checked layers and saving nothing is a net loss
        assert never.saved_flops_fraction == pytest.approx(-L * res.head_flops / (L * res.block_flops + res.head_flops))


def test_settle_with_translator_and_bad_input(tiny_cache):
    b = tiny(tiny_cache, "llama")
    rows = ids(2, 8)
    plain = vs.settle(b, rows)
    tuned = vs.settle(b, rows, translator=_Shift(b.d_model))
    assert tuned.kind == "tuned" and plain.kind == "logit"
    assert torch.equal(tuned.top1_agreement[-1], plain.top1_agreement[-1])  # layer L is never translated
    assert not torch.equal(tuned.top1_agreement[:-1], plain.top1_agreement[:-1])
    with pytest.raises(BadInput, match="thresholds"):
        vs.settle(b, rows, thresholds=(0.0,))
    with pytest.raises(BadInput, match="min_layer"):
        vs.settle(b, rows, min_layer=3)
    with pytest.raises(BadInput, match="empty"):
        vs.settle(b, [torch.zeros(0, 4, dtype=torch.long)])


@pytest.mark.slow
# ---------------------------------------------------------------------------------------------- real model
def test_known_value_vectors_smollm2(smollm2):
    """SmolLM2-135M: neuron 935 of block 22 writes number words; 219 of block 24 days and months."""
    b, tok = smollm2.borders, smollm2.tokenizer
    res = vs.project_vectors(b, [22, 24, 26], [935, 219, 390], k=10)
    words = [[tok.decode([i]) for i in row] for row in res.top_ids.tolist()]
    numbers = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
    assert sum(w.strip().lower() in numbers for w in words[0]) >= 9, words[0]
    assert words[0][:3] == [" two", " three", " four"]
    dates = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january",
             "february", "march", "april", "may", "june", "july", "august", "september", "october",
             "november", "december", "yesterday"}
    assert sum(w.strip().lower() in dates for w in words[1]) >= 5, words[1]
    assert sum(w.strip().lower() in numbers for w in words[2]) >= 7, words[2]


@pytest.mark.slow
def test_reverse_search_finds_themed_neurons_smollm2(smollm2):
    """Issue 15: ranked by the raw logit, block 29 neuron 645 (top tokens 'Intf', 'firehose' ...) came
    first for ' Monday' and ' France'. Ranked by z-score, the first row serves its target's theme."""
    b, tok = smollm2.borders, smollm2.tokenizer
    probes = [" Monday", " three", " France", " red"]
    tids = [tok(p, add_special_tokens=False).input_ids for p in probes]
    assert all(len(x) == 1 for x in tids)
    found = vs.search_tokens(b, [x[0] for x in tids], k=3)
    firsts = [(int(s.promote_blocks[0]), int(s.promote_neurons[0])) for s in found]
    tops = vs.project_vectors(b, [f[0] for f in firsts], [f[1] for f in firsts], k=8)
    words = [[tok.decode([i]).strip().lower() for i in row] for row in tops.top_ids.tolist()]
    days = {"day", "days", "week", "weeks", "weekend", "monday", "tuesday", "morning", "night", "month"}
    numbers = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
    assert days & set(words[0]), words[0]
    assert numbers & set(words[1]), words[1]
    assert firsts[1] == (22, 935)  # the number-word neuron of test_known_value_vectors_smollm2
    assert (29, 645) not in firsts
    # each first row holds its target high among its own logits, far above the old first row (rank 41,868)
    assert all(int(s.promote_ranks[0]) < 500 for s in found), [int(s.promote_ranks[0]) for s in found]


@pytest.mark.slow
def test_interpretable_vectors_smollm2(smollm2):
    """The best vector's top tokens stand far out of its own logits (the stated criterion) and are one
    word in several spellings (block 29 neuron 250: ' with' 'with' ' With' 'With' ' WITH' ...)."""
    from collections import Counter

    res = vs.interpretable_vectors(smollm2.borders, n=6, per_block=8, k=8, max_per_block=2)
    assert len(res.vectors.blocks) == 6 and res.n_candidates == 240
    assert float(res.top_z[0]) > 10.0 and res.top_z.tolist() == sorted(res.top_z.tolist(), reverse=True)
    forms = Counter(smollm2.tokenizer.decode([i]).strip().lower() for i in res.vectors.top_ids[0].tolist())
    assert forms.most_common(1)[0][1] >= 5, forms
    assert max(res.vectors.blocks.tolist().count(x) for x in set(res.vectors.blocks.tolist())) <= 2


@pytest.fixture(scope="module")
def france(smollm2):
    ids_ = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    return vs.explain(smollm2.borders, ids_, k=5, n_sub=5)


@pytest.mark.slow
def test_capital_of_france_sums_to_logit_difference(smollm2, france):
    e = france
    tok = smollm2.tokenizer
    assert tok.decode([e.top1]) == " Paris"
    assert e.target == e.top1 and e.contrast != e.top1
    # stated tolerance: 1e-3 logits (float32 over 30 layers of a 576-wide stream)
    assert abs(e.logit_diff_sum - e.logit_diff_model) <= 1e-3
    assert abs(e.logit_target_sum - e.logit_target_model) <= 1e-3
    parts = e.embed_dla + e.const_dla + sum(ly.attn_dla + ly.mlp_dla for ly in e.blocks)
    assert parts == pytest.approx(e.logit_diff_model, abs=1e-3)
    assert e.logit_diff_model > 0
    assert len(e.blocks) == 30 and all(ly.head_dla.shape == (9,) for ly in e.blocks)


def _patch_model(monkeypatch, lm):
    import vocablens.cli.vocab_space as cvs

    monkeypatch.setattr(cvs, "load_model", lambda *a, **kw: lm)


@pytest.mark.slow
def test_cli_explain_json(smollm2, monkeypatch, capsys):
    from vocablens.cli.common import run_app

    _patch_model(monkeypatch, smollm2)
    rc = run_app(["explain", "The capital of France is", "--token", " Rome", "-k", "3", "--subs", "2", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out)
    assert d["top1"] == " Paris" and d["token"] == " Rome" and d["target"] == " Rome" and d["contrast"] == " Paris"
    assert abs(d["logit_diff_sum"] - d["logit_diff_model"]) <= 1e-3
    assert d["logit_diff_model"] < 0
    assert len(d["blocks"]) == 30 and len(d["blocks"][0]["sub_updates"]) == 2
    assert "linearized" in d["approximation"]


@pytest.mark.slow
def test_cli_project_json(smollm2, monkeypatch, capsys):
    from vocablens.cli.common import run_app

    _patch_model(monkeypatch, smollm2)
    assert run_app(["project", "--block", "22", "--neuron", "935", "-k", "4", "--json"]) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert d["vectors"][0]["top_tokens"] == [" two", " three", " four", "two"] and d["vectors"][0]["block"] == 22
    assert cap.err == ""
    # --layer still works as a deprecated alias of --block, with one note on stderr
    assert run_app(["project", "--layer", "22", "--neuron", "935", "-k", "4", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == d
    assert "deprecated" in cap.err and "--block" in cap.err and len(cap.err.strip().splitlines()) == 1
    assert run_app(["project", "--token", " three", "-k", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["promote"][0]["block"], d["promote"][0]["neuron"]) == (22, 935)
    assert d["promote"][0]["target"] == " three" and "z-score" in d["criterion"]
    assert run_app(["project", "--token", " Monday", "--token", " three", "-k", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["target"] for r in d["promote"]] == [" Monday", " Monday", " three", " three"]
    assert d["tokens"] == [" Monday", " three"] and all(len(r["top_tokens"]) == 8 for r in d["suppress"])
    assert run_app(["project", "--block", "3", "--head", "2", "--max-sources", "256", "-k", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_head"] == 0 and len(d["pairs"]) == 3 and d["n_sources"] == 256
    assert run_app(["project", "--block", "5", "--sample", "2", "-k", "2", "--keys", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "key" and [v["block"] for v in d["vectors"]] == [5, 5]
    assert all(len(v["top_tokens"]) == 2 for v in d["vectors"])
    assert run_app(["project", "--interpretable", "3", "--sample", "4", "-k", "5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "interpretable" and len(d["vectors"]) == 3 and "4 per block" in d["criterion"]
    assert all(len(v["top_tokens"]) == 5 and v["top_z"] > 0 for v in d["vectors"])


@pytest.mark.parametrize("argv,msg", [
    (["project", "--block", "30", "--neuron", "0"], "block 30 is out of range"),
    (["project", "--block", "0", "--neuron", "1536"], "neuron 1536 is out of range"),
    (["project", "--block", "0", "--head", "9"], "head 9 is out of range"),
    (["project", "--head", "1"], "--head needs --block"),
    (["project", "--block", "1", "--layer", "2", "--neuron", "0"], "disagree"),
    (["project", "--token", " three", "--interpretable", "3"], "give one of"),
    (["project", "--token", " Ouagadougou"], "is 6 tokens"),
    (["explain", "The capital of France is", "--token", " Ouagadougou"], "give a single token"),
    (["explain", "The capital of France is", "--position", "40"], "position 40"),
])
def test_cli_bad_input_exit_2(smollm2, monkeypatch, capsys, argv, msg):
    from vocablens.cli.common import run_app

    _patch_model(monkeypatch, smollm2)
    assert run_app(argv) == 2
    cap = capsys.readouterr()
    assert msg in cap.err and "Traceback" not in cap.err and cap.out == ""


@pytest.mark.slow
def test_cli_moe_exit_2(smollm2, monkeypatch, capsys, tiny_cache):
    from vocablens.cli.common import run_app
    from vocablens.handle import Model

    b = tiny(tiny_cache, "mixtral")
    _patch_model(monkeypatch, Model(b.model, smollm2.tokenizer, b, smollm2.provenance))
    assert run_app(["project", "--block", "0", "--neuron", "1"]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture 'mixtral'" in err and "mixture-of-experts" in err


@pytest.mark.slow
def test_cli_settle_tiny_corpus(smollm2, monkeypatch, capsys, tmp_path):
    from vocablens.cli.common import run_app

    _patch_model(monkeypatch, smollm2)
    plot = tmp_path / "settle.html"
    rc = run_app(["settle", "--corpus", "pydoc-topics", "--max-tokens", "32", "--seq-len", "16",
                  "--thresholds", "0.5,0.9", "--plot", str(plot), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out)
    assert d["n_positions"] == 32 and d["n_layers"] == 30 and sum(d["histogram"]) == 32
    assert [x["threshold"] for x in d["exits"]] == [0.5, 0.9]
    assert d["top1_agreement"][-1] == 1.0
    # a lens read costs 2·V·d = 56.6 MFLOP on SmolLM2, more than 8 blocks: early exit loses FLOPs
    assert d["head_flops"] == 2 * 49152 * 576
    assert all(x["saved_flops_fraction"] < x["saved_block_fraction"] for x in d["exits"])
    assert plot.exists() and "plotly" in plot.read_text()[:5000].lower()
    # never overwrite without --force
    assert run_app(["settle", "--corpus", "pydoc-topics", "--max-tokens", "32", "--seq-len", "16",
                    "--plot", str(plot)]) == 2
    assert "exists" in capsys.readouterr().err


@pytest.mark.slow
def test_report_sections(smollm2, france, tiny_cache):
    from vocablens.render import vocab_space as rv
    from vocablens.render.html import Section

    b, tok = smollm2.borders, smollm2.tokenizer
    sample = vs.project_vectors(b, [22], [935], k=5)
    s1 = rv.value_vectors_section(sample, tok)
    s2 = rv.explanation_section(france, tok, "The capital of France is")
    st = vs.settle(tiny(tiny_cache, "llama"), ids(2, 8), thresholds=(0.5, 0.9))
    s3 = rv.settle_section(st)
    assert all(isinstance(s, Section) for s in (s1, s2, s3))
    assert "&#x27; three&#x27;" in s1.html or "' three'" in s1.html
    assert "Paris" in s2.html and f"{france.logit_diff_model:.4f}" in s2.html
    found = vs.search_tokens(b, [tok(" three", add_special_tokens=False).input_ids[0]], k=2)
    L, N = rv.search_vectors(found)
    interp = vs.interpretable_vectors(b, n=2, per_block=2, k=4)
    s4 = rv.value_vectors_report_section(found, vs.project_vectors(b, L, N, k=8), interp, tok)
    assert s4.id == "value-vectors" and "z-score" in s4.html and "2 per block" in s4.html
    assert s4.html.count("<tr>") >= 2 + 2 + 2  # header rows + 2 probe rows + 2 interpretable rows
    assert 'data-figure="settle-curve"' in s3.html


@pytest.mark.slow
def test_tuned_lens_wiring(smollm2):
    """``--lens tuned`` reads the model's shipped tuned lens (vocablens.Model.translator)."""
    t = smollm2.translator("tuned")
    h = torch.randn(3, smollm2.borders.d_model)
    assert t.translate(5, h).shape == (3, smollm2.borders.d_model)
    assert smollm2.translator("logit") is None


@pytest.mark.slow
def test_token_id_is_the_one_way_to_a_token(smollm2):
    tok = smollm2.tokenizer
    assert tok.decode([smollm2.token_id(" Paris")]) == " Paris"
    with pytest.raises(TokenNotInVocabulary, match="is 6 tokens"):
        smollm2.token_id(" Ouagadougou")
