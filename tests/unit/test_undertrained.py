"""``vocablens.undertrained`` on tiny llamas trained here on a corpus that never uses a chosen set of
tokens (the oracle: which tokens the training data held), the command, and the default model."""

from __future__ import annotations

import json

import pytest
import torch

import vocablens
from vocablens.models import Borders
from vocablens.undertrained import verify_tokens
from vocablens.undertrained.beside import argmax_verdicts, overlap

N_USED, N_UNUSED, N_UNREACHABLE = 240, 12, 6


def _tokenizer():
    """WordLevel: [UNK], u0..u47 (the corpus uses them), n0..n11 (never used), and six entries with
    a space (unreachable: their text splits in two) — the known-unused reference."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]"] + [f"u{i}" for i in range(N_USED)] + [f"n{i}" for i in range(N_UNUSED)]
    words += [f"r{i} r" for i in range(N_UNREACHABLE)]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")


USED = list(range(1, 1 + N_USED))
UNUSED = list(range(1 + N_USED, 1 + N_USED + N_UNUSED))


def _corpus(g: torch.Generator, batch: int, T: int) -> torch.Tensor:
    """Runs of one used token, 2-6 long: the model learns to repeat the token it reads."""
    used = torch.tensor(USED)
    out = torch.empty(batch, T, dtype=torch.int64)
    for b in range(batch):
        seq: list[int] = []
        while len(seq) < T:
            tok = int(used[torch.randint(len(used), (1,), generator=g)])
            seq += [tok] * int(torch.randint(2, 7, (1,), generator=g))
        out[b] = torch.tensor(seq[:T])
    return out


def _trained(tied: bool, steps: int = 150, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied)
    m = LlamaForCausalLM(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread (and the machine is shared)
    opt = torch.optim.AdamW(m.parameters(), lr=5e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    m.train()
    for _ in range(steps):
        x = _corpus(g, 16, 32)
        loss = m(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    m.eval()
    return m, tok, Borders.from_model(m, tok)


@pytest.fixture(scope="module")
def tied():
    return _trained(tied=True)


@pytest.fixture(scope="module")
def untied():
    return _trained(tied=False, seed=1)


def _recall_precision(found, truth) -> tuple[float, float]:
    found, truth = set(found), set(truth)
    return len(found & truth) / len(truth), (len(found & truth) / len(found) if found else 0.0)


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_never_used_tokens_are_flagged_and_verified(which, request):
    m, tok, b = request.getfixturevalue(which)
    res = vocablens.undertrained(b, tok, candidates=N_UNUSED)
    assert res.indicators.name == ("unembedding_cosine" if which == "tied" else "embedding_norm")
    # the reference: the six unreachable entries (the tokenizer analysis found them)
    assert sorted(res.indicators.reference.tolist()) == list(range(1 + N_USED + N_UNUSED, len(tok)))
    assert res.counts()["unreachable"] == N_UNREACHABLE and res.counts()["normal"] == N_USED + N_UNUSED
    # flagged: the 12 lowest-indicator testable tokens; recall and precision against the corpus
    r, p = _recall_precision(res.candidates.tolist(), UNUSED)
    assert r >= 11 / 12 and p >= 11 / 12, (r, p, res.candidates.tolist())
    ex = list(res.verification.examples)
    used = verify_tokens(b, tok, USED, examples=ex)
    if which == "untied":
        # verified: prompted to repeat, the model gives them < 0.01 (their input rows are noise to it)
        r, p = _recall_precision(res.verified.tolist(), UNUSED)
        assert r >= 10 / 12 and p == 1.0, (r, p, res.verified.tolist(), res.verification.max_prob.tolist())
        # tokens used often are repeated: every used token has max probability >= 0.01
        assert float(used.max_prob.min()) >= 0.01 and not bool(used.verified.any())
    else:
        # tied: the copy circuit reads the input row, which is the head's row, so it half-works even for
        # tokens never seen (measured: p ~ 0.03 for them, > 0.3 for used ones); verification does not
        # confirm them at 0.01, yet it still ranks every never-used token below every used one
        assert float(res.verification.max_prob.max()) < float(used.max_prob.min()) / 3
        assert float(used.max_prob.min()) >= 0.01
    assert res.verdict(USED[0]) == "not tested"


def test_verification_equals_the_models_own_forward(tied):
    """The KV-cached, batched probability equals a plain full forward of the whole prompt."""
    from vocablens.undertrained.verify import SLOT, TEMPLATES, template_ids

    m, tok, b = tied
    cand = [UNUSED[0], USED[3], USED[7]]
    v = verify_tokens(b, tok, cand, examples=[USED[0], USED[1]], batch_size=2)  # a batch split in two
    for t, tpl in enumerate(TEMPLATES):
        prefix, query = template_ids(tok, tpl, [USED[0], USED[1]])
        for q, c in enumerate(cand):
            ids = torch.tensor([prefix + [c if x == SLOT else x for x in query]])
            with torch.no_grad():
                p = torch.softmax(m(input_ids=ids).logits[0, -1].double(), -1)[c]
            assert abs(float(v.per_template[q, t]) - float(p)) <= 1e-5 + 1e-4 * float(p)


def test_verification_in_a_time_budget_keeps_whole_batches(tied):
    """A budget that runs out leaves the first candidates verified by every template and the rest not
    at all: the prefix of the unbounded verification, equal to it; the first batch always runs."""
    m, tok, b = tied
    cand = UNUSED[:6] + USED[:6]
    ex = [USED[0], USED[1]]
    full = verify_tokens(b, tok, cand, examples=ex, batch_size=3)
    for budget, kept in ((2.5, 9), (0.0, 3), (100.0, 12)):
        ticks = iter(range(1000))             # each read of the clock is one second later
        part = verify_tokens(b, tok, cand, examples=ex, batch_size=3, time_budget_s=budget,
                             clock=lambda: float(next(ticks)))
        assert part.ids.tolist() == cand[:kept], budget
        assert torch.equal(part.per_template, full.per_template[:kept])
        assert torch.equal(part.max_prob, full.max_prob[:kept])
    from vocablens.errors import BadInput

    with pytest.raises(BadInput, match="time_budget_s"):
        verify_tokens(b, tok, cand, examples=ex, time_budget_s=-1)
    # through the analysis: the candidates are the verified prefix, lowest indicator first
    whole = vocablens.undertrained(b, tok, candidates=N_UNUSED, batch_size=4)
    cut = vocablens.undertrained(b, tok, candidates=N_UNUSED, batch_size=4, time_budget_s=0.0)
    assert cut.candidates.tolist() == whole.candidates[:4].tolist()
    assert cut.indicator_threshold == float(whole.indicators.values[whole.candidates[3]])
    assert torch.equal(cut.verification.max_prob, whole.verification.max_prob[:4])


def test_argmax_verdicts_beside(tied):
    from vocablens.argmax import argmax_for_borders
    from vocablens.render.argmax import argmax_to_dict

    m, tok, b = tied
    res = vocablens.undertrained(b, tok, candidates=N_UNUSED)
    ma = argmax_for_borders(b)
    from_obj = argmax_verdicts(ma, b.vocab_size)
    from_json = argmax_verdicts(json.loads(json.dumps(argmax_to_dict(ma, tok))), b.vocab_size)
    assert from_obj == from_json
    o = overlap(res, from_obj)
    cw = {i for i, x in enumerate(from_obj) if x in ("unargmaxable", "duplicate")}
    assert o.both == len(cw & set(res.verified.tolist())) and o.cannot_win == len(cw)
    with pytest.raises(vocablens.errors.BadInput, match="rows"):
        argmax_verdicts(ma, b.vocab_size + 1)


def test_bad_arguments(tied):
    m, tok, b = tied
    with pytest.raises(vocablens.errors.BadInput, match="candidates"):
        vocablens.undertrained(b, tok, candidates=-1)
    with pytest.raises(vocablens.errors.BadInput, match="fraction"):
        vocablens.undertrained(b, tok, fraction=0.0)
    with pytest.raises(vocablens.errors.BadInput, match="known_unused"):
        vocablens.undertrained(b, tok, known_unused=[10_000])
    with pytest.raises(vocablens.errors.BadInput, match="candidate ids"):
        verify_tokens(b, tok, [len(tok)], examples=[1])


def test_command_on_a_saved_model(untied, tmp_path, capsys):
    from tiny_dirs import run_cli

    m, tok, b = untied
    d = tmp_path / "m"
    m.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    code, out, err = run_cli(capsys, "undertrained", "-m", d, "-n", N_UNUSED, "--json")
    assert code == 0, err
    j = json.loads(out)
    assert j["counts"]["unreachable"] == N_UNREACHABLE and j["n_candidates"] == N_UNUSED
    assert set(j["verified_ids"]) <= set(UNUSED) and len(j["verified_ids"]) >= 10
    assert {t["argmax"] for t in j["tokens"]} == {"no scan"} and j["overlap"] is None
    row = j["tokens"][0]
    assert set(row) == {"id", "token", "class", "indicator", "max_prob", "verdict", "argmax"}
    code, out, err = run_cli(capsys, "undertrained", "-m", d, "-n", 4)
    assert code == 0 and "under-trained" in out and "no scan" in out
    code, out, err = run_cli(capsys, "undertrained", "-m", d, "--argmax", tmp_path / "none.json")
    assert code == 2 and "no such file" in err and "Traceback" not in err
    code, out, err = run_cli(capsys, "undertrained", "-m", d, "-n", "-3")
    assert code == 2 and "--candidates" in err


def test_default_model_figures(smollm2):
    """SmolLM2-135M: counts per class and the verified list, within bounds (not one machine's floats)."""
    res = vocablens.undertrained(smollm2.borders, smollm2.tokenizer, candidates=64)
    c = res.counts()
    assert c["special"] == 17 and c["unreachable"] == 0 and c["padding"] == 0
    assert 200 <= c["single_byte"] <= 256 and 150 <= c["partial_utf8"] <= 250
    assert sum(c.values()) == 49152
    assert res.indicators.name == "unembedding_cosine"
    assert res.indicators.reference.tolist() == list(range(3, 17))   # the 14 code-metadata markers
    n = int(res.verified.numel())
    assert 25 <= n <= 60, n                                          # measured: 39 of the lowest 64
    from vocablens.models.tokens import token_str

    verified = {token_str(smollm2.tokenizer, i) for i in res.verified.tolist()}
    assert {"ManagementPlaneProtection", "swigfaiss", "kinesisfirehose"} <= verified
