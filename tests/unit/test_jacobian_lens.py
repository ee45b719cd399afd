"""The Jacobian lens: the fit against a direct autograd Jacobian, the published format, refusals.

The oracle (:func:`oracle_J`) is independent of the fitting code: it replaces the stream at layer l by
the function's input with a plain forward hook and asks ``torch.autograd.functional.jacobian`` for the
whole [T, d, T, d] Jacobian of h_L, then sums and averages it over the valid positions by the
definition (Gurnee et al. 2026; TransformerLens 4.3's docstring formula).
"""

from __future__ import annotations

import json

import pytest
import torch

import tiny_models as tm
from vocablens.errors import BadInput, CheckpointMismatch, CorruptModelFile, OutputExists
from vocablens.lens.jacobian import JacobianLens, find_jacobian_lens, load_published
from vocablens.lens.jacobian_fit import JacobianFitSettings, fit_jacobian_lens, jacobian_sums
from vocablens.models import Borders


def _tiny64(family="llama"):
    model = tm.make_tiny(family).double()
    return model, Borders.from_model(model)


def oracle_J(model, b: Borders, ids: torch.Tensor, layer: int, skip_first: int) -> torch.Tensor:
    """(1/|P|) Σ_p Σ_p' ∂h_L[p']/∂h_l[p] for one prompt ids [T], by torch.autograd.functional.jacobian."""
    T = ids.numel()
    with torch.no_grad():
        resid, _ = b.residual_stream(ids[None])
    h_l = resid[layer, 0].clone()
    L = b.n_layers

    def f(h):  # [T, d] stream at `layer` -> [T, d] stream at L
        out = {}

        def put_pre(_m, args, kwargs):
            if args:
                return (h[None], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": h[None]}

        def put_post(_m, _a, o):
            return (h[None], *o[1:]) if isinstance(o, tuple) else h[None]

        def take(_m, _a, o):
            out["L"] = o[0] if isinstance(o, tuple) else o

        hs = [b.blocks[0].register_forward_pre_hook(put_pre, with_kwargs=True) if layer == 0
              else b.blocks[layer - 1].register_forward_hook(put_post),
              b.blocks[L - 1].register_forward_hook(take)]
        try:
            model(input_ids=ids[None], use_cache=False)
        finally:
            for x in hs:
                x.remove()
        return out["L"][0]

    jac = torch.autograd.functional.jacobian(f, h_l)  # [T, d, T, d]: [p', i, p, j]
    P = list(range(skip_first, T - 1))
    sub = jac[P][:, :, P]  # [P', d, P, d]
    return sub.sum(dim=0).mean(dim=1)  # Σ over targets p', mean over sources p -> [d, d] (i, j)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_fit_equals_autograd_jacobian_on_a_tiny_model(family):
    model, b = _tiny64(family)
    prompts = tm.ids(batch=3, T=8, seed=5)
    skip = 2
    lens = fit_jacobian_lens(b, prompts, JacobianFitSettings(skip_first=skip, dim_batch=5, prompt_batch=2))
    assert lens.layers == list(range(b.n_layers)) and lens.settings["n_prompts"] == 3
    for layer in range(b.n_layers):
        ref = sum(oracle_J(model, b, prompts[i], layer, skip) for i in range(3)) / 3
        got = lens.matrix(layer).double()
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4), (layer, float((got - ref).abs().max()))
    # the cross-position terms count: the per-position-only (diagonal) estimator differs
    assert not torch.allclose(lens.matrix(0).double(), torch.eye(b.d_model, dtype=torch.float64), atol=1e-2)


def test_sums_do_not_depend_on_dim_batch_and_leave_the_model_as_found():
    model, b = _tiny64()
    ids = tm.ids(batch=2, T=6, seed=2)
    flags = [p.requires_grad for p in model.parameters()]
    hooks = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]
    a = jacobian_sums(b, ids, [0, 1], skip_first=1, dim_batch=1)
    c = jacobian_sums(b, ids, [0, 1], skip_first=1, dim_batch=64)
    assert torch.allclose(a, c, atol=1e-10)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()] == hooks
    # fitting one upper layer roots the graph there and gives the same matrix
    upper = jacobian_sums(b, ids, [1], skip_first=1, dim_batch=7)
    assert torch.allclose(upper[0], a[1], atol=1e-10)


def test_translator_reads_layer_L_as_the_model_and_J_identity_is_the_logit_lens():
    from vocablens.lens.logit import logit_lens

    model = tm.make_tiny("llama")
    b = Borders.from_model(model)
    ident = JacobianLens(torch.eye(b.d_model).repeat(b.n_layers, 1, 1), list(range(b.n_layers)), b.n_layers)
    ids = tm.ids(batch=1, T=7, seed=4)[0]
    lg = logit_lens(b, ids, positions="all")
    jl = logit_lens(b, ids, positions="all", translator=ident, kind="jacobian")
    assert jl.kind == "jacobian"
    for x, y in zip(lg.layers, jl.layers):
        assert torch.allclose(x.kl_to_final, y.kl_to_final, atol=1e-5)
    assert float(jl.layers[-1].kl_to_final.abs().max()) < 1e-5 and jl.model_max_abs_diff < 1e-5


def _reference_save(path, J: dict, n_prompts: int, d_model: int, metadata=None):
    """The reference code's own save format (anthropics/jacobian-lens JacobianLens.save): a dict
    saved with torch.save, J stored in float16."""
    payload = {"J": {layer: m.to(torch.float16) for layer, m in J.items()}, "n_prompts": n_prompts,
               "source_layers": sorted(J), "d_model": d_model}
    if metadata:
        payload["metadata"] = metadata
    torch.save(payload, path)


def test_published_format_round_trip_and_layer_mapping(tmp_path):
    model = tm.make_tiny("llama")
    b = Borders.from_model(model)
    L, d = b.n_layers, b.d_model
    g = torch.Generator().manual_seed(0)
    J = {blk: torch.randn(d, d, generator=g) for blk in range(L - 1)}  # block outputs 0..L-2
    _reference_save(tmp_path / "lens.pt", J, 7, d)
    lens = JacobianLens.load(tmp_path / "lens.pt", b)  # the file
    assert lens.layers == [blk + 1 for blk in range(L - 1)]  # block l = our stream layer l+1
    assert torch.equal(lens.matrix(1), J[0].to(torch.float16).float())
    assert lens.settings["n_prompts"] == 7 and lens.settings["stored_dtype"] == "float16"
    assert find_jacobian_lens("x", tmp_path) == tmp_path / "lens.pt"  # a directory holding lens.pt
    # ours -> the published dict -> back, via the reference's key layout
    lens.save_published(tmp_path / "again.pt")
    obj = torch.load(tmp_path / "again.pt", weights_only=True)
    assert sorted(obj) == ["J", "d_model", "metadata", "n_prompts", "source_layers"]
    assert obj["source_layers"] == list(range(L - 1)) and obj["d_model"] == d
    back = load_published(tmp_path / "again.pt", b)
    assert torch.equal(back.J, lens.J)
    # ours: safetensors + JSON, stored float16
    lens.save(tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "jacobian.json").read_text())
    assert cfg["layers"] == lens.layers and cfg["fitting"]["stored_dtype"] == "float16"
    again = JacobianLens.load(tmp_path / "ours", b)
    assert torch.equal(again.J, lens.J) and again.layers == lens.layers
    with pytest.raises(OutputExists):
        lens.save(tmp_path / "ours")


def test_refusals(tmp_path):
    b = Borders.from_model(tm.make_tiny("llama"))
    L, d = b.n_layers, b.d_model
    _reference_save(tmp_path / "wide.pt", {0: torch.eye(d + 1)}, 1, d + 1)
    with pytest.raises(CheckpointMismatch, match="d_model"):
        load_published(tmp_path / "wide.pt", b)
    _reference_save(tmp_path / "deep.pt", {i: torch.eye(d) for i in range(L + 2)}, 1, d)
    with pytest.raises(CheckpointMismatch, match=rf"holds matrices for blocks 0..{L + 1} \(d_model={d}\); the "
                       rf"model has {L} blocks \(0..{L - 1}\)"):
        load_published(tmp_path / "deep.pt", b)
    _reference_save(tmp_path / "tl.pt", {0: torch.eye(d)}, 1, d, {"target_layer": L + 3})  # TL records the target
    with pytest.raises(CheckpointMismatch, match=f"records target_layer {L + 3} "):
        load_published(tmp_path / "tl.pt", b)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CorruptModelFile, match="not a Jacobian lens"):
        load_published(tmp_path / "other.pt", b)
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(CorruptModelFile):
        load_published(tmp_path / "junk.pt", b)
    other = Borders.from_model(tm.make_tiny("llama", seed=9))
    ours = JacobianLens(torch.eye(d).repeat(L, 1, 1), list(range(L)), L, {"unembed_sha256": other.unembedding.identity_hash()})
    with pytest.raises(CheckpointMismatch, match="another model"):
        ours.check_model(b)
    with pytest.raises(BadInput, match="no matrix for layer 0"):
        JacobianLens(torch.eye(d)[None], [1], L).translate(0, torch.zeros(d))
    with pytest.raises(BadInput, match="tokens"):
        fit_jacobian_lens(b, tm.ids(batch=1, T=5), JacobianFitSettings(skip_first=4))


def test_resume_continues_to_the_same_lens(tmp_path):
    model, b = _tiny64()
    prompts = tm.ids(batch=3, T=6, seed=8)
    s = JacobianFitSettings(skip_first=1, dim_batch=16)
    full = fit_jacobian_lens(b, prompts, s)

    def stop(p):  # interrupted inside the second prompt, after the first one's checkpoint
        if p.prompts_done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit_jacobian_lens(b, prompts, s, checkpoint_dir=tmp_path, on_progress=stop)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["n_done"] == 1
    resumed = fit_jacobian_lens(b, prompts, s, checkpoint_dir=tmp_path, resume=True)
    assert resumed.settings["n_prompts"] == 3
    assert torch.allclose(resumed.J, full.J, atol=1e-10)
    with pytest.raises(CheckpointMismatch, match="settings"):
        fit_jacobian_lens(b, prompts, JacobianFitSettings(skip_first=2, dim_batch=16), checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointMismatch, match="prompts"):
        fit_jacobian_lens(b, prompts[:2], s, checkpoint_dir=tmp_path, resume=True)


def test_cli_fit_read_and_refuse(tmp_path, capsys):
    """`lens fit-jacobian` then `lens --kind jacobian` on a tiny model directory; one-line refusals."""
    from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

    a = save_tiny(tmp_path / "a", tiny_tokenizer())
    corpus = tmp_path / "c.txt"
    corpus.write_text(("The value of x is a number. " * 30 + "\n") * 4)
    fit = ["lens", "fit-jacobian", "--corpus", str(corpus), "--out", str(tmp_path / "j"), "--seq-len", "8",
           "--skip-first", "2", "--max-tokens", "16", "--dim-batch", "64", "-m", str(a)]
    code, out, err = run_cli(capsys, *fit)
    assert code == 0, err
    lens = JacobianLens.load(tmp_path / "j")
    assert lens.settings["n_prompts"] == 2 and lens.settings["data"]["corpus"] == "c.txt"
    code, out, err = run_cli(capsys, *fit)  # the lens is there: refused, nothing replaced
    assert code == 2 and "already holds a Jacobian lens" in err and "Traceback" not in err
    code, out, err = run_cli(capsys, "lens", "The value", "--kind", "logit,jacobian", "--lens", str(tmp_path / "j"),
                             "-m", str(a), "--json")
    d = json.loads(out)
    assert code == 0 and d["kind"] == "logit,jacobian" and d["jacobian"]["kind"] == "jacobian"
    assert d["lenses"][0]["kind"] == "jacobian" and d["lenses"][0]["n_prompts"] == 2
    assert d["jacobian"]["layers"][-1]["positions"][0]["kl_to_final"] < 1e-5  # layer L is the model's output
    _reference_save(tmp_path / "wide.pt", {0: torch.eye(8)}, 1, 8)
    for argv, msg in ((["--kind", "jacobian", "--lens", str(tmp_path / "wide.pt")], "d_model=8"),
                      (["--kind", "jacobian,bogus"], "--kind takes"),
                      (["--kind", "jacobian", "--lens", "nobody/nothing-cached"], "local cache")):
        code, out, err = run_cli(capsys, "lens", "The value", *argv, "-m", str(a))
        errors = [x for x in err.splitlines() if x.startswith("error")]
        assert code == 2 and len(errors) == 1 and msg in errors[0] and "Traceback" not in err, err
    code, out, err = run_cli(capsys, "lens", "backward", "The value", "--target", " is", "-m", str(a), "--json")
    assert code == 0 and json.loads(out)["kind"] == "backward", err
    code, out, err = run_cli(capsys, "lens", "backward", "The value", "--target", " is a number", "-m", str(a))
    assert code == 2 and "single token" in err


def test_hub_ids_resolve_from_the_local_cache_only(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    from vocablens.lens.tuned import find_lens

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    snap = tmp_path / "models--org--jlens" / "snapshots" / "abc123"
    (snap / "tiny").mkdir(parents=True)
    _reference_save(snap / "tiny" / "lens.pt", {0: torch.eye(4)}, 3, 4)
    assert find_jacobian_lens("x", "org/jlens/tiny/lens.pt") == snap / "tiny" / "lens.pt"
    assert find_jacobian_lens("x", "org/jlens/tiny") == snap / "tiny" / "lens.pt"
    tl = tmp_path / "spaces--org--tuned" / "snapshots" / "def456" / "lens" / "tiny"
    tl.mkdir(parents=True)
    (tl / "config.json").write_text('{"d_model": 4, "num_hidden_layers": 1}')
    torch.save({"0.weight": torch.zeros(4, 4), "0.bias": torch.zeros(4)}, tl / "params.pt")
    assert find_lens("x", "org/tuned/lens/tiny") == tl
    with pytest.raises(BadInput, match="local cache"):
        find_jacobian_lens("x", "org/missing/lens.pt")


def test_model_handle_fits_and_reads_the_jacobian_lens(tmp_path):
    from tiny_dirs import save_tiny, tiny_tokenizer

    import vocablens

    m = vocablens.load(str(save_tiny(tmp_path / "a", tiny_tokenizer())))
    (tmp_path / "c.txt").write_text(("The value of x is a number. " * 30 + "\n") * 4)
    lens = m.fit_jacobian_lens(str(tmp_path / "c.txt"), max_tokens=16, seq_len=8, out=tmp_path / "j",
                               settings=JacobianFitSettings(skip_first=2, dim_batch=64))
    assert lens.settings["n_prompts"] == 2 and (tmp_path / "j" / "jacobian.safetensors").exists()
    res = m.lens("The value", kind="logit,jacobian", positions="all")
    assert res.kinds == ["logit", "jacobian"]
    assert float(res[0, "jacobian"].layers[-1].kl_to_final.abs().max()) < 1e-5  # layer L: the model itself
    assert float(res[0, "jacobian"].layers[1].kl_to_final.sum()) != float(res[0, "logit"].layers[1].kl_to_final.sum())


@pytest.mark.parametrize("family", ["mixtral", "gemma2", "opt", "bloom", "gpt_neox", "falcon"])
def test_skipped_positions_in_the_cache_change_no_term(family, monkeypatch):
    """Positions < skip_first run into the key/value cache without grad (the backward passes skip
    them): by causality the sums equal those of the whole sequence in the graph (families with rotary,
    learned, ALiBi positions, sliding windows, a router; llama and gpt2 meet the autograd oracle)."""
    import vocablens.lens.stream_graph as sg

    model = tm.make_tiny(family)
    b = Borders.from_model(model)
    assert sg._cache_kwarg(model) is not None  # the cache path is the one taken
    ids = tm.ids(batch=2, T=7, seed=3)
    layers = list(range(b.n_layers))
    cached = jacobian_sums(b, ids, layers, skip_first=3, dim_batch=b.d_model)
    monkeypatch.setattr(sg, "_cache_kwarg", lambda _m: None)  # the whole sequence in the graph
    whole = jacobian_sums(b, ids, layers, skip_first=3, dim_batch=b.d_model)
    assert torch.allclose(cached, whole, atol=2e-5, rtol=1e-5), float((cached - whole).abs().max())
    assert float(whole.abs().max()) > 0.1
