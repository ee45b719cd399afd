"""Geometry: cosine neighbours over real tokens, multi-token queries, PCA properties, render, CLI."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tiny_models import make_tiny
from vocablens.cli.common import run_app
from vocablens.errors import BadInput, ShapeMismatch, TokenNotInVocabulary
from vocablens.geometry.embedding import (
    DEFAULT_WORD_GROUPS, cosine_neighbors, nearest_neighbors, pca_3d, word_pca,
)
from vocablens.models import Borders
from vocablens.models.tokens import token_str


class FakeTok:
    """A whitespace tokenizer over words w0..w{n-1}: enough for single_token_id and token_str."""

    def __init__(self, n):
        self.vocab = {f"w{i}": i for i in range(n)}
        self.inv = {i: w for w, i in self.vocab.items()}

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def __call__(self, text, add_special_tokens=False):
        class R:
            pass

        r = R()
        r.input_ids = [self.vocab[w] for w in text.split() if w in self.vocab]
        return r

    def decode(self, ids, **kw):
        return " ".join(self.inv.get(i, f"<pad{i}>") for i in ids)

    def convert_ids_to_tokens(self, i):
        return self.inv.get(i)


# ---------------------------------------------------------------------------------------- cosine
def test_cosine_neighbors_equals_reference():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(300, 16, generator=g)
    q = torch.randn(16, generator=g)
    ids, cos = cosine_neighbors(W, q, k=7)
    ref = F.cosine_similarity(W, q[None], dim=1)
    assert torch.equal(ids, ref.topk(7).indices)
    assert torch.allclose(cos, ref.topk(7).values, atol=1e-6)
    # mask and exclusions are honoured
    mask = torch.ones(300, dtype=torch.bool)
    mask[ids[:3]] = False
    ids2, _ = cosine_neighbors(W, q, k=7, mask=mask, exclude=[int(ids[3])])
    assert not set(ids2.tolist()) & set(ids[:4].tolist())
    assert ids2[0] == ids[4]


def test_cosine_neighbors_bf16_and_chunks():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(40_000, 8, generator=g)  # more rows than one chunk
    Wb = W.bfloat16()
    q = Wb[123].float()
    ids, cos = cosine_neighbors(Wb, q, k=3)
    assert ids[0] == 123 and cos.dtype == torch.float32 and cos[0] == pytest.approx(1.0, abs=1e-6)


def test_cosine_neighbors_errors():
    W = torch.randn(10, 4)
    with pytest.raises(ShapeMismatch):
        cosine_neighbors(W, torch.randn(5), k=1)
    with pytest.raises(BadInput):
        cosine_neighbors(W, torch.randn(4), k=0)
    with pytest.raises(BadInput):
        cosine_neighbors(W, torch.randn(4), k=10, exclude=[0])


# ---------------------------------------------------------------------------------------- real vocabulary only
def _tiny_with_padding():
    """Tiny untied llama (V=96) whose tokenizer has 80 tokens; rows 80.. are padding that copy the query's
    direction, and rows 60..69 are an untouched identical initialisation."""
    model = make_tiny("llama")
    with torch.no_grad():
        E, U = model.model.embed_tokens.weight, model.lm_head.weight
        E[80:] = E[5] * 1.5
        U[80:] = U[5] * 1.5
        E[60:70] = E[5] * 0.9 + 0.0  # identical rows, all pointing like the query
    b = replace(Borders.from_model(model), tokenizer_vocab_size=80)
    return model, b


def test_neighbors_exclude_padding_and_untrained_rows():
    model, b = _tiny_with_padding()
    tok = FakeTok(80)
    res = nearest_neighbors(b, tok, ["w5"], k=20)
    assert res.excluded == 16 + 10 and res.candidates == 96 - 26
    q = res.results[0]
    assert q.used == "token" and q.note is None and q.query_ids == (5,)
    assert [lst.matrix for lst in q.lists] == ["input", "output"]  # untied: both matrices
    for lst in q.lists:
        ids = set(lst.ids.tolist())
        assert not ids & set(range(80, 96)), "padding row returned"
        assert 5 not in ids
    assert not set(q.lists[0].ids.tolist()) & set(range(60, 70)), "never-trained row returned"
    # without the mask the padding rows would have won (cosine 1): the mask is what removed them
    raw_ids, raw_cos = cosine_neighbors(b.W_E, b.W_E[5], k=1, exclude=[5])
    assert int(raw_ids[0]) >= 60 and raw_cos[0] > 0.999
    # the output list is the head's own geometry
    ref, _ = cosine_neighbors(b.unembedding.weight, b.unembedding.weight[5], k=20, mask=b.real_token_mask(True), exclude=[5])
    assert torch.equal(q.lists[1].ids, ref)


def test_tied_model_searches_one_matrix():
    model = make_tiny("llama_tied")
    b = Borders.from_model(model)
    res = nearest_neighbors(b, FakeTok(96), ["w3", "w4"], k=5)
    assert res.tied and all(len(q.lists) == 1 for q in res.results)
    # the one list is the neighbours in transformers' own (tied) matrix, by plain float64 cosine
    E = model.get_output_embeddings().weight.detach().double()
    for q, i in zip(res.results, (3, 4)):
        ref = F.cosine_similarity(E, E[i][None], dim=1)
        ref[i] = -2.0  # the query itself is left out
        assert q.lists[0].ids.tolist() == ref.topk(5).indices.tolist()
        assert torch.allclose(q.lists[0].cosines.double(), ref.topk(5).values, atol=1e-6)


def test_multi_token_first_and_mean():
    b = Borders.from_model(make_tiny("llama_tied"))
    tok = FakeTok(96)
    first = nearest_neighbors(b, tok, ["w3 w7"], k=5).results[0]
    assert first.used == "first token" and "2 tokens" in first.note and "first token" in first.note
    ref, _ = cosine_neighbors(b.W_E, b.W_E[3], k=5, mask=b.real_token_mask(True), exclude=[3])
    assert torch.equal(first.lists[0].ids, ref)
    mean = nearest_neighbors(b, tok, ["w3 w7"], k=5, use_mean=True).results[0]
    assert mean.used == "mean of tokens" and "mean" in mean.note
    ref, _ = cosine_neighbors(b.W_E, (b.W_E[3] + b.W_E[7]) / 2, k=5, mask=b.real_token_mask(True), exclude=[3, 7])
    assert torch.equal(mean.lists[0].ids, ref)


def test_unknown_and_empty_tokens():
    b = Borders.from_model(make_tiny("llama_tied"))
    with pytest.raises(TokenNotInVocabulary):
        nearest_neighbors(b, FakeTok(96), ["zzz"], k=3)
    with pytest.raises(TokenNotInVocabulary):
        nearest_neighbors(b, FakeTok(96), [""], k=3)
    with pytest.raises(BadInput):
        nearest_neighbors(b, FakeTok(96), ["w1"], k=0)
    with pytest.raises(BadInput):
        nearest_neighbors(b, FakeTok(96), [], k=3)


# ---------------------------------------------------------------------------------------- real model
def test_king_neighbors_include_queen(smollm2):
    res = nearest_neighbors(smollm2.borders, smollm2.tokenizer, [" king"], k=10)
    q = res.results[0]
    toks = [token_str(smollm2.tokenizer, i) for i in q.lists[0].ids.tolist()]
    assert " queen" in toks and " King" in toks
    assert " king" not in toks
    assert res.tied and res.candidates == 49_152


def test_multi_token_string_on_real_model(smollm2):
    res = nearest_neighbors(smollm2.borders, smollm2.tokenizer, [" New York", "三"], k=5)
    ny, san = res.results
    a, b = ny.query_ids
    assert ny.used == "first token" and f"' New York' is 2 tokens [' New' ({a}), ' York' ({b})]" in ny.note
    # partial UTF-8 bytes are shown as bytes, not mojibake
    assert "<0xE4><0xB8>" in san.note


def test_word_pca_on_real_model(smollm2):
    wp = word_pca(smollm2.borders, smollm2.tokenizer)
    n = sum(len(v) for v in DEFAULT_WORD_GROUPS.values())
    assert 55 <= n <= 65
    assert wp.skipped == () and len(wp.words) == n  # every default word is one token in the default model
    assert wp.pca.coords.shape == (n, 3)
    assert float(wp.pca.explained_variance.sum()) > 5 * float(wp.pca.random_explained_variance.sum())


def test_word_pca_skips_multi_token_words():
    b = Borders.from_model(make_tiny("llama_tied"))
    wp = word_pca(b, FakeTok(96), groups={"a": ("w1", "w2", "w3 w4"), "b": ("w5", "zzz", "w6")}, seed=2)
    assert wp.words == ("w1", "w2", "w5", "w6") and wp.groups == ("a", "a", "b", "b")
    assert wp.skipped == ("w3 w4", "zzz")
    assert torch.equal(wp.pca.ids, torch.tensor([1, 2, 5, 6]))
    with pytest.raises(BadInput):
        word_pca(b, FakeTok(96), groups={"a": ("w1", "w2", "zzz")})


# ---------------------------------------------------------------------------------------- PCA
def _rows(n=40, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    scales = torch.linspace(3, 0.1, d)
    return torch.randn(n + 20, d, generator=g) * scales


def test_pca_properties():
    W = _rows()
    ids = list(range(5, 45))
    p = pca_3d(W, ids, seed=3)
    D, R = p.directions.double(), p.random_directions.double()
    assert torch.allclose(D @ D.T, torch.eye(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-5)
    ev = p.explained_variance
    assert ev[0] >= ev[1] >= ev[2] > 0 and float(ev.sum()) <= 1 + 1e-6
    # reference: eigenvalues of the rows' covariance (fitted on these rows only)
    X = W[ids].double()
    Xc = X - X.mean(0)
    eig = torch.linalg.eigvalsh(Xc.T @ Xc).flip(0)
    assert torch.allclose(ev.double(), eig[:3] / eig.sum(), atol=1e-5)
    assert torch.allclose(p.coords.double(), Xc @ D.T, atol=1e-4)
    assert torch.allclose(p.random_coords.double(), Xc @ R.T, atol=1e-4)
    assert torch.allclose(p.mean.double(), X.mean(0), atol=1e-5)
    # PCA keeps the most variance any 3 orthonormal directions can (Ky Fan)
    assert float(ev.sum()) >= float(p.random_explained_variance.sum())
    assert torch.allclose(p.random_explained_variance.double(), (Xc @ R.T).pow(2).sum(0) / eig.sum(), atol=1e-5)


def test_pca_deterministic_and_seeded():
    W = _rows()
    a, b = pca_3d(W, range(40), seed=0), pca_3d(W, range(40), seed=0)
    assert torch.equal(a.coords, b.coords) and torch.equal(a.random_coords, b.random_coords)
    c = pca_3d(W, range(40), seed=1)
    assert torch.equal(a.coords, c.coords) and not torch.allclose(a.random_coords, c.random_coords)


def test_pca_bad_input():
    W = _rows()
    with pytest.raises(BadInput):
        pca_3d(W, [1, 2, 3])
    with pytest.raises(BadInput):
        pca_3d(W, [1, 2, 3, 1000])
    with pytest.raises(BadInput):
        pca_3d(torch.randn(10, 2), range(5))


# ---------------------------------------------------------------------------------------- render
def test_pca_figure_switch(smollm2):
    """The real model's words: per view G point traces, every word on hover, every word labelled on
    the flat map (issue 40: 4 of 60 were); how the labels read in Chromium: tests/unit/test_pca_labels.py."""
    from vocablens.render.pca import pca_figure, pca_map_figure, pca_section

    wp = word_pca(smollm2.borders, smollm2.tokenizer)
    fig = pca_figure(wp)
    G = len(DEFAULT_WORD_GROUPS)
    assert len(fig.data) == 2 * G                                       # per view: G point traces
    assert all(t.type == "scatter3d" for t in fig.data)
    assert [t.visible for t in fig.data] == [True] * G + [False] * G
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["PCA", "three random directions"]
    assert buttons[1].args[0]["visible"] == [False] * G + [True] * G
    hover = [w for t in fig.data[:G] for w in t.hovertext]
    assert sorted(hover) == sorted(wp.words) and "queen" in hover      # every word is under the pointer
    assert sorted(a.text for a in pca_map_figure(wp).layout.annotations) == sorted(wp.words)
    shown = [a.text for a in fig.layout.scene.annotations]
    assert len(shown) == len(set(shown)) >= 50
    sec = pca_section(wp)
    assert sec.id == "pca" and 'data-figure="pca-3d"' in sec.html and 'data-figure="pca-2d"' in sec.html
    assert f"In 3-D, {len(shown)} of the 60 words are labelled" in sec.html


def test_neighbors_and_anatomy_sections(smollm2):
    from vocablens.accounting.anatomy import anatomy, anatomy_of
    from vocablens.render.anatomy import anatomy_section, anatomy_table
    from vocablens.render.neighbors import neighbors_section

    res = nearest_neighbors(smollm2.borders, smollm2.tokenizer, [" king", " Paris"], k=5)
    sec = neighbors_section(res, smollm2.tokenizer)
    assert sec.id == "neighbors" and "␣queen" in sec.html             # the leading space shown visibly
    results = [anatomy(smollm2.borders, name="smollm2"), anatomy_of("qwen3-0.6b")]
    a = anatomy_section(results)
    assert "134,515,008" in a.html and "596,049,920" in a.html and "Plotly.newPlot" in a.html
    assert anatomy_table(results).row_count > 20


# ---------------------------------------------------------------------------------------- CLI
@pytest.fixture
def cli_model(smollm2, monkeypatch):
    import vocablens.cli.geometry as cg

    monkeypatch.setattr(cg, "load_model", lambda *a, **k: smollm2)
    return smollm2


def test_cli_neighbors_json(cli_model, capsys):
    assert run_app(["neighbors", " king", " New York", "-k", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    king, ny = d["queries"]
    assert " queen" in [n["token"] for n in king["input"]]
    assert king["used"] == "token" and king["note"] is None and "output" not in king
    assert ny["used"] == "first token" and ny["tokens"] == [" New", " York"]
    assert d["k"] == 8 and len(king["input"]) == 8


def test_cli_neighbors_table_and_mean(cli_model, capsys):
    assert run_app(["neighbors", " New York", "--mean", "-k", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo rich's wrapping at 80 columns
    assert "(mean of tokens)" in out and "embedding (input)" in out and "using the mean of its tokens" in out


@pytest.mark.parametrize("argv", [
    ["neighbors", " king", "-k", "0"],
    ["neighbors", " king", "-k", "1000000"],
    ["neighbors", ""],
])
def test_cli_neighbors_bad_input_exit_2(cli_model, argv, capsys):
    assert run_app(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error:") and "Traceback" not in err
