"""Published lenses: files in tuned-lens's and the Jacobian lens's own save formats (tests/
reference_lens_files.py writes them as the reference code does) load, every model identity they record
is checked against the loaded model (a mismatch refused in one line naming both sides), and their
provenance travels with every result."""

from __future__ import annotations

import json

import pytest
import torch

import reference_lens_files as ref
import tiny_models as tm
from vocablens.errors import CheckpointMismatch
from vocablens.lens.identity import NO_MODEL, same_model, tuned_lens_unembed_hash
from vocablens.lens.jacobian import JacobianLens
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders

REV = "0123456789abcdef0123456789abcdef01234567"


def named(seed: int = 0, name: str = "tiny-org/tiny-llama", revision: str | None = REV) -> Borders:
    """A tiny llama as a hub load leaves it: transformers sets ``_name_or_path`` and ``_commit_hash``."""
    model = tm.make_tiny("llama", seed=seed)
    model.config._name_or_path = name
    model.config._commit_hash = revision
    return Borders.from_model(model)


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_tuned_lens_hash_is_the_reference_one():
    b = named()
    assert tuned_lens_unembed_hash(b) == ref.tensor_hash(b.unembedding.weight)
    assert tuned_lens_unembed_hash(named(seed=3)) != ref.tensor_hash(b.unembedding.weight)
    b.model.to(torch.bfloat16)  # numpy has no bfloat16: tuned-lens cannot hash it, so neither is it checked
    assert tuned_lens_unembed_hash(Borders.from_model(b.model)) is None


def test_a_hub_cache_snapshot_folder_names_its_hub_id_and_commit():
    from vocablens.lens.identity import model_names

    b = named(name=f"/root/.cache/huggingface/hub/models--Qwen--Qwen2-0.5B/snapshots/{REV}", revision=None)
    assert model_names(b) == (["Qwen/Qwen2-0.5B"], REV)


def test_names_compare_as_the_same_model():
    assert same_model("gpt2", "openai-community/gpt2")
    assert same_model("HuggingFaceTB/SmolLM2-135M-Instruct", "/cache/gguf/SmolLM2-135M-Instruct.Q4_1-1736b1d9b8ad4fb2")
    assert same_model("EleutherAI/pythia-70m", "eleutherai/Pythia-70M")
    assert not same_model("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not same_model("a-org/gpt2", "b-org/gpt2")
    assert not same_model("Qwen/Qwen2-0.5B", "tiny-org/tiny-llama")


def test_tuned_lens_library_file_round_trip_verified(tmp_path):
    b = named()
    state = ref.save_tuned_lens(tmp_path / "tl", b.d_model, b.n_layers, "tiny-org/tiny-llama", REV,
                                ref.tensor_hash(b.unembedding.weight))
    lens = TunedLens.load(tmp_path / "tl", b)
    h = torch.randn(3, b.d_model)
    for i in range(b.n_layers):
        torch.testing.assert_close(lens.translate(i, h), h + torch.nn.functional.linear(
            h, state[f"{i}.weight"], state[f"{i}.bias"]))
    info = lens.info()
    assert info["name"] == "tiny-org/tiny-llama" and info["revision"] == REV and info["format"] == "tuned-lens"
    assert info["dtype"] == "float32"
    assert info["verified"] == "verified: model name, revision, tuned-lens unembedding hash"


@pytest.mark.parametrize("name, revision, other_head, words", [
    ("Qwen/Qwen2-0.5B", None, False, "fitted for Qwen/Qwen2-0.5B but the model is tiny-org/tiny-llama (revision 0123456789ab)"),
    ("tiny-org/tiny-llama", "fedcba9876", False, "fitted for tiny-org/tiny-llama (revision fedcba9876) but the model is "
                                                 "tiny-org/tiny-llama (revision 0123456789ab)"),
    ("tiny-org/tiny-llama", REV, True, "; the model tiny-org/tiny-llama is another model (hash "),
])
def test_tuned_lens_library_file_of_another_model_refused(tmp_path, name, revision, other_head, words):
    b = named()
    head = named(seed=5).unembedding.weight if other_head else b.unembedding.weight
    ref.save_tuned_lens(tmp_path / "tl", b.d_model, b.n_layers, name, revision, ref.tensor_hash(head))
    with pytest.raises(CheckpointMismatch) as e:
        TunedLens.load(tmp_path / "tl", b)
    assert words in one_line(e)


def test_tuned_lens_file_naming_no_model_is_unverified(tmp_path):
    b = named()
    ref.save_tuned_lens(tmp_path / "tl", b.d_model, b.n_layers, "")
    assert TunedLens.load(tmp_path / "tl", b).info()["verified"] == NO_MODEL
    # a name the model cannot be compared with (an in-memory model records none): accepted, unverified
    ref.save_tuned_lens(tmp_path / "t2", b.d_model, b.n_layers, "Qwen/Qwen2-0.5B")
    anon = Borders.from_model(tm.make_tiny("llama"))
    assert TunedLens.load(tmp_path / "t2", anon).info()["verified"].startswith("unverified: the model records no name")


def test_jacobian_reference_file_is_unverified_and_transformer_lens_file_checked(tmp_path):
    b = named()
    L, d = b.n_layers, b.d_model
    J = {blk: torch.randn(d, d) for blk in range(L - 1)}
    ref.save_jacobian_lens(tmp_path / "ref.pt", J, 5, d)  # the reference records no model
    info = JacobianLens.load(tmp_path / "ref.pt", b).info()
    assert info["verified"] == NO_MODEL and info["format"] == "jacobian-lens" and info["n_prompts"] == 5
    assert info["dtype"] == "float16"
    meta = {"model_name": "tiny-org/tiny-llama", "model_revision": REV, "target_layer": L - 1, "corpus": "wiki",
            "transformer_lens_fit": True}
    ref.save_jacobian_lens(tmp_path / "tl.pt", J, 5, d, meta)
    info = JacobianLens.load(tmp_path / "tl.pt", b).info()
    assert info["verified"] == "verified: model name, revision" and info["source"] == "TransformerLens"
    assert info["corpus"] == "wiki" and info["name"] == "tiny-org/tiny-llama"
    ref.save_jacobian_lens(tmp_path / "qwen.pt", J, 5, d, {**meta, "model_name": "Qwen/Qwen2-0.5B"})
    with pytest.raises(CheckpointMismatch) as e:
        JacobianLens.load(tmp_path / "qwen.pt", b)
    assert "fitted for Qwen/Qwen2-0.5B (revision 0123456789ab) but the model is tiny-org/tiny-llama" in one_line(e)
    ref.save_jacobian_lens(tmp_path / "old.pt", J, 5, d, {**meta, "model_revision": "feedbeef"})
    with pytest.raises(CheckpointMismatch, match="revision feedbeef"):
        JacobianLens.load(tmp_path / "old.pt", b)


def test_our_published_jacobian_file_carries_the_head_hash(tmp_path):
    b = named()
    L, d = b.n_layers, b.d_model
    ident = {"name": "tiny-org/tiny-llama", "unembed_sha256": b.unembedding.identity_hash(), "revision": REV}
    lens = JacobianLens(torch.eye(d).repeat(L - 1, 1, 1), list(range(1, L)), L, ident, {"n_prompts": 3})
    lens.save_published(tmp_path / "lens.pt")
    meta = torch.load(tmp_path / "lens.pt", weights_only=True)["metadata"]
    assert meta["unembed_sha256"] == ident["unembed_sha256"] and meta["model_revision"] == REV
    assert JacobianLens.load(tmp_path / "lens.pt", b).info()["verified"] == "verified: unembedding hash"
    with pytest.raises(CheckpointMismatch, match="is another model"):
        JacobianLens.load(tmp_path / "lens.pt", named(seed=4))


def test_provenance_in_the_cli_json_and_caption(tmp_path, capsys):
    """``lens --kind tuned,jacobian --json`` and ``lens eval --json`` on a tiny model directory with
    both published files in one folder: each lens's record says what it was fitted for and the verdict."""
    from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

    save_tiny(tmp_path / "tiny-llama", tiny_tokenizer())
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny-llama")
    b = Borders.from_model(model)
    L, d = b.n_layers, b.d_model
    ref.save_tuned_lens(tmp_path / "pub", d, L, "some-org/tiny-llama", None, ref.tensor_hash(b.unembedding.weight))
    ref.save_jacobian_lens(tmp_path / "pub" / "lens.pt", {blk: torch.eye(d) for blk in range(L - 1)}, 2, d)
    m = str(tmp_path / "tiny-llama")
    code, out, err = run_cli(capsys, "lens", "the class", "-m", m, "--kind", "tuned,jacobian", "--lens",
                             str(tmp_path / "pub"), "--json")
    assert code == 0, err
    recs = {r["kind"]: r for r in json.loads(out)["lenses"]}
    assert recs["tuned"]["verified"] == "verified: model name, tuned-lens unembedding hash"
    assert recs["tuned"]["format"] == "tuned-lens" and recs["tuned"]["name"] == "some-org/tiny-llama"
    assert recs["jacobian"]["verified"] == NO_MODEL and recs["jacobian"]["n_prompts"] == 2
    code, out, err = run_cli(capsys, "lens", "the class", "-m", m, "--kind", "tuned,jacobian", "--lens",
                             str(tmp_path / "pub"))
    assert code == 0 and "format tuned-lens, verified: model name" in err and NO_MODEL in err
    (tmp_path / "notes.txt").write_text("The class statement defines a new type.\n" * 8)
    code, out, err = run_cli(capsys, "lens", "eval", "-m", m, "--lens", str(tmp_path / "pub"), "--corpus",
                             str(tmp_path / "notes.txt"), "--split", "all", "--seq-len", "16", "--max-tokens", "32",
                             "--json")
    assert code == 0, err
    d_ = json.loads(out)
    assert d_["lens"] == str(tmp_path / "pub") and d_["lenses"][0]["format"] == "tuned-lens"
    assert d_["lenses"][0]["verified"].startswith("verified: model name")


def test_the_handle_result_carries_the_provenance(tmp_path):
    import vocablens
    from tiny_dirs import save_tiny, tiny_tokenizer

    m = vocablens.load(str(save_tiny(tmp_path / "tiny-llama", tiny_tokenizer())))
    L, d = m.borders.n_layers, m.borders.d_model
    ref.save_jacobian_lens(tmp_path / "lens.pt", {blk: torch.eye(d) for blk in range(L - 1)}, 3, d,
                           {"model_name": "org/tiny-llama", "target_layer": L - 1})
    m.load_jacobian_lens(tmp_path / "lens.pt")
    rec = m.lens("the class", kind="logit,jacobian", layers=list(range(1, L + 1))).to_json()["lenses"][0]
    assert rec["kind"] == "jacobian" and rec["verified"] == "verified: model name" and rec["n_prompts"] == 3
    ref.save_tuned_lens(tmp_path / "tl", d, L, "org/other-model")
    with pytest.raises(CheckpointMismatch, match="fitted for org/other-model but the model is tiny-llama"):
        m.load_lens(tmp_path / "tl")
    # the report's lens section and report --json: both published files of one folder, with their provenance
    from vocablens.render.report import report_sections, report_to_dict

    ref.save_tuned_lens(tmp_path / "pub", d, L, "tiny-llama", None, ref.tensor_hash(m.borders.unembedding.weight))
    ref.save_jacobian_lens(tmp_path / "pub" / "lens.pt", {blk: torch.eye(d) for blk in range(L - 1)}, 3, d)
    run = m.report(prompt="the class statement", lens_path=str(tmp_path / "pub"), only=("tuned",))
    (sec,) = report_sections(run, m, str(tmp_path / "tiny-llama"))
    assert "format tuned-lens, verified: model name, tuned-lens unembedding hash" in sec.html
    assert "format jacobian-lens, unverified: the file names no model" in sec.html
    recs = {r["kind"]: r for r in report_to_dict(run, m, tmp_path / "r.html", [sec], {})["lenses"]}
    assert recs["tuned"]["format"] == "tuned-lens" and recs["jacobian"]["verified"] == NO_MODEL
