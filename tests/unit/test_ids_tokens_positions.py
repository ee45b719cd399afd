"""Issue 48, items 1, 2, 5 and 7: what a caller gives for ids, positions and a token.

- Token ids are checked, never cast: an integer [B, T] tensor or a list of id lists is a batch where
  a batch is taken (each prompt's result equal to its own run) and refused in one line where it is
  not; float, bool and complex tensors are refused naming the dtype; ids outside [0, V) and ids past
  the context are refused as text is (one check: ``PromptTooLong``).
- ``positions`` given as a string reads as ``--positions`` does (one parser), never character by character.
- A token is its text by default (``"4"`` is the text "4"); an id only when asked for (``id:4``, an
  int, ``--target-id 4``), by one resolver in the handle, the CLI and the explorer.

Oracles: the single runs of each prompt; the tokenizer's own encoding of the text; the model's context
length from its config.
"""

from __future__ import annotations

import json

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer
from vocablens.errors import BadInput, PromptTooLong, TokenNotInVocabulary

TEXT = "The class statement defines a new type"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import vocablens

    d = save_tiny(tmp_path_factory.mktemp("ids") / "tiny", tiny_tokenizer())
    return str(d), vocablens.load(str(d))


def _close(a, b, tol=1e-5):
    """Two JSON values equal, floats to ``tol``."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def test_a_batch_of_ids_is_a_batch_equal_to_the_single_runs(tiny):
    _, m = tiny
    ids = m.encode(TEXT)[0]
    singles = [m.lens(x, kind="logit", k=3, positions="all").to_json() for x in (ids, ids.flip(0))]
    for given in (torch.stack([ids, ids.flip(0)]), [ids.tolist(), ids.flip(0).tolist()], [ids, ids.flip(0)]):
        got = m.lens(given, kind="logit", k=3, positions="all").to_json()["prompts"]
        assert len(got) == 2
        for one, single in zip(got, singles):
            single = {k: v for k, v in single.items() if k != "model"}
            assert _close(one, single), "a prompt of the batch differs from its own run"
    # [1, T] and [T] are one prompt, as text is
    assert _close(m.lens(ids[None], k=3).to_json(), m.lens(TEXT, k=3).to_json())


@pytest.mark.parametrize("call", ["score", "explain", "forward", "trajectory", "backward"])
def test_a_batch_of_ids_is_refused_where_one_prompt_is_taken(tiny, call):
    _, m = tiny
    ids = m.encode(TEXT)[0]
    two = torch.stack([ids, ids.flip(0)])
    run = {"score": lambda: m.score(two), "explain": lambda: m.explain(two), "forward": lambda: m.forward(two),
           "trajectory": lambda: m.trajectory(two, kinds=("logit",)),
           "backward": lambda: m.backward_lens(two, " the")}[call]
    with pytest.raises(BadInput) as e:
        run()
    assert f"ids of 2 prompts (shape [2, {ids.numel()}]); this call reads one prompt" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad, dtype", [
    (torch.tensor([54.0, 262.5, 271.0]), "float32"),
    (torch.tensor([True, False, True]), "bool"),
    (torch.tensor([54 + 0j, 262 + 0j]), "complex64"),
    (torch.tensor([54, 262], dtype=torch.float64), "float64"),
])
def test_ids_that_are_not_integers_are_refused_naming_the_dtype(tiny, bad, dtype):
    _, m = tiny
    for run, what in ((lambda: m.lens(bad), "texts"), (lambda: m.score(bad), "text")):
        with pytest.raises(BadInput) as e:
            run()
        assert str(e.value).startswith(f"{what}: token ids must be an integer tensor; got dtype {dtype}")
    with pytest.raises(BadInput, match="token ids must be integers; got float 262.5"):
        m.lens([54, 262.5])
    with pytest.raises(BadInput, match="token ids must be integers; got bool"):
        m.score([True, False])


def test_ids_outside_the_vocabulary_and_past_the_context_are_refused(tiny):
    _, m = tiny
    V, ctx = m.borders.vocab_size, m.model.config.max_position_embeddings
    for run in (lambda x: m.lens(x), lambda x: m.score(x), lambda x: m.forward(x)):
        with pytest.raises(TokenNotInVocabulary, match=f"token id {V} has no row in the matrices"):
            run(torch.tensor([5, V]))
        with pytest.raises(TokenNotInVocabulary, match="token id -1 has no row"):
            run([5, -1])
        with pytest.raises(PromptTooLong) as e:
            run(torch.randint(3, V, (ctx + 1,)))
        assert str(e.value) == f"prompt has {ctx + 1} tokens, more than the model's context of {ctx}"
    with pytest.raises(PromptTooLong) as t:  # text over the context: the same check, the same line
        m.lens(" the" * (ctx + 5))
    assert str(t.value).endswith(f"more than the model's context of {ctx}")


@pytest.mark.parametrize("given, want", [("12", [12]), ("1,2", [1, 2]), (" -1 ", [-1]), ("all", "all"),
                                         ("last", "last"), (3, [3]), ([0, -1], [0, -1]),
                                         (torch.tensor([2, 4]), [2, 4])])
def test_positions_parse_as_the_cli_parses_them(tiny, capsys, given, want):
    d, m = tiny
    ids = m.encode(TEXT)[0]
    T = ids.numel()
    res = m.lens(TEXT, k=2, positions=given).to_json()
    expect = list(range(T)) if want == "all" else [T - 1] if want == "last" else [p % T for p in want]
    assert res["positions"] == expect
    if isinstance(given, str):  # the CLI reads the same string to the same positions
        code, out, _ = run_cli(capsys, "lens", TEXT, "-m", d, "-k", "2", "--positions", given, "--json")
        assert code == 0 and json.loads(out)["positions"] == expect


@pytest.mark.parametrize("given", ["middle", "1.5", "", "1,,2", 1.5, True, [], [1.0], torch.tensor([1.0])])
def test_positions_that_do_not_parse_are_one_line_naming_the_parameter(tiny, capsys, given):
    d, m = tiny
    with pytest.raises(BadInput) as e:
        m.lens(TEXT, positions=given)
    assert str(e.value).startswith("positions takes last, all, or positions as comma-separated integers")
    if isinstance(given, str):
        code, out, err = run_cli(capsys, "lens", TEXT, "-m", d, "--positions", given)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "error: --positions takes last, all, or positions as comma-separated integers" in err


def test_a_token_is_its_text_unless_an_id_is_asked_for(tiny, capsys):
    """The tiny tokenizer's "5" is one token (a byte of its alphabet) whose id is not 5."""
    d, m = tiny
    (five,) = m.tokenizer("5", add_special_tokens=False).input_ids
    assert five != 5
    assert m.token_id("5") == five and m.token_id("id:5") == 5 and m.token_id(5) == 5
    from vocablens.serve.adapters import token_id

    assert token_id(m, "5") == five and token_id(m, "id:5") == 5 and token_id(m, 5) == 5  # the explorer
    base = ["lens", "backward", TEXT, "-m", d, "-k", "2", "--json"]
    as_text = json.loads(run_cli(capsys, *base, "--target", "5")[1])
    assert (as_text["target"], as_text["target_id"]) == ("5", five)
    for how in (["--target-id", "5"], ["--target", "id:5"]):
        by_id = json.loads(run_cli(capsys, *base, *how)[1])
        assert by_id["target_id"] == 5 and by_id["target"] == m.tokens([5])[0]
    assert m.backward_lens(TEXT, "5", k=2).to_json()["target_id"] == five
    assert m.explain(TEXT, target="5").to_json()["target_id"] == five
    assert m.explain(TEXT, target="id:5").to_json()["target_id"] == 5
    code, out, _ = run_cli(capsys, "explain", TEXT, "-m", d, "--token-id", "5", "--json")
    assert code == 0 and json.loads(out)["target_id"] == 5
    assert m.trajectory(TEXT, token="id:5", kinds=("logit",)).options["token_id"] == 5
    assert m.neighbors("id:5").value.results[0].query_ids == (5,)


@pytest.mark.parametrize("given, error, words", [
    ("id:x", BadInput, "'id:x': id:N names a token by its id"),
    ("id:-3", BadInput, "id:N names a token by its id"),
    ("id:300", TokenNotInVocabulary, "token id 300 is outside the vocabulary 0..299"),
    (True, BadInput, "give a token's text or its id; got bool"),
    (" the class", TokenNotInVocabulary, "give a single token (its text with its leading space, or id:N for id N)"),
])
def test_tokens_that_do_not_resolve_are_one_line(tiny, given, error, words):
    _, m = tiny
    with pytest.raises(error) as e:
        m.token_id(given, "target")
    assert words in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("target")


def test_the_default_models_4_is_the_text_4(cli, smollm2):
    """The issue's case: `--target 4` is the text "4" (id 36 in the default tokenizer), `--target-id 4` id 4."""
    assert smollm2.tokenizer("4", add_special_tokens=False).input_ids == [36]
    prompt = "I have 3 apples and"
    got = {}
    for how in (["--target", "4"], ["--target-id", "4"], ["--target", "id:4"]):
        code, out, _ = cli("lens", "backward", prompt, *how, "-k", "1", "--json")
        assert code == 0
        got[" ".join(how)] = json.loads(out)
    assert (got["--target 4"]["target"], got["--target 4"]["target_id"]) == ("4", 36)
    n = len(smollm2.tokenizer(" 4", add_special_tokens=False).input_ids)  # digits stand alone: ' ', '4'
    code, out, err = cli("lens", "backward", prompt, "--target", " 4", "-k", "1", "--json")
    assert (code, out, err.count("\n")) == (2, "", 1) and f"error: --target: ' 4' is {n} tokens" in err
    assert got["--target-id 4"]["target_id"] == got["--target id:4"]["target_id"] == 4
    assert got["--target-id 4"] == got["--target id:4"]
    assert smollm2.backward_lens(prompt, "4", k=1).to_json()["loss"] == pytest.approx(got["--target 4"]["loss"],
                                                                                        abs=1e-6)
