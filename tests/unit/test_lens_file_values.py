"""Issue 48, items 3, 4 and 6: what a lens file holds is checked on load.

- A tuned lens (ours, or tuned-lens's ``params.pt``) or a Jacobian lens (ours, or the published
  ``lens.pt``) holding one NaN or inf is refused in one line naming the file, the tensor and the layer
  (it used to load and print rank 0 for the final token at that layer).
- A lens tensor that is not floating point (a J cast to int32 and saved) is refused.
- A published Jacobian lens whose source blocks include the model's last block (scripts that store
  the target's own J = I) is read when that matrix is the identity, and refused otherwise by naming
  the blocks the file holds and the blocks the model has (never a model size the file does not record).

Oracles: the files are written as the reference code writes them (tests/reference_lens_files.py) with
one planted value; a lens with the identity slot is compared with the same lens without it.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import reference_lens_files as ref
import tiny_models as tm
from vocablens.errors import CheckpointMismatch, CorruptModelFile, NonFiniteWeights
from vocablens.lens.jacobian import JacobianLens
from vocablens.lens.tuned import TunedLens
from vocablens.models import Borders


@pytest.fixture(scope="module")
def b() -> Borders:
    return Borders.from_model(tm.make_tiny("llama"))


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("tensor, index, value, words", [
    ("bias", (1, 3), float("nan"), "lens.safetensors: lens tensor bias at layer 1 holds NaN (1 entries)"),
    ("weight", (0, 2, 5), float("inf"), "lens.safetensors: lens tensor weight at layer 0 holds inf (1 entries)"),
])
def test_our_tuned_lens_with_a_non_finite_value_is_refused(tmp_path, b, tensor, index, value, words):
    lens = TunedLens.for_model(b)
    lens.save(tmp_path / "ok")
    TunedLens.load(tmp_path / "ok", b)  # the finite lens loads
    with torch.no_grad():
        getattr(lens, tensor)[index] = value
    lens.save(tmp_path / "bad")
    with pytest.raises(NonFiniteWeights) as e:
        TunedLens.load(tmp_path / "bad", b)
    assert str(tmp_path / "bad") in one_line(e) and words in one_line(e)


def test_a_tuned_lens_library_file_with_inf_is_refused(tmp_path, b):
    ref.save_tuned_lens(tmp_path / "tl", b.d_model, b.n_layers, "")
    state = torch.load(tmp_path / "tl" / "params.pt", weights_only=True)
    state["1.weight"][0, 0] = float("-inf")
    torch.save(state, tmp_path / "tl" / "params.pt")
    with pytest.raises(NonFiniteWeights) as e:
        TunedLens.load(tmp_path / "tl", b)
    assert f"{tmp_path / 'tl' / 'params.pt'}: lens tensor 1.weight (layer 1) holds inf" in one_line(e)


def test_jacobian_lenses_with_nan_are_refused(tmp_path, b):
    d, L = b.d_model, b.n_layers
    J = torch.eye(d)
    J[4, 7] = float("nan")
    ref.save_jacobian_lens(tmp_path / "lens.pt", {0: J}, 3, d)
    with pytest.raises(NonFiniteWeights) as e:
        JacobianLens.load(tmp_path / "lens.pt", b)
    assert f"{tmp_path / 'lens.pt'}: lens tensor J[0] at block 0 (stream layer 1) holds NaN" in one_line(e)
    ours = JacobianLens(torch.eye(d).repeat(L, 1, 1), list(range(L)), L)
    ours.J[1, 0, 0] = float("nan")
    ours.save(tmp_path / "ours")
    with pytest.raises(NonFiniteWeights) as e:
        JacobianLens.load(tmp_path / "ours", b)
    assert "jacobian.safetensors: lens tensor J at layer 1 holds NaN" in one_line(e)


def test_an_integer_jacobian_lens_is_refused(tmp_path, b):
    """The issue's file: J cast to int32 and saved with its layers."""
    d, L = b.d_model, b.n_layers
    lens = JacobianLens(3 * torch.eye(d).repeat(L, 1, 1), list(range(L)), L)
    lens.save(tmp_path / "int", dtype=torch.int32)
    assert load_file(str(tmp_path / "int" / "jacobian.safetensors"))["J"].dtype == torch.int32
    with pytest.raises(CorruptModelFile) as e:
        JacobianLens.load(tmp_path / "int", b)
    assert "jacobian.safetensors: lens tensor J is int32, not floating point" in one_line(e)
    ref.save_jacobian_lens(tmp_path / "int.pt", {0: torch.eye(d)}, 3, d)
    obj = torch.load(tmp_path / "int.pt", weights_only=True)
    obj["J"][0] = obj["J"][0].to(torch.int16)
    torch.save(obj, tmp_path / "int.pt")
    with pytest.raises(CorruptModelFile, match=r"lens tensor J\[0\] is int16, not floating point"):
        JacobianLens.load(tmp_path / "int.pt", b)


def test_a_published_lens_holding_the_last_block_reads_when_its_matrix_is_the_identity(tmp_path, b):
    """Blocks 0..L-1 on a model of L blocks (the issue: 0..29 on the 30-block default model): the
    last block's J = I is left out and the lens equals the one without it."""
    d, L = b.d_model, b.n_layers
    torch.manual_seed(0)
    A = {blk: torch.randn(d, d) for blk in range(L - 1)}
    ref.save_jacobian_lens(tmp_path / "plain.pt", A, 4, d)
    ref.save_jacobian_lens(tmp_path / "with-target.pt", {**A, L - 1: torch.eye(d)}, 4, d)
    plain, with_target = JacobianLens.load(tmp_path / "plain.pt", b), JacobianLens.load(tmp_path / "with-target.pt", b)
    assert with_target.layers == plain.layers == list(range(1, L))
    assert torch.equal(with_target.J, plain.J)


def test_a_published_lens_holding_the_last_block_not_the_identity_is_refused(tmp_path, b):
    d, L = b.d_model, b.n_layers
    ref.save_jacobian_lens(tmp_path / "lens.pt", {blk: torch.eye(d) * 2 for blk in range(L)}, 4, d)
    with pytest.raises(CheckpointMismatch) as e:
        JacobianLens.load(tmp_path / "lens.pt", b)
    msg = one_line(e)
    assert f"holds matrices for blocks 0..{L - 1} (d_model={d}); the model has {L} blocks (0..{L - 1})" in msg
    assert f"its matrix for block {L - 1}, the last block" in msg and "max |J - I| = 1" in msg
    assert "a model of" not in msg  # the file records no model size: none is stated


def test_published_lens_layer_mismatches_name_what_the_file_holds(tmp_path, b):
    d, L = b.d_model, b.n_layers
    ref.save_jacobian_lens(tmp_path / "past.pt", {blk: torch.eye(d) for blk in range(L + 2)}, 4, d)
    with pytest.raises(CheckpointMismatch) as e:
        JacobianLens.load(tmp_path / "past.pt", b)
    assert one_line(e) == (f"this Jacobian lens holds matrices for blocks 0..{L + 1} (d_model={d}); the model has "
                           f"{L} blocks (0..{L - 1})")
    ref.save_jacobian_lens(tmp_path / "target.pt", {0: torch.eye(d)}, 4, d, {"target_layer": 5})
    with pytest.raises(CheckpointMismatch) as e:
        JacobianLens.load(tmp_path / "target.pt", b)
    assert "records target_layer 5 (the block its matrices map to)" in one_line(e)
    assert "a model of" not in one_line(e)


def test_our_lens_file_holding_layer_L_reads_when_its_matrix_is_the_identity(tmp_path, b):
    """The same rule for our own format: a matrix for stream layer L (the target) is read only as I."""
    from vocablens.lens.lens_files import save_files

    d, L = b.d_model, b.n_layers
    torch.manual_seed(1)
    plain = JacobianLens(torch.randn(L, d, d), list(range(L)), L)
    plain.save(tmp_path / "plain", dtype=torch.float32)
    want = JacobianLens.load(tmp_path / "plain", b)
    cfg = plain.config_dict()
    for name, last in (("eye", torch.eye(d)), ("not-eye", torch.eye(d) + 0.5)):
        tensors = {"J": torch.cat([plain.J, last[None]]), "layers": torch.arange(L + 1)}
        save_files(tmp_path / name, tensors, {**cfg, "layers": list(range(L + 1))}, "jacobian.safetensors",
                   "jacobian.json")
    got = JacobianLens.load(tmp_path / "eye", b)
    assert got.layers == want.layers == list(range(L)) and torch.equal(got.J, want.J)
    with pytest.raises(CheckpointMismatch) as e:
        JacobianLens.load(tmp_path / "not-eye", b)
    assert f"holds a matrix for layer {L}, the last block's output" in one_line(e) and "max |J - I| = 0.5" in one_line(e)
