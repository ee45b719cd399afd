"""Legacy and hostile checkpoints (issue 42, D): a model directory holding only ``pytorch_model.bin``
works on every command (partial loads fall back to the whole load and say so); a pickle holding
anything but tensors is refused in one line naming the file, and nothing in it runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tiny_dirs import run_cli, save_tiny, tiny_tokenizer


class _RunsCode:
    """Unpickling this would call ``exec`` and write the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy")
    st = save_tiny(root / "st", tiny_tokenizer())
    legacy = root / "legacy"
    shutil.copytree(st, legacy)
    from safetensors.torch import load_file

    sd = load_file(legacy / "model.safetensors")
    (legacy / "model.safetensors").unlink()
    torch.save(sd, legacy / "pytorch_model.bin")
    hostile = root / "hostile"
    shutil.copytree(legacy, hostile)
    marker = root / "RAN"
    torch.save({**sd, "extra": _RunsCode(marker)}, hostile / "pytorch_model.bin")
    return {"st": st, "legacy": legacy, "hostile": hostile, "marker": marker}


def _json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out), err


CASES = [("score", ["score", "The class statement"]),
         ("lens", ["lens", "The class statement"]),
         ("neighbors", ["neighbors", "class"]),                 # matrices mode
         ("project", ["project", "--block", "0"]),              # borders mode
         ("score-streaming", ["score", "The class statement", "--max-memory", "20KB"])]


@pytest.mark.parametrize("name, argv", CASES, ids=[c[0] for c in CASES])
def test_bin_only_equals_safetensors(capsys, dirs, name, argv):
    """The same figures from pytorch_model.bin as from model.safetensors (same tensors)."""
    a, _ = _json(capsys, *argv, "-m", dirs["st"])
    b, err = _json(capsys, *argv, "-m", dirs["legacy"])
    strip = lambda d: {k: v for k, v in d.items() if k not in ("model", "provenance", "timing", "seconds")}  # noqa: E731
    assert strip(a) == strip(b)
    if name not in ("score", "lens"):  # a partial load fell back to the whole model and said so
        assert "pytorch_model.bin only" in err and "whole model was loaded" in err


@pytest.mark.parametrize("mode", ["head", "matrices", "borders"])
def test_partial_modes_fall_back_to_the_whole_load(dirs, mode):
    """``argmax`` reads the head mode: the same head and final norm from the pickle as from safetensors."""
    from vocablens.errors import VocabLensNote
    from vocablens.models.files.loader import load_mode

    ref = load_mode(str(dirs["st"]), mode).borders
    with pytest.warns(VocabLensNote, match="whole model was loaded"):
        got = load_mode(str(dirs["legacy"]), mode).borders
    assert torch.equal(got.unembedding.weight, ref.unembedding.weight) and torch.equal(got.W_E, ref.W_E)
    if mode == "head":
        h = torch.randn(3, ref.unembedding.weight.shape[1])
        assert torch.equal(got.final_norm(h), ref.final_norm(h))


@pytest.mark.parametrize("argv", [["score", "hello"], ["lens", "hello"], ["undertrained", "--no-verify"],
                                  ["neighbors", "class"], ["argmax"]], ids=lambda a: a[0])
def test_hostile_pickle_refused_one_line_nothing_runs(capsys, dirs, argv):
    code, out, err = run_cli(capsys, *argv, "-m", dirs["hostile"])
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1 and lines[-1].startswith("error:")
    assert not any(ln.startswith("note:") for ln in lines)
    assert str(dirs["hostile"] / "pytorch_model.bin") in lines[-1] and "nothing in it ran" in lines[-1]
    assert "exec" in lines[-1]
    assert not dirs["marker"].exists()


def test_hostile_pickle_api(dirs):
    import vocablens
    from vocablens.errors import CorruptModelFile

    with pytest.raises(CorruptModelFile, match="objects other than tensors"):
        vocablens.load(str(dirs["hostile"]))
    assert not dirs["marker"].exists()
