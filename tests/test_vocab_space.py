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
    torch.testing.assert_close((lin.linear(u) * r).sum(-1), (lin.readout(r) * u).sum(-1), rtol=1e-5, atol=1e-5)


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
    direct = (h @ b.W_U.float().t()) * b.logit_scale
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


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "falcon"])
def test_search_token_equals_brute_force(tiny_cache, family):
    b = tiny(tiny_cache, family)
    t = 11
    gain_res = vs.search_token(b, t, k=6)
    R = vs._Readout.of(b, True)
    allv = torch.cat([v.W_out.detach().float() @ R.U[t] for v in block_views(b)])
    d_ff = block_view(b, 0).d_ff
    top = torch.topk(allv, 6)
    bot = torch.topk(allv, 6, largest=False)
    torch.testing.assert_close(gain_res.promote_scores, top.values)
    torch.testing.assert_close(gain_res.suppress_scores, bot.values)
    assert (gain_res.promote_layers * d_ff + gain_res.promote_neurons).tolist() == top.indices.tolist()


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
        M = vs._Readout.of(b, True).scores(E @ Wv.float() @ Wo.float())
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
    with pytest.raises(BadInput, match="layer 2 is out of range"):
        vs.project_vectors(b, [2], [0])
    with pytest.raises(BadInput, match="neuron 96 is out of range"):
        vs.project_vectors(b, [0], [96])
    with pytest.raises(BadInput, match="head 4 is out of range"):
        vs.head_circuit(b, 0, 4)
    with pytest.raises(BadInput, match="-k"):
        vs.project_vectors(b, [0], [0], k=0)
    with pytest.raises(BadInput):
        vs.search_token(b, 10_000)
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
    for ly in e.layers:
        assert float(ly.head_dla.sum()) + ly.attn_bias_dla == pytest.approx(ly.attn_dla, abs=1e-5)
        assert ly.sub_update_error <= 1e-5
        assert len(ly.sub_updates) == 4 and len(ly.attn_top_ids) == 3
        dl = [abs(s.dla) for s in ly.sub_updates]
        assert dl == sorted(dl, reverse=True)
    # the log-prob changes telescope from the lens at layer 0 to the model's own log-prob
    with torch.no_grad():
        resid, logits = b.residual_stream(x[None])
        lp0 = torch.log_softmax(b.unembed(resid[0, 0, 6]).float(), -1)
    lpL = torch.log_softmax(logits[0, 6], -1)
    steps = sum(ly.attn_dlogprob_token + ly.mlp_dlogprob_token for ly in e.layers)
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
    lp = torch.stack([torch.log_softmax(b.unembed(resid[i]).float(), -1) for i in range(L + 1)])  # [L+1,B,T,V]
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
    # and the reverse search finds the number neuron first for " three"
    three = tok(" three", add_special_tokens=False).input_ids
    assert len(three) == 1
    s = vs.search_token(b, three[0], k=3)
    assert (int(s.promote_layers[0]), int(s.promote_neurons[0])) == (22, 935)


@pytest.fixture(scope="module")
def france(smollm2):
    ids_ = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    return vs.explain(smollm2.borders, ids_, k=5, n_sub=5)


def test_capital_of_france_sums_to_logit_difference(smollm2, france):
    e = france
    tok = smollm2.tokenizer
    assert tok.decode([e.top1]) == " Paris"
    assert e.target == e.top1 and e.contrast != e.top1
    # stated tolerance: 1e-3 logits (float32 over 30 layers of a 576-wide stream)
    assert abs(e.logit_diff_sum - e.logit_diff_model) <= 1e-3
    assert abs(e.logit_target_sum - e.logit_target_model) <= 1e-3
    parts = e.embed_dla + e.const_dla + sum(ly.attn_dla + ly.mlp_dla for ly in e.layers)
    assert parts == pytest.approx(e.logit_diff_model, abs=1e-3)
    assert e.logit_diff_model > 0
    assert len(e.layers) == 30 and all(ly.head_dla.shape == (9,) for ly in e.layers)


def _patch_model(monkeypatch, lm):
    import vocablens.cli.vocab_space as cvs

    monkeypatch.setattr(cvs, "load_model", lambda *a, **kw: lm)


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
    assert len(d["layers"]) == 30 and len(d["layers"][0]["sub_updates"]) == 2
    assert "linearized" in d["approximation"]


def test_cli_project_json(smollm2, monkeypatch, capsys):
    from vocablens.cli.common import run_app

    _patch_model(monkeypatch, smollm2)
    assert run_app(["project", "--layer", "22", "--neuron", "935", "-k", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["vectors"][0]["top_tokens"] == [" two", " three", " four", "two"]
    assert run_app(["project", "--token", " three", "-k", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["promote"][0]["layer"], d["promote"][0]["neuron"]) == (22, 935)
    assert run_app(["project", "--layer", "3", "--head", "2", "--max-sources", "256", "-k", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_head"] == 0 and len(d["pairs"]) == 3 and d["n_sources"] == 256
    assert run_app(["project", "--layer", "5", "--sample", "2", "-k", "2", "--keys", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "key" and [v["layer"] for v in d["vectors"]] == [5, 5]
    assert all(len(v["top_tokens"]) == 2 for v in d["vectors"])


@pytest.mark.parametrize("argv,msg", [
    (["project", "--layer", "30", "--neuron", "0"], "layer 30 is out of range"),
    (["project", "--layer", "0", "--neuron", "1536"], "neuron 1536 is out of range"),
    (["project", "--layer", "0", "--head", "9"], "head 9 is out of range"),
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


def test_cli_moe_exit_2(smollm2, monkeypatch, capsys, tiny_cache):
    from vocablens.cli.common import run_app
    from vocablens.models import LoadedModel

    b = tiny(tiny_cache, "mixtral")
    _patch_model(monkeypatch, LoadedModel(b.model, smollm2.tokenizer, b, smollm2.provenance))
    assert run_app(["project", "--layer", "0", "--neuron", "1"]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture 'mixtral'" in err and "mixture-of-experts" in err


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
    assert 'data-figure="settle-curve"' in s3.html


def test_tuned_lens_wiring(smollm2):
    """``--lens tuned`` uses vocablens.lens.tuned only when it is importable, else a clear error."""
    import importlib.util

    from vocablens.cli.vocab_space import load_translator

    if importlib.util.find_spec("vocablens.lens.tuned") is None:
        with pytest.raises(BadInput, match="vocablens.lens.tuned"):
            load_translator(smollm2.borders, "smollm2")
    else:
        try:
            t = load_translator(smollm2.borders, "smollm2")
        except BadInput as exc:  # no lens shipped for the model: the message says what to give
            assert "lens" in str(exc)
        else:
            h = torch.randn(3, smollm2.borders.d_model)
            assert t.translate(5, h).shape == (3, smollm2.borders.d_model)


def test_single_token_helper(smollm2):
    from vocablens.cli.vocab_space import _single_token

    tok, V = smollm2.tokenizer, smollm2.borders.vocab_size
    assert tok.decode([_single_token(tok, " Paris", V)]) == " Paris"
    with pytest.raises(TokenNotInVocabulary, match="is 6 tokens"):
        _single_token(tok, " Ouagadougou", V)
