"""The catalogue of bad inputs: one table, every command and the main public functions.

Each CLI case runs in-process against a tiny model saved once per session and must exit 2 with
exactly one ``error:`` line (holding the expected words), no traceback and nothing on stdout. Each
API case must raise the named :class:`~vocablens.errors.VocabLensError` subclass with a one-line
message. Every case hashes the directory holding the user's files (the model, the corpora, the
outputs that exist) before and after: nothing is changed, created or removed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from tiny_dirs import save_tiny, tiny_tokenizer
from vocablens.errors import (BadInput, CheckpointMismatch, CorruptModelFile, ModelNotFound, NonFiniteWeights, ShapeMismatch,
                             VocabLensError)

SURROGATE = "x\udced\udca0\udc80y"  # what a shell passes for the bytes ED A0 80: not encodable text
NOTES = "The class statement defines a new type. An object is an instance of that type.\n" * 12


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """The user's directory: a tiny model, corpora, an existing output, a lens of another model."""
    from vocablens.lens.tuned import TunedLens

    root = tmp_path_factory.mktemp("user")
    save_tiny(root / "tiny", tiny_tokenizer())
    (root / "notes.txt").write_text(NOTES)
    (root / "empty.txt").write_text("")
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (root / "sub").mkdir()
    (root / "exists.html").write_text("<p>keep me</p>")
    (root / "out").mkdir()
    (root / "out" / "keep.txt").write_text("the user's earlier output")
    TunedLens(32, 3).save(root / "otherlens")
    TunedLens(64, 2).save(root / "lens64")  # fits the tiny model (d=64, 2 blocks)
    import reference_lens_files as ref  # published lenses of the tiny model's shapes, fitted for other models

    ref.save_tuned_lens(root / "tl-qwen", 64, 2, "Qwen/Qwen2-0.5B")
    ref.save_tuned_lens(root / "tl-hash", 64, 2, "", unembed_hash="0" * 64)
    ref.save_jacobian_lens(root / "jl-qwen.pt", {0: torch.eye(64)}, 4, 64,
                           {"model_name": "Qwen/Qwen2-0.5B", "model_revision": "abc1234", "target_layer": 1})
    _bad_lens_files(root)
    return root


def _bad_lens_files(root: Path) -> None:
    """Lens files of the tiny model's shapes holding a NaN, an inf, an int32 J, a last block's J != I."""
    import reference_lens_files as ref
    from vocablens.lens.jacobian import JacobianLens
    from vocablens.lens.tuned import TunedLens

    lens = TunedLens(64, 2)
    with torch.no_grad():
        lens.bias[1, 3] = float("nan")
    lens.save(root / "lens-nan")
    state = ref.save_tuned_lens(root / "tl-inf", 64, 2, "")
    state["0.weight"][5, 5] = float("inf")
    torch.save(state, root / "tl-inf" / "params.pt")
    J = torch.eye(64)
    J[1, 2] = float("nan")
    ref.save_jacobian_lens(root / "jl-nan.pt", {0: J}, 4, 64)
    JacobianLens(torch.eye(64).repeat(2, 1, 1), [0, 1], 2).save(root / "jl-int", dtype=torch.int32)
    ref.save_jacobian_lens(root / "jl-last.pt", {0: torch.eye(64), 1: 2 * torch.eye(64)}, 4, 64)


@pytest.fixture(scope="session")
def tiny_lm(world):
    import vocablens

    return vocablens.load(str(world / "tiny"))


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


M = ["-m", "{m}"]

#: (id, argv, words the error line holds). ``{m}``: the tiny model directory, ``{d}``: the user's directory.
CLI = [
    # lens
    ("lens-k-zero", ["lens", "x", *M, "-k", "0"], "-k must be at least 1"),
    ("lens-k-negative", ["lens", "x", *M, "-k", "-3"], "-k must be at least 1"),
    ("lens-k-huge", ["lens", "x", *M, "-k", "100000"], "between 1 and V=300"),
    ("lens-k-wrong-type", ["lens", "x", *M, "-k", "three"], "Invalid value for '-k'"),
    ("lens-layer-out-of-range", ["lens", "x", *M, "--layers", "3"], "outside 0..2"),
    ("lens-layer-negative", ["lens", "x", *M, "--layers", "-1"], "outside 0..2"),
    ("lens-layers-not-ints", ["lens", "x", *M, "--layers", "a,b"], "comma-separated integers"),
    ("lens-position-out-of-range", ["lens", "x", *M, "--positions", "50"], "outside the prompt"),
    ("lens-positions-a-word", ["lens", "x", *M, "--positions", "middle"], "--positions takes last, all, or positions"),
    ("lens-tuned-lens-with-nan", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/lens-nan"],
     "lens.safetensors: lens tensor bias at layer 1 holds NaN"),
    ("lens-tuned-lens-library-with-inf", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/tl-inf"],
     "params.pt: lens tensor 0.weight (layer 0) holds inf"),
    ("lens-jacobian-lens-with-nan", ["lens", "x", *M, "--kind", "jacobian", "--lens", "{d}/jl-nan.pt"],
     "jl-nan.pt: lens tensor J[0] at block 0 (stream layer 1) holds NaN"),
    ("lens-jacobian-lens-int32", ["lens", "x", *M, "--kind", "jacobian", "--lens", "{d}/jl-int"],
     "lens tensor J is int32, not floating point"),
    ("lens-jacobian-last-block-not-identity", ["lens", "x", *M, "--kind", "jacobian", "--lens", "{d}/jl-last.pt"],
     "holds matrices for blocks 0..1 (d_model=64); the model has 2 blocks (0..1): its matrix for block 1"),
    ("lens-bad-kind", ["lens", "x", *M, "--kind", "bogus"], "--kind takes logit, tuned, jacobian, both or a comma list"),
    ("lens-missing-lens-dir", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/nolens"], "no tuned lens"),
    ("lens-file-as-lens-dir", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/notes.txt"], "no tuned lens"),
    ("lens-lens-of-another-model", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/otherlens"], "d_model=32"),
    ("lens-tuned-lens-file-of-another-model", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/tl-qwen"],
     "tuned lens was fitted for Qwen/Qwen2-0.5B but the model is tiny"),
    ("lens-tuned-lens-file-of-another-head", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/tl-hash"],
     "tuned-lens unembedding hash 000000000000); the model tiny is another model"),
    ("lens-jacobian-file-of-another-model", ["lens", "x", *M, "--kind", "jacobian", "--lens", "{d}/jl-qwen.pt"],
     "Jacobian lens was fitted for Qwen/Qwen2-0.5B (revision abc1234) but the model is tiny"),
    ("lens-text-file-as-model", ["lens", "x", "-m", "{d}/notes.txt"], "neither a model directory"),
    ("lens-dir-without-config", ["lens", "x", "-m", "{d}/sub"], "without config.json"),
    ("lens-missing-model", ["lens", "x", "-m", "{d}/nope"], "no such model"),
    ("lens-empty-prompt", ["lens", "", *M], "empty prompt"),
    ("lens-lone-surrogate", ["lens", SURROGATE, *M], "U+DCED"),
    ("lens-unknown-option", ["lens", "x", *M, "--bogus"], "No such option: --bogus"),
    ("lens-file-missing", ["lens", "--file", "{d}/nope.txt", *M], "no such file"),
    ("lens-file-empty", ["lens", "--file", "{d}/empty.txt", *M], "holds no prompts"),
    ("lens-file-not-utf8", ["lens", "--file", "{d}/latin1.txt", *M], "cannot read"),
    ("lens-prompt-and-file", ["lens", "x", "--file", "{d}/notes.txt", *M], "not both"),
    ("lens-file-position-past-a-prompt", ["lens", "--file", "{d}/notes.txt", "--positions", "500", *M], "outside the prompt"),
    # score
    ("score-missing-file", ["score", *M, "--file", "{d}/nofile.txt"], "no such file"),
    ("score-dir-as-file", ["score", *M, "--file", "{d}/sub"], "cannot read it"),
    ("score-empty-file", ["score", *M, "--file", "{d}/empty.txt"], "empty text"),
    ("score-not-utf8", ["score", *M, "--file", "{d}/latin1.txt"], "UTF-8"),
    ("score-k-negative", ["score", "x", *M, "-k", "-1"], "--top-k must be >= 0"),
    ("score-bad-special-text", ["score", "x", *M, "--special-text", "bogus"], "parse or plain"),
    ("score-no-text", ["score", *M], "give either TEXT or --file"),
    ("score-lone-surrogate", ["score", SURROGATE, *M], "U+DCED"),
    # neighbors
    ("neighbors-k-zero", ["neighbors", *M, "-k", "0", "the"], "-k must be at least 1"),
    ("neighbors-empty-token", ["neighbors", *M, ""], "empty token"),
    ("neighbors-lone-surrogate", ["neighbors", *M, SURROGATE], "U+DCED"),
    ("neighbors-no-token", ["neighbors", *M], "Missing argument"),
    # anatomy
    ("anatomy-batch-zero", ["anatomy", *M, "--batch", "0"], "at least 1"),
    ("anatomy-context-negative", ["anatomy", *M, "--context", "-5"], "at least 1"),
    ("anatomy-bad-dtype", ["anatomy", *M, "--dtype", "int8"], "unknown logits dtype"),
    ("anatomy-missing-model", ["anatomy", "{d}/nope"], "not a config file"),
    ("anatomy-batch-wrong-type", ["anatomy", *M, "--batch", "many"], "Invalid value for '--batch'"),
    # explain
    ("explain-position-out-of-range", ["explain", "x", *M, "--position", "99"], "outside the prompt"),
    ("explain-token-of-several-tokens", ["explain", "x", *M, "--token", " the class"], "5 tokens"),
    ("explain-k-zero", ["explain", "x", *M, "-k", "0"], "-k must be at least 1"),
    ("explain-subs-negative", ["explain", "x", *M, "--subs", "-1"], "sub-updates must be >= 0"),
    ("explain-lone-surrogate", ["explain", SURROGATE, *M], "U+DCED"),
    # settle
    ("settle-empty-corpus", ["settle", *M, "--corpus", "{d}/empty.txt"], "holds no text"),
    ("settle-unknown-corpus", ["settle", *M, "--corpus", "no-such-corpus"], "does not exist"),
    ("settle-threshold-above-one", ["settle", *M, "--corpus", "{d}/notes.txt", "--thresholds", "1.5"], "(0, 1]"),
    ("settle-min-layer-out-of-range", ["settle", *M, "--corpus", "{d}/notes.txt", "--min-layer", "9"], "0..2"),
    ("settle-seq-len-zero", ["settle", *M, "--corpus", "{d}/notes.txt", "--seq-len", "0"], "--seq-len >= 2"),
    ("settle-bad-lens", ["settle", *M, "--corpus", "{d}/notes.txt", "--lens", "bogus"], "logit or tuned"),
    ("settle-plot-exists", ["settle", *M, "--corpus", "{d}/notes.txt", "--plot", "{d}/exists.html"], "--force"),
    # project
    ("project-block-out-of-range", ["project", *M, "--block", "5"], "blocks 0..1"),
    ("project-neuron-out-of-range", ["project", *M, "--block", "0", "--neuron", "99999"], "neurons 0..95"),
    ("project-head-out-of-range", ["project", *M, "--block", "0", "--head", "9"], "heads 0..3"),
    ("project-bad-circuit", ["project", *M, "--block", "0", "--head", "0", "--circuit", "xy"], "ov or qk"),
    ("project-token-of-several-tokens", ["project", *M, "--token", " the class"], "5 tokens"),
    ("project-k-zero", ["project", *M, "-k", "0"], "-k must be at least 1"),
    # argmax, bottleneck
    ("argmax-bad-bias", ["argmax", *M, "--bias", "maybe"], "auto, on or off"),
    ("argmax-negative-budget", ["argmax", *M, "--budget", "-1"], ">= 0"),
    # no CUDA: "CUDA is not available here"; with a GPU: "this machine has N CUDA device(s)"
    ("argmax-device-absent", ["argmax", *M, "--device", "cuda:99"], "--device cuda:99"),
    ("bottleneck-contexts-below-d", ["bottleneck", *M, "--contexts", "5"], "must exceed d = 64"),
    ("bottleneck-empty-corpus", ["bottleneck", *M, "--corpus", "{d}/empty.txt"], "holds no text"),
    ("bottleneck-seq-len-zero", ["bottleneck", *M, "--seq-len", "0"], "at least 2"),
    ("bottleneck-plot-exists", ["bottleneck", *M, "--plot", "{d}/exists.html"], "--force"),
    # expand, trim
    ("expand-out-exists", ["expand", *M, "--out", "{d}/out", "--add", " zz"], "exists"),
    ("expand-no-tokens", ["expand", *M, "--out", "{d}/e1"], "no tokens to add"),
    ("expand-bad-init", ["expand", *M, "--out", "{d}/e2", "--add", " zz", "--init", "bogus", "--eval-text", "hi there"],
     "unknown --init"),
    ("expand-missing-add-file", ["expand", *M, "--out", "{d}/e3", "--add-file", "{d}/nofile"], "no such file"),
    ("expand-eval-texts-zero", ["expand", *M, "--out", "{d}/e4", "--add", " zz", "--eval-texts", "0"], "--eval-texts"),
    ("expand-interpolation-above-one", ["expand", *M, "--out", "{d}/e5", "--add", " zz", "--init", "interpolate",
                                        "--interpolation", "3", "--eval-text", "hello there"], "[0, 1]"),
    ("expand-token-twice", ["expand", *M, "--out", "{d}/e6", "--add", " zz", "--add", " zz", "--eval-text", "hi"],
     "twice"),
    ("trim-no-corpus", ["trim", *M, "--out", "{d}/t1"], "give --corpus"),
    ("trim-empty-corpus", ["trim", *M, "--out", "{d}/t2", "--corpus", "{d}/empty.txt"], "holds no text"),
    ("trim-unknown-corpus", ["trim", *M, "--out", "{d}/t3", "--corpus", "no-such-corpus"], "does not exist"),
    ("trim-missing-token-list", ["trim", *M, "--out", "{d}/t4", "--token-list", "{d}/nofile"], "no such file"),
    ("trim-negative-max-docs", ["trim", *M, "--out", "{d}/t5", "--corpus", "{d}/notes.txt", "--max-docs", "-1"],
     "must be >= 0"),
    ("trim-out-exists", ["trim", *M, "--out", "{d}/out", "--corpus", "{d}/notes.txt"], "exists"),
    ("trim-undertrained-candidates-zero", ["trim", *M, "--out", "{d}/t6", "--corpus", "{d}/notes.txt",
                                           "--drop-undertrained", "--undertrained-candidates", "0"],
     "--undertrained-candidates"),
    # report
    ("report-out-is-a-directory", ["report", *M, "--out", "{d}/sub"], "is a directory"),
    ("report-negative-budget", ["report", *M, "--budget", "-1", "--out", "{d}/r.html"], "positive number"),
    ("report-zero-budget", ["report", *M, "--budget", "0", "--out", "{d}/r.html"], "positive number"),
    ("report-missing-directory", ["report", *M, "--out", "{d}/no/dir/r.html"], "does not exist"),
    # generate
    ("generate-zero-tokens", ["generate", "x", *M, "-n", "0"], "at least 1"),
    ("generate-negative-tokens", ["generate", "x", *M, "-n", "-1"], "at least 1"),
    ("generate-negative-temperature", ["generate", "x", *M, "-t", "-1"], "--temperature must be >= 0"),
    ("generate-top-p-above-one", ["generate", "x", *M, "--top-p", "2"], "(0, 1]"),
    ("generate-top-k-zero", ["generate", "x", *M, "--top-k", "0"], "--top-k must be >= 1"),
    ("generate-bad-early-exit", ["generate", "x", *M, "--early-exit", "bogus"], "'logit' or 'tuned'"),
    ("generate-bad-exit-test", ["generate", "x", *M, "--exit-test", "bogus"], "'full' or 'candidates'"),
    ("generate-min-layer-out-of-range", ["generate", "x", *M, "--early-exit", "logit", "--min-layer", "99"], "1..2"),
    ("generate-lone-surrogate", ["generate", SURROGATE, *M], "U+DCED"),
    # steer
    ("steer-nothing-to-steer", ["steer", *M], "--promote"),
    ("steer-layers-out-of-range", ["steer", *M, "--promote", " the", "--layers", "9..10", "--prompt", "x"], "9..10"),
    ("steer-scale-nan", ["steer", *M, "--promote", " the", "--scale", "nan", "--prompt", "x"], "finite"),
    ("steer-bad-suppress-mode", ["steer", *M, "--suppress", " the", "--suppress-mode", "bogus", "--prompt", "x"],
     "boost or ablate"),
    ("steer-top-n-zero", ["steer", *M, "--promote", " the", "--top-n", "0", "--prompt", "x"], ">= 1"),
    ("steer-unknown-corpus", ["steer", *M, "--promote", " the", "--corpus", "no-such", "--new-tokens", "0"],
     "does not exist"),
    # align
    ("align-missing-model", ["align", "{m}", "{d}/nope"], "no such model"),
    ("align-bad-what", ["align", "{m}", "{m}", "--what", "bogus"], "ffn or heads"),
    ("align-block-out-of-range", ["align", "{m}", "{m}", "--blocks-a", "7"], "0..1"),
    # lens backward / fit-jacobian
    ("backward-empty-prompt", ["lens", "backward", "", *M, "--target", "5"], "empty prompt"),
    ("backward-missing-target", ["lens", "backward", "x", *M], "give the target as --target TEXT or --target-id N"),
    ("backward-target-and-target-id", ["lens", "backward", "x", *M, "--target", "5", "--target-id", "5"],
     "(one of them)"),
    ("backward-target-id-prefix-outside-vocab", ["lens", "backward", "x", *M, "--target", "id:5000"],
     "--target: token id 5000 is outside the vocabulary 0..299"),
    ("backward-target-id-prefix-not-a-number", ["lens", "backward", "x", *M, "--target", "id:five"],
     "--target 'id:five': id:N names a token by its id"),
    ("backward-target-several-tokens", ["lens", "backward", "x", *M, "--target", "5000"],
     "--target: '5000' is"),
    ("backward-k-zero", ["lens", "backward", "x", *M, "--target", "5", "-k", "0"], "-k must be at least 1"),
    ("backward-target-id-outside-vocab", ["lens", "backward", "x", *M, "--target-id", "5000"],
     "--target-id: token id 5000 is outside the vocabulary 0..299"),
    ("backward-position-out-of-range", ["lens", "backward", "x", *M, "--target", "5", "--position", "50"],
     "outside the prompt"),
    ("backward-missing-model", ["lens", "backward", "x", "-m", "{d}/nope", "--target", "5"], "no such model"),
    ("decompose-no-jacobian-lens", ["lens", "decompose", "x", *M, "--layer", "1"], "no Jacobian lens shipped for"),
    ("decompose-empty-prompt", ["lens", "decompose", "", *M, "--layer", "1"], "empty prompt"),
    ("merge-shards-not-there", ["lens", "merge", "{d}/nope1", "{d}/nope2", "--out", "{d}/merged"], "no Jacobian lens at"),
    ("fit-jacobian-bad-save-dtype", ["lens", "fit-jacobian", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/j1",
                                     "--save-dtype", "int8"], "float16, bfloat16 or float32"),
    ("fit-jacobian-seq-len-within-skip", ["lens", "fit-jacobian", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/j2",
                                          "--seq-len", "8"], "leaves no position after --skip-first 16"),
    ("fit-jacobian-max-tokens-below-seq-len", ["lens", "fit-jacobian", *M, "--corpus", "{d}/notes.txt", "--out",
                                               "{d}/j3", "--max-tokens", "10"], "less than one prompt"),
    ("fit-jacobian-out-is-a-file", ["lens", "fit-jacobian", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/notes.txt"],
     "not a directory"),
    ("fit-jacobian-empty-corpus", ["lens", "fit-jacobian", *M, "--corpus", "{d}/empty.txt", "--out", "{d}/j4"],
     "holds no text"),
    # lens train / eval / anomaly
    ("train-empty-corpus", ["lens", "train", *M, "--corpus", "{d}/empty.txt", "--out", "{d}/l1"], "holds no text"),
    ("train-unknown-corpus", ["lens", "train", *M, "--corpus", "no-such", "--out", "{d}/l1"], "does not exist"),
    ("train-zero-steps", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l2", "--steps", "0"],
     "--steps must be at least 1"),
    ("train-bad-loss", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l3", "--loss", "bogus"],
     "kl or ce"),
    ("train-negative-lr", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l4", "--lr", "-1"],
     "positive"),
    ("train-bad-gemm-dtype", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l5",
                              "--gemm-dtype", "int8"], "float32 or bfloat16"),
    ("train-bad-save-dtype", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l6",
                              "--save-dtype", "int8"], "float32 or bfloat16"),
    ("train-val-fraction-above-one", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l7",
                                      "--val-fraction", "1.5"], "[0, 1)"),
    ("train-out-is-a-file", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/notes.txt"],
     "not a directory"),
    ("train-resume-without-checkpoint", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l8",
                                         "--resume", "--seq-len", "16"], "no checkpoint"),
    ("eval-missing-lens", ["lens", "eval", *M, "--lens", "{d}/nolens", "--corpus", "{d}/notes.txt"], "no tuned lens"),
    ("eval-tuned-lens-file-of-another-model", ["lens", "eval", *M, "--lens", "{d}/tl-qwen", "--corpus",
                                               "{d}/notes.txt"], "fitted for Qwen/Qwen2-0.5B but the model is tiny"),
    ("eval-empty-dir-as-lens", ["lens", "eval", *M, "--lens", "{d}/sub", "--corpus", "{d}/notes.txt"], "no tuned lens"),
    ("eval-bad-split", ["lens", "eval", *M, "--corpus", "{d}/notes.txt", "--split", "bogus"],
     "validation, train or all"),
    ("anomaly-missing-normal", ["lens", "anomaly", *M, "--normal", "{d}/nofile", "--test", "{d}/notes.txt",
                                "--kind", "logit"], "no such file"),
    ("anomaly-empty-normal", ["lens", "anomaly", *M, "--normal", "{d}/empty.txt", "--test", "{d}/notes.txt",
                              "--kind", "logit"], "no inputs"),
    ("anomaly-bad-kind", ["lens", "anomaly", *M, "--normal", "{d}/notes.txt", "--test", "{d}/notes.txt",
                          "--kind", "bogus"], "logit, tuned or both"),
    ("anomaly-bad-detector", ["lens", "anomaly", *M, "--normal", "{d}/notes.txt", "--test", "{d}/notes.txt",
                              "--kind", "logit", "--detector", "bogus"], "iforest, lof or both"),
    # serve (option parsing only: nothing binds)
    ("serve-negative-port", ["serve", *M, "--port", "-1"], "0..65535"),
    ("serve-port-too-large", ["serve", *M, "--port", "70000"], "0..65535"),
    ("serve-zero-max-tokens", ["serve", *M, "--max-tokens", "0"], "at least 1"),
    ("serve-missing-undertrained", ["serve", *M, "--port", "0", "--undertrained", "{d}/nofile"], "no such file"),
    ("serve-undertrained-not-json", ["serve", *M, "--port", "0", "--undertrained", "{d}/notes.txt"], "not JSON"),
    ("unknown-command", ["tokenize", "x"], "No such command"),
]


# ------------------------------------------------- server helper (issue 24): more commands, --out targets kept
#: (id, argv, words): every command again, and each command that writes a file refusing an existing target
#: (``{d}/exists.html``, ``{d}/out``) with it left byte for byte as it was.
CLI_SERVE_HELPER = [
    ("lens-show-k-zero", ["lens", "show", "x", *M, "-k", "0"], "-k must be at least 1"),
    ("report-bad-budget-existing-out", ["report", *M, "--budget", "-1", "--out", "{d}/exists.html"], "positive number"),
    ("report-lens-of-another-model", ["report", *M, "--out", "{d}/r2.html", "--lens", "{d}/otherlens"], "d_model=32"),
    ("steer-save-exists", ["steer", *M, "--promote", " the", "--save", "{d}/exists.html", "--prompt", "x"], "--force"),
    ("steer-save-is-a-directory", ["steer", *M, "--promote", " the", "--save", "{d}/out", "--prompt", "x"], "--force"),
    ("steer-missing-heldout", ["steer", *M, "--promote", " the", "--heldout", "{d}/nofile", "--prompt", "x"],
     "does not exist"),
    ("eval-plot-exists", ["lens", "eval", *M, "--lens", "{d}/lens64", "--corpus", "{d}/notes.txt", "--plot",
                          "{d}/exists.html"], "--force"),
    ("eval-seq-len-one", ["lens", "eval", *M, "--lens", "{d}/lens64", "--corpus", "{d}/notes.txt", "--seq-len", "1"],
     "at least 2"),
    ("expand-out-is-a-file", ["expand", *M, "--out", "{d}/exists.html", "--add", " zz"], "--force"),
    ("expand-eval-chars-zero", ["expand", *M, "--out", "{d}/e9", "--add", " zz", "--eval-chars", "0"],
     "--eval-chars >= 10"),
    ("trim-out-is-a-file", ["trim", *M, "--out", "{d}/exists.html", "--corpus", "{d}/notes.txt"], "--force"),
    ("train-existing-out-bad-steps", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/out",
                                      "--steps", "0"], "--steps must be at least 1"),
    ("train-bad-init", ["lens", "train", *M, "--corpus", "{d}/notes.txt", "--out", "{d}/l9", "--init", "bogus"],
     "zero or regression"),
    ("neighbors-k-huge", ["neighbors", *M, "-k", "100000", "the"], "between 1 and 298"),
    ("anatomy-context-wrong-type", ["anatomy", *M, "--context", "many"], "Invalid value for '--context'"),
    ("argmax-budget-nan", ["argmax", *M, "--budget", "nan"], "got nan"),
    ("undertrained-negative-candidates", ["undertrained", *M, "--candidates", "-3"], "--candidates must be >= 0"),
    ("undertrained-argmax-file-missing", ["undertrained", *M, "--argmax", "{d}/no-scan.json"], "no-scan.json"),
    ("align-blocks-b-not-a-range", ["align", "{m}", "{m}", "--blocks-b", "x"], "'A..B'"),
    ("settle-batch-zero", ["settle", *M, "--corpus", "{d}/notes.txt", "--batch", "0"], "--batch >= 1"),
    ("project-sample-zero", ["project", *M, "--block", "0", "--sample", "0", "--keys"], "--sample must be"),
    ("project-interpretable-negative", ["project", *M, "--interpretable", "-1"], "--interpretable must be >= 1"),
    ("explain-position-wrong-type", ["explain", "x", *M, "--position", "last"], "Invalid value for '--position'"),
    ("explain-token-and-token-id", ["explain", "x", *M, "--token", "5", "--token-id", "5"], "not both"),
    ("explain-token-id-outside-vocab", ["explain", "x", *M, "--token-id", "300"],
     "--token-id: token id 300 is outside the vocabulary 0..299"),
    ("project-token-id-prefix-outside-vocab", ["project", *M, "--token", "id:300"],
     "--token: token id 300 is outside the vocabulary 0..299"),
    ("score-top-k-wrong-type", ["score", "x", *M, "--top-k", "many"], "Invalid value for '--top-k'"),
    ("bottleneck-bad-max-memory", ["bottleneck", *M, "--max-memory", "lots"], "--max-memory takes a size"),
    ("anomaly-missing-test", ["lens", "anomaly", *M, "--normal", "{d}/notes.txt", "--test", "{d}/nofile",
                              "--kind", "logit"], "no such file"),
    # serve: each fails before it serves (port 0 binds anywhere, so only the case's fault is left)
    ("serve-host-not-this-machine", ["serve", *M, "--host", "8.8.8.8", "--port", "0"], "cannot listen on 8.8.8.8"),
    ("serve-missing-model", ["serve", "-m", "{d}/nope", "--port", "0"], "no such model"),
    ("serve-lens-of-another-model", ["serve", *M, "--port", "0", "--lens", "{d}/otherlens", "--no-argmax"],
     "d_model=32"),
    ("serve-port-wrong-type", ["serve", *M, "--port", "http"], "Invalid value for '--port'"),
]


def _ids(lm, text="The class statement"):
    return lm.tokenizer(text, return_tensors="pt").input_ids


def _api_cases():
    """(id, call(world, lm), expected error class, words in the message)."""
    import vocablens

    return [
        ("load-missing-dir", lambda d, lm: vocablens.load(str(d / "nope")), ModelNotFound, "no such"),
        ("load-text-file", lambda d, lm: vocablens.load(str(d / "notes.txt")), ModelNotFound, "neither"),
        ("load-missing-gguf", lambda d, lm: vocablens.load(str(d / "x.gguf")), ModelNotFound, "no such GGUF"),
        ("load-bad-dtype", lambda d, lm: vocablens.load(str(d / "tiny"), dtype="int8"), BadInput, "int8"),
        ("logit-lens-k-zero", lambda d, lm: vocablens.logit_lens(lm.borders, _ids(lm), k=0), BadInput, "k"),
        ("logit-lens-layer-out-of-range", lambda d, lm: vocablens.logit_lens(lm.borders, _ids(lm), layers=[7]),
         BadInput, "layer 7"),
        ("logit-lens-position-out-of-range", lambda d, lm: vocablens.logit_lens(lm.borders, _ids(lm), positions=[99]),
         BadInput, "99"),
        ("logit-lens-ids-out-of-vocab", lambda d, lm: vocablens.logit_lens(lm.borders, torch.tensor([[5, 300]])),
         BadInput, "300"),
        ("tuned-lens-zero-layers", lambda d, lm: vocablens.TunedLens(64, 0), BadInput, "n_layers >= 1"),
        ("tuned-lens-of-another-model", lambda d, lm: vocablens.TunedLens.load(d / "otherlens", lm.borders),
         CheckpointMismatch, "d_model=32"),
        ("tuned-lens-missing", lambda d, lm: vocablens.TunedLens.load(d / "sub"), BadInput, "no tuned lens"),
        ("neighbors-k-zero", lambda d, lm: vocablens.nearest_neighbors(lm.borders, lm.tokenizer, [" the"], k=0),
         BadInput, "k"),
        ("neighbors-surrogate", lambda d, lm: vocablens.nearest_neighbors(lm.borders, lm.tokenizer, [SURROGATE]),
         BadInput, "U+DCED"),
        ("token-logprobs-shape", lambda d, lm: vocablens.token_logprobs(torch.zeros(3, 8), torch.zeros(10, 9)),
         ShapeMismatch, "8"),
        ("token-logprobs-target-out-of-range",
         lambda d, lm: vocablens.token_logprobs(torch.zeros(3, 8), torch.zeros(10, 8), torch.tensor([0, 1, 10])),
         BadInput, "10"),
        ("cross-entropy-bad-reduction",
         lambda d, lm: vocablens.linear_cross_entropy(torch.zeros(3, 8), torch.zeros(10, 8), torch.tensor([0, 1, 2]),
                                                      reduction="bogus"), BadInput, "bogus"),
        ("cross-entropy-target-shape",
         lambda d, lm: vocablens.linear_cross_entropy(torch.zeros(3, 8), torch.zeros(10, 8), torch.tensor([0, 1])),
         ShapeMismatch, "3"),
        ("expand-empty-list", lambda d, lm: vocablens.expand_vocab(lm.model, lm.tokenizer, []), BadInput, "token"),
        ("expand-existing-token", lambda d, lm: vocablens.expand_vocab(lm.model, lm.tokenizer, [" the"]),
         BadInput, "the"),
        ("explain-position-out-of-range", lambda d, lm: vocablens.explain(lm.borders, _ids(lm), position=99),
         BadInput, "99"),
        ("explain-token-out-of-vocab", lambda d, lm: vocablens.explain(lm.borders, _ids(lm), token_id=10**6),
         BadInput, str(10**6)),
        ("settle-threshold-zero", lambda d, lm: vocablens.settle(lm.borders, _ids(lm), thresholds=[0.0]),
         BadInput, "thresholds"),
        ("score-ids-empty", lambda d, lm: vocablens.score_ids(lm.borders, torch.zeros(1, 0, dtype=torch.long)),
         BadInput, "0 token"),
        ("anatomy-of-missing", lambda d, lm: vocablens.anatomy_of(str(d / "nope")), ModelNotFound, "nope"),
        ("search-token-out-of-vocab", lambda d, lm: vocablens.search_token(lm.borders, 10**6), BadInput, str(10**6)),
        ("lens-float-ids", lambda d, lm: lm.lens(torch.tensor([5.0, 6.5])), BadInput, "got dtype float32"),
        ("lens-bool-ids", lambda d, lm: lm.lens(torch.tensor([True, False])), BadInput, "got dtype bool"),
        ("lens-ids-past-the-context", lambda d, lm: lm.lens(torch.full((129,), 5)), BadInput,
         "more than the model's context of 128"),
        ("lens-positions-a-word", lambda d, lm: lm.lens("x y", positions="middle"), BadInput,
         "positions takes last, all"),
        ("score-a-batch-of-ids", lambda d, lm: lm.score(torch.ones(2, 4, dtype=torch.long)), BadInput,
         "ids of 2 prompts"),
        ("score-complex-ids", lambda d, lm: lm.score(torch.ones(4, dtype=torch.complex64)), BadInput,
         "got dtype complex64"),
        ("tuned-lens-with-nan", lambda d, lm: vocablens.TunedLens.load(d / "lens-nan", lm.borders),
         NonFiniteWeights, "holds NaN"),
        ("jacobian-lens-int32", lambda d, lm: lm.load_jacobian_lens(d / "jl-int"), CorruptModelFile,
         "not floating point"),
        ("token-id-prefix-not-a-number", lambda d, lm: lm.token_id("id:x"), BadInput, "id:N names a token"),
    ]




def _all_cases():
    cases = [pytest.param("cli", argv, words, None, id=f"cli-{name}") for name, argv, words in CLI + CLI_SERVE_HELPER]
    cases += [pytest.param("api", call, words, exc, id=f"api-{name}") for name, call, exc, words in _api_cases()]
    return cases


def test_catalogue_size():
    assert len(CLI) + len(CLI_SERVE_HELPER) + len(_api_cases()) + len(SERVE) >= 80
    for ids in ([c[0] for c in CLI + CLI_SERVE_HELPER], [c[0] for c in SERVE]):
        assert len(ids) == len(set(ids)), "a case id is used twice"


def _commands() -> set[str]:
    """Every ``vocablens`` command, as ``vocablens --help`` lists them, and the ``lens`` subcommands."""
    from vocablens.cli import app
    from vocablens.cli.core import lens_app

    top = {c.name or c.callback.__name__ for c in app.registered_commands}
    top |= {g.name for g in app.registered_groups}
    return top | {f"lens {c.name or c.callback.__name__}" for c in lens_app.registered_commands}


def test_catalogue_covers_every_command_and_endpoint():
    from vocablens.serve.app import create_app  # noqa: F401  (the routes below are the app's own)

    covered = set()
    for _, argv, _ in CLI + CLI_SERVE_HELPER:
        covered.add(argv[0])
        if argv[0] == "lens":  # `lens PROMPT` is `lens show PROMPT`
            covered.add(f"lens {argv[1]}" if f"lens {argv[1]}" in _commands() else "lens show")
    missing = _commands() - covered
    assert not missing, f"commands without a bad-input case: {sorted(missing)}"
    assert {path for _, _, path, *_ in SERVE} >= set(ENDPOINTS)


@pytest.mark.parametrize("kind, what, words, exc_type", _all_cases())
def test_bad_input(kind, what, words, exc_type, world, tiny_lm, capsys):
    from vocablens.cli.common import run_app

    before = _digest(world)
    if kind == "cli":
        argv = [a.replace("{m}", str(world / "tiny")).replace("{d}", str(world)) for a in what]
        capsys.readouterr()
        code = run_app(argv)
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert code == 2, (argv, code, err)
        assert len(errors) == 1 and len(errors[0]) > len("error: "), err
        assert "Traceback" not in err + out and out == "", (out, err)
        assert words.replace("{d}", str(world)) in errors[0], errors[0]
    else:
        with pytest.raises(VocabLensError) as info:
            what(world, tiny_lm)
        assert isinstance(info.value, exc_type), (type(info.value), info.value)
        msg = str(info.value)
        assert msg and "\n" not in msg and words in msg, msg
    assert _digest(world) == before, "the user's files changed"


# ------------------------------------------------------------------ hardening (issue 24): markup, damaged weights
#: (id, argv, words the error line holds). ``{nan}`` / ``{inf}``: tiny models with a NaN embedding value
#: and an inf block weight; ``{m}``, ``{d}`` as above.
HARDENING_CLI = [
    ("markup-anatomy-closing-tag", ["anatomy", "[/x]"], "'[/x]'"),
    ("markup-anatomy-bold-and-backslash", ["anatomy", "a[/bold]\\b[x]"], "[/bold]"),
    ("markup-model-path", ["lens", "x", "-m", "{d}/no[/bold]dir"], "no[/bold]dir"),
    ("markup-lens-path", ["lens", "x", *M, "--kind", "tuned", "--lens", "{d}/[/bold]lens"], "[/bold]lens"),
    ("markup-corpus-path", ["settle", *M, "--corpus", "{d}/[/x]\\[y].txt"], "[/x]"),
    ("markup-score-file", ["score", *M, "--file", "{d}/[dim]x[/dim].txt"], "[dim]x[/dim].txt"),
    ("markup-neighbors-surrogate-brackets", ["neighbors", *M, "[/x]" + SURROGATE], "U+DCED"),
    ("nonfinite-report-nan-embedding", ["report", "-m", "{nan}", "--out", "{d}/never.html"], "NaN or inf"),
    ("nonfinite-report-inf-block", ["report", "-m", "{inf}", "--out", "{d}/never.html"], "NaN or inf"),
    ("nonfinite-lens-inf-block", ["lens", "x", "-m", "{inf}"], "down_proj"),
    ("nonfinite-neighbors-nan-embedding", ["neighbors", "-m", "{nan}", "the"], "embed_tokens"),
    ("nonfinite-generate-nan-embedding", ["generate", "x", "-m", "{nan}", "-n", "2"], "NaN or inf"),
    ("nonfinite-bottleneck-inf-block", ["bottleneck", "-m", "{inf}"], "NaN or inf"),
    ("nonfinite-trim-inf-block", ["trim", "-m", "{inf}", "--corpus", "{d}/notes.txt", "--out", "{d}/t9"],
     "NaN or inf"),
    ("anomaly-six-copies-of-one-line", ["lens", "anomaly", *M, "--normal", "{d}/copies.txt", "--test",
                                        "{d}/notes.txt", "--kind", "logit"], "5 distinct inputs"),
]


@pytest.fixture(scope="session")
def damaged_models(tmp_path_factory):
    """Tiny models whose checkpoints hold a NaN (embedding) or an inf (a block's down_proj)."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("damaged")
    tok = tiny_tokenizer()
    for name, part, value in (("nan", "embed_tokens", float("nan")), ("inf", "layers.1.mlp.down_proj", float("inf"))):
        save_tiny(root / name, tok)
        f = root / name / "model.safetensors"
        sd = load_file(f)
        sd[next(k for k in sorted(sd) if part in k)][3, 0] = value
        save_file(sd, f, metadata={"format": "pt"})
    return root


@pytest.mark.parametrize("argv, words", [pytest.param(a, w, id=f"cli-{n}") for n, a, w in HARDENING_CLI])
def test_hardening_bad_input(argv, words, world, damaged_models, capsys):
    from vocablens.cli.common import run_app

    (world / "copies.txt").write_text("The class statement defines a new type.\n" * 6)
    before = _digest(world), _digest(damaged_models)
    argv = [a.replace("{m}", str(world / "tiny")).replace("{d}", str(world))
            .replace("{nan}", str(damaged_models / "nan")).replace("{inf}", str(damaged_models / "inf")) for a in argv]
    capsys.readouterr()
    code = run_app(argv)
    out, err = capsys.readouterr()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2, (argv, code, err)
    assert len(errors) == 1 and "Traceback" not in err + out and out == "", (out, err)
    assert words in errors[0], errors[0]
    assert (_digest(world), _digest(damaged_models)) == before, "the user's files changed"


def test_detector_needs_five_distinct_inputs():
    from vocablens.lens.anomaly import fit_detector

    X = torch.randn(1, 6).repeat(6, 1)  # six copies of one input used to fit (LOF scores up to 1.5e10)
    with pytest.raises(BadInput, match=r"5 distinct normal inputs; got 6 \(1 distinct\)"):
        fit_detector(X, "lof")
    X[:5] += torch.arange(5.0)[:, None]  # 5 distinct rows: fits
    fit_detector(X, "lof")


# ------------------------------------------------------------- server helper (issue 24): every endpoint
LONG_TOKEN = "x" * 1025           # one over serve.app.MAX_TOKEN_CHARS
LONG_PROMPT = "y" * (32 * 16 + 1)  # one over the character cap of a --max-tokens 16 server
PR = "The class statement"
ENDPOINTS = ["/api/health", "/api/lens", "/api/trajectory", "/api/explain", "/api/neighbors", "/api/project",
             "/api/argmax"]

#: (id, method, path, JSON body (or raw bytes), status, words in the error line, extra headers)
SERVE = [
    ("lens-empty-prompt", "POST", "/api/lens", {"prompt": ""}, 400, "empty prompt", {}),
    ("lens-blank-prompt", "POST", "/api/lens", {"prompt": "   "}, 400, "empty prompt", {}),
    ("lens-too-many-tokens", "POST", "/api/lens", {"prompt": "the " * 40}, 400, "at most 16 tokens", {}),
    ("lens-over-the-character-cap", "POST", "/api/lens", {"prompt": LONG_PROMPT}, 422, "at most 16 tokens", {}),
    ("lens-lone-surrogate", "POST", "/api/lens", b'{"prompt": "x\\ud800y"}', 422, "not valid Unicode", {}),
    ("lens-k-zero", "POST", "/api/lens", {"prompt": PR, "k": 0}, 422, "k:", {}),
    ("lens-k-over-50", "POST", "/api/lens", {"prompt": PR, "k": 51}, 422, "k:", {}),
    ("lens-k-string", "POST", "/api/lens", {"prompt": PR, "k": "5"}, 422, "k:", {}),
    ("lens-k-bool", "POST", "/api/lens", {"prompt": PR, "k": True}, 422, "k:", {}),
    ("lens-k-fraction", "POST", "/api/lens", {"prompt": PR, "k": 2.5}, 422, "k:", {}),
    ("lens-bad-kind", "POST", "/api/lens", {"prompt": PR, "kind": "sideways"}, 422, "kind:", {}),
    ("lens-chat-string", "POST", "/api/lens", {"prompt": PR, "chat": "yes"}, 422, "chat:", {}),
    ("lens-prompt-number", "POST", "/api/lens", {"prompt": 42}, 422, "prompt:", {}),
    ("lens-extra-field", "POST", "/api/lens", {"prompt": PR, "extra": 1}, 422, "extra", {}),
    ("lens-array-body", "POST", "/api/lens", [PR], 422, "JSON object", {}),
    ("lens-not-json", "POST", "/api/lens", b"{not json", 422, "not valid JSON", {}),
    ("lens-empty-body", "POST", "/api/lens", b"", 422, "JSON object", {}),
    ("lens-huge-number", "POST", "/api/lens", b'{"prompt": "x", "k": ' + b"9" * 5000 + b"}", 400, "JSON", {}),
    ("lens-body-over-the-cap", "POST", "/api/lens", b'{"prompt": "' + b"z" * 60_000 + b'"}', 413, "bytes", {}),
    ("lens-content-length-over-the-cap", "POST", "/api/lens", b"{}", 413, "200000000 bytes",
     {"content-length": "200000000"}),
    ("lens-foreign-host", "POST", "/api/lens", {"prompt": PR}, 421, "DNS rebinding", {"host": "evil.example.com"}),
    ("lens-get", "GET", "/api/lens", None, 405, "Method Not Allowed", {}),
    ("trajectory-position-out-of-range", "POST", "/api/trajectory", {"prompt": PR, "position": 99, "token": " the"},
     400, "outside the prompt", {}),
    ("trajectory-several-tokens", "POST", "/api/trajectory", {"prompt": PR, "token": " the class"}, 400,
     "give a single token", {}),
    ("trajectory-no-token", "POST", "/api/trajectory", {"prompt": PR}, 422, "token:", {}),
    ("trajectory-token-over-the-cap", "POST", "/api/trajectory", {"prompt": PR, "token": LONG_TOKEN}, 422,
     "token:", {}),
    ("trajectory-token-id-outside", "POST", "/api/trajectory", {"prompt": PR, "token": 10 ** 9}, 400,
     "outside the vocabulary", {}),
    ("trajectory-position-fraction", "POST", "/api/trajectory", {"prompt": PR, "token": " the", "position": 1.5},
     422, "position:", {}),
    ("explain-position-out-of-range", "POST", "/api/explain", {"prompt": PR, "position": -99}, 400,
     "outside the prompt", {}),
    ("explain-target-several-tokens", "POST", "/api/explain", {"prompt": PR, "target": " the class"}, 400,
     "give a single token", {}),
    ("explain-target-over-the-cap", "POST", "/api/explain", {"prompt": PR, "target": LONG_TOKEN}, 422,
     "target:", {}),
    ("explain-target-list", "POST", "/api/explain", {"prompt": PR, "target": [1, 2]}, 422, "target:", {}),
    ("explain-prompt-over-the-cap", "POST", "/api/explain", {"prompt": LONG_PROMPT}, 422, "--max-tokens", {}),
    ("neighbors-empty-token", "POST", "/api/neighbors", {"token": ""}, 400, "empty token", {}),
    ("neighbors-several-tokens", "POST", "/api/neighbors", {"token": " the class"}, 400, "give a single token", {}),
    ("neighbors-token-over-the-cap", "POST", "/api/neighbors", {"token": LONG_TOKEN}, 422, "token:", {}),
    ("neighbors-token-bool", "POST", "/api/neighbors", {"token": True}, 422, "token:", {}),
    ("neighbors-negative-id", "POST", "/api/neighbors", {"token": -1}, 400, "outside the vocabulary", {}),
    ("neighbors-k-over-200", "POST", "/api/neighbors", {"token": " the", "k": 201}, 422, "k:", {}),
    ("neighbors-lone-surrogate", "POST", "/api/neighbors", b'{"token": "\\udced"}', 422, "not valid Unicode", {}),
    ("project-several-tokens", "POST", "/api/project", {"token": " the class"}, 400, "give a single token", {}),
    ("project-id-outside", "POST", "/api/project", {"token": 300}, 400, "outside the vocabulary", {}),
    ("project-k-zero", "POST", "/api/project", {"token": " the", "k": 0}, 422, "k:", {}),
    ("argmax-empty-token", "POST", "/api/argmax", {"token": ""}, 400, "empty token", {}),
    ("argmax-no-token", "POST", "/api/argmax", {}, 422, "token:", {}),
    ("argmax-several-tokens", "POST", "/api/argmax", {"token": " the class"}, 400, "give a single token", {}),
    ("argmax-token-null", "POST", "/api/argmax", {"token": None}, 422, "token:", {}),
    ("health-post", "POST", "/api/health", {}, 405, "Method Not Allowed", {}),
    ("health-foreign-host", "GET", "/api/health", None, 421, "DNS rebinding", {"host": "attacker.test:8765"}),
    ("unknown-endpoint", "GET", "/api/tokenize", None, 404, "Not Found", {}),
    ("path-outside-the-assets", "GET", "/static/../pyproject.toml", None, 404, "Not Found", {}),
]


@pytest.fixture(scope="module")
def served(world, tiny_lm):
    """The explorer app on the tiny model (lens64 as its tuned lens; argmax scan finished)."""
    from serve_tiny import CountingLock, client
    from vocablens.serve import ServerState, create_app

    state = ServerState(tiny_lm, model_spec=str(world / "tiny"), lens_path=str(world / "lens64"), max_tokens=16)
    state.lock = CountingLock()
    state.start()
    assert state.argmax.wait(300)
    yield state, client(create_app(state))
    state.argmax.cancel()


@pytest.mark.parametrize("method, path, body, status, words, headers",
                         [pytest.param(*c[1:], id=f"serve-{c[0]}") for c in SERVE])
def test_bad_request(method, path, body, status, words, headers, world, served):
    import json

    state, c = served
    before = _digest(world)
    kw = {"content": body} if isinstance(body, bytes) else {} if body is None else {"json": body}
    hdrs = {"content-type": "application/json", **headers} if body is not None else dict(headers)
    n = state.forward_passes
    r = c.request(method, path, headers=hdrs, **kw)
    assert r.status_code == status, (path, body if not isinstance(body, bytes) else body[:80], r.status_code, r.text)
    d = json.loads(r.text)
    assert list(d) == ["error"] and isinstance(d["error"], str) and d["error"], d
    assert "\n" not in d["error"] and "Traceback" not in r.text and words in d["error"], d["error"]
    assert state.forward_passes == n  # a refused request runs no forward pass
    assert _digest(world) == before, "the user's files changed"
