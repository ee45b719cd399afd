"""A checkpoint whose weights hold NaN or inf, through every CLI command that loads weights (issue 24):
one ``error:`` line and exit 2 at load (``refuse_nonfinite``), never a traceback (``report`` used to end
in a ``torch._C._LinAlgError`` inside its PCA), nothing written."""

from __future__ import annotations

import pytest
import torch

from test_bad_inputs import NOTES, _digest
from tiny_dirs import run_cli, save_tiny, tiny_tokenizer


def _damage(d, name_part: str, value: float, where=(3, 0)) -> str:
    from safetensors.torch import load_file, save_file

    f = d / "model.safetensors"
    sd = load_file(f)
    name = next(k for k in sorted(sd) if name_part in k)
    sd[name][where] = value
    save_file(sd, f, metadata={"format": "pt"})
    return name


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """{kind: (model dir, the tensor damaged)}, a healthy twin for align, corpora and an output dir."""
    root = tmp_path_factory.mktemp("damaged")
    tok = tiny_tokenizer()
    got = {}
    for kind, part, value in (("nan-embedding", "embed_tokens", float("nan")),
                              ("inf-block", "layers.1.mlp.down_proj", float("inf"))):
        save_tiny(root / kind, tok)
        got[kind] = (root / kind, _damage(root / kind, part, value))
    save_tiny(root / "healthy", tok)
    from tiny_models import _config
    from vocablens.lens.tuned import TunedLens

    cfg = _config("llama")
    TunedLens(cfg.hidden_size, cfg.num_hidden_layers).save(root / "lens")
    (root / "notes.txt").write_text(NOTES)
    (root / "lines.txt").write_text("".join(f"Line {i} of the normal inputs, each its own.\n" for i in range(8)))
    (root / "out").mkdir()
    return root, got


#: every command that reads weights; ``{m}`` the damaged model, ``{d}`` the user's directory
COMMANDS = [
    ["report", "-m", "{m}", "--out", "{d}/out/r.html"],
    ["lens", "The class", "-m", "{m}"],
    ["lens", "The class", "-m", "{m}", "--max-memory", "1KB"],
    ["lens", "eval", "-m", "{m}", "--corpus", "{d}/notes.txt", "--lens", "{d}/lens"],
    ["lens", "train", "-m", "{m}", "--corpus", "{d}/notes.txt", "--out", "{d}/out/lens"],
    ["lens", "anomaly", "-m", "{m}", "--normal", "{d}/lines.txt", "--test", "{d}/notes.txt", "--kind", "logit"],
    ["score", "The class statement", "-m", "{m}"],
    ["neighbors", "-m", "{m}", "the"],
    ["argmax", "-m", "{m}"],
    ["bottleneck", "-m", "{m}"],
    ["project", "-m", "{m}"],
    ["project", "-m", "{m}", "--block", "0"],
    ["explain", "The class", "-m", "{m}"],
    ["settle", "-m", "{m}", "--corpus", "{d}/notes.txt"],
    ["steer", "-m", "{m}", "--promote", " the", "--prompt", "The class"],
    ["generate", "The class", "-m", "{m}", "-n", "3"],
    ["generate", "The class", "-m", "{m}", "-n", "3", "--temperature", "0.7"],
    ["anatomy", "{m}", "--weights"],
    ["align", "{m}", "{d}/healthy"],
    ["trim", "-m", "{m}", "--corpus", "{d}/notes.txt", "--out", "{d}/out/trimmed"],
    ["expand", "-m", "{m}", "--add", " zzq", "--out", "{d}/out/expanded"],
    ["serve", "-m", "{m}", "--port", "0"],
]


@pytest.mark.parametrize("kind", ["nan-embedding", "inf-block"])
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: "-".join(x for x in a[:2] if not x.startswith(("-", "{"))))
def test_damaged_weights_are_one_line_on_every_command(argv, kind, damaged, capsys):
    root, got = damaged
    model, tensor = got[kind]
    if argv[:1] == ["anatomy"] and "--weights" in argv:
        argv = [a for a in argv if a != "--weights"]
    args = [a.replace("{m}", str(model)).replace("{d}", str(root)) for a in argv]
    before = _digest(root)
    code, out, err = run_cli(capsys, *args)
    assert "Traceback" not in out + err, err
    if argv[0] == "anatomy":  # counts parameters from the config: honestly proceeds, reads no value
        assert code == 0, err
        return
    if kind == "inf-block" and (argv[0] in ("neighbors", "argmax") or "--block" in argv):
        # these read the embedding and the head (and block 0) alone: block 1 is never loaded, so the
        # command proceeds on finite weights
        assert code == 0 and "nan" not in out.lower(), (args, err)
        return
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and out == "", (args, code, out, err)
    assert "NaN or inf" in errors[0] and tensor in errors[0], errors[0]
    assert _digest(root) == before, "files changed"


def test_the_message_names_the_rows_of_a_nan_embedding(damaged, capsys):
    root, got = damaged
    code, _, err = run_cli(capsys, "neighbors", "-m", got["nan-embedding"][0], "the")
    assert code == 2 and "vocabulary rows [3]" in err, err
