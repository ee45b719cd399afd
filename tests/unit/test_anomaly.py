"""Odd inputs from lens trajectories: features against a brute-force reference, detectors, inputs."""

import json

import pytest
import torch

from tiny_models import make_tiny
from vocablens.lens.anomaly import auroc, detect, fit_detector, read_inputs, trajectory_features, Trajectories
from vocablens.errors import BadInput
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders


class _Tok:
    """Maps characters to ids (mod V): enough to feed a tiny model text."""

    def __init__(self, V):
        self.V = V

    def __call__(self, text, return_tensors=None):
        class R:
            pass

        r = R()
        r.input_ids = torch.tensor([[ord(c) % self.V for c in text]])
        return r


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny("llama")
    return Borders.from_model(model)


def _reference(b, text, tok):
    """Per layer (0..L-1) at the last position: KL(final ‖ layer), entropy, log1p(rank of final top-1)."""
    ids = tok(text).input_ids
    with torch.no_grad():
        resid, logits = b.residual_stream(ids)
        fin = torch.log_softmax(logits[0, -1].double(), -1)
        top = int(fin.argmax())
        rows = []
        for layer in range(b.n_layers):
            lq = torch.log_softmax(b.unembedding(resid[layer, 0, -1]).double(), -1)
            kl = float((fin.exp() * (fin - lq)).sum())
            ent = float(-(lq.exp() * lq).sum())
            rank = int((lq > lq[top]).sum())
            rows.append((kl, ent, float(torch.log1p(torch.tensor(float(rank))))))
    return rows


def test_logit_features_equal_reference(tiny):
    tok = _Tok(tiny.vocab_size)
    tr = trajectory_features(tiny, tok, ["hello world", "abc"], kinds=("logit",))
    L = tiny.n_layers
    assert tr.features.shape == (2, 3 * L)
    assert tr.names[0] == "logit/kl/0" and tr.names[L] == "logit/entropy/0"
    for i, text in enumerate(["hello world", "abc"]):
        ref = _reference(tiny, text, tok)
        for layer, (kl, ent, lr) in enumerate(ref):
            assert abs(float(tr.features[i, layer]) - kl) < 1e-4 * max(1.0, kl)
            assert abs(float(tr.features[i, L + layer]) - ent) < 1e-4
            assert abs(float(tr.features[i, 2 * L + layer]) - lr) < 1e-6


def test_zero_tuned_lens_gives_logit_features(tiny):
    """An untrained (zero) tuned lens is the logit lens: both halves of the features agree."""
    tok = _Tok(tiny.vocab_size)
    lens = TunedLens.for_model(tiny)
    tr = trajectory_features(tiny, tok, ["some text here"], lens=lens)
    logit, tuned = tr.select(("logit",)), tr.select(("tuned",))
    assert torch.allclose(logit, tuned, atol=1e-5)


def test_detectors_separate_shifted_inputs():
    g = torch.Generator().manual_seed(0)
    L = 4
    names = [f"logit/{s}/{i}" for s in ("kl", "entropy", "log_rank") for i in range(L)]
    normal = Trajectories(torch.randn(80, 3 * L, generator=g), names, ("logit",), torch.ones(80, dtype=torch.int64))
    test_x = torch.cat([torch.randn(30, 3 * L, generator=g), torch.randn(30, 3 * L, generator=g) + 2.5])
    test = Trajectories(test_x, names, ("logit",), torch.ones(60, dtype=torch.int64))
    labels = torch.cat([torch.zeros(30), torch.ones(30)]).long()
    rep = detect(normal, test, labels)
    assert set(rep.auroc) == {"logit/iforest", "logit/lof"}
    assert all(v > 0.9 for v in rep.auroc.values())
    # the score ranks inputs: the shifted half scores higher on average
    s = rep.scores["logit/lof"]
    assert float(s[30:].mean()) > float(s[:30].mean())


def test_auroc_matches_definition():
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])
    # pairs (pos, neg): (0.35>0.1) (0.35<0.4) (0.8>0.1) (0.8>0.4) -> 3/4
    assert auroc(scores, labels) == pytest.approx(0.75)
    with pytest.raises(BadInput):
        auroc(scores, torch.zeros(4, dtype=torch.int64))


def test_bad_detector_and_too_few_inputs():
    with pytest.raises(BadInput):
        fit_detector(torch.randn(10, 3), "svm")
    with pytest.raises(BadInput):
        fit_detector(torch.randn(4, 3), "iforest")


def test_tuned_without_lens(tiny):
    with pytest.raises(BadInput):
        trajectory_features(tiny, _Tok(tiny.vocab_size), ["x y"], kinds=("tuned",))


def test_read_inputs(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\nsecond line\\nwith newline\n", encoding="utf-8")
    texts, labels = read_inputs(tmp_path / "a.txt")
    assert texts == ["first", "second line\nwith newline"] and labels is None
    rows = [{"text": "ok", "label": 0}, {"text": "odd", "label": 1}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    texts, labels = read_inputs(tmp_path / "b.jsonl")
    assert texts == ["ok", "odd"] and labels.tolist() == [0, 1]
    texts, labels = read_inputs(tmp_path)           # the directory: both files, labels incomplete
    assert sorted(texts) == sorted(["first", "second line\nwith newline", "ok", "odd"]) and labels is None
    (tmp_path / "c.jsonl").write_text('{"txt": 1}\n', encoding="utf-8")
    with pytest.raises(BadInput):
        read_inputs(tmp_path / "c.jsonl")
    with pytest.raises(BadInput):
        read_inputs(tmp_path / "missing.txt")
