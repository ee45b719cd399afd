import os
import tempfile
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# the helpers (tiny_models, tiny_dirs, workers) live here; tests import each other by module name
# across the three kinds (tests/unit: tensors and tiny models; tests/integration: the real default
# model in-process; tests/e2e: subprocesses, the server, the browser)
for _d in ("e2e", "integration", "unit", ""):
    sys.path.insert(0, str(Path(__file__).parent / _d))
# transformers imports the quantizers' packages (torchao) with every model when they are installed; their
# import-time WARNING lines would land in whichever test imports first (the CLI quiets them the same way:
# vocablens.cli.quiet_import_noise; the library, for the duration of a load: vocablens.handle.quiet)
import logging  # noqa: E402

from vocablens.handle.quiet import IMPORT_NOISE  # noqa: E402

for _n in IMPORT_NOISE:
    logging.getLogger(_n).setLevel(logging.ERROR)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# argmax verdicts stored by this run stay in a directory of its own (subprocesses inherit it): a scan
# stored by an earlier run or by the user must never answer a test that asks for a fresh scan
os.environ.setdefault("VOCABLENS_ARGMAX_CACHE", tempfile.mkdtemp(prefix="vocablens-test-argmax-"))


# hypothesis draws the same examples on every machine and run (a test's examples follow from its own
# source): CI replays what passed here. Random draws: HYPOTHESIS_PROFILE=default, with --hypothesis-seed=N.
settings.register_profile("vocablens", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vocablens"))

#: fixtures that load the real default model: a test using one is ``slow``
_REAL_MODEL_FIXTURES = {"smollm2", "cli"}


#: the contributors' fast subset (``python -m pytest -q -m fast``, README): the structural checks and
#: each layer's core oracles (the readout against the model's own logits, log-probabilities, KL, the
#: lenses, tokens, argmax, surgery, sampling, the handle), on tiny random models; chosen from measured
#: durations (see README for its time), never a test that loads the real model
FAST_MODULES = frozenset({
    "test_function_length", "test_import_graph", "test_docstrings", "test_naming", "test_unembed", "test_kl",
    "test_ops_logprobs", "test_ops_exact", "test_logit_lens", "test_lens_oracle", "test_tokens", "test_readout_found",
    "test_cli_words", "test_result_tables_print", "test_properties", "test_hooks_restore", "test_nonfinite",
})


def pytest_collection_modifyitems(config, items):
    """Mark every test that loads the real model as ``slow`` (``-m "not slow"`` skips them all):
    those using a real-model fixture here; tests that load it otherwise carry the marker themselves.
    The tests of :data:`FAST_MODULES` that are not slow are marked ``fast``."""
    for item in items:
        if _REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.path.stem in FAST_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def smollm2():
    """The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF, dequantized), loaded once per session."""
    import vocablens

    m = vocablens.load("smollm2")
    if not m.provenance.loaded_from and os.environ.get("VOCABLENS_CACHE", "").lower() != "off":
        # a cold cache (a fresh machine, as in CI): this load dequantized the GGUF and wrote the float32
        # cache that every later load reads (the CLI's, the explorer's); the session's model is read from
        # it too, so their provenance (`loaded_from`) and their rounding are the same as theirs
        m = vocablens.load("smollm2")
    return m


@pytest.fixture
def cli(monkeypatch, capsys, smollm2):
    """Run the CLI in-process: ``code, stdout, stderr = cli("lens", "text", "--json")``.

    ``--model smollm2`` (the default) reuses the session's loaded model instead of loading it again;
    other specs load normally.
    """
    from vocablens.cli.common import run_app
    from vocablens.models.files import loader

    real_load_mode = loader.load_mode

    def load_mode(spec="smollm2", mode="full", **kw):  # the CLI loads through load_mode (cli.common.load_model)
        if str(spec) == "smollm2" and mode == "full" and all(v in (None, "", "cpu", False) for v in kw.values()):
            return smollm2
        return real_load_mode(spec, mode, **kw)

    monkeypatch.setattr(loader, "load_mode", load_mode)

    def run(*args):
        capsys.readouterr()
        code = run_app([str(a) for a in args])
        o = capsys.readouterr()
        return code, o.out, o.err

    return run


def pytest_terminal_summary(terminalreporter):
    """The family sweep's tally (tests/unit/test_readout_families.py: built / refused / not built tiny,
    with why), shown in every output mode, ``-q`` included, when the sweep ran."""
    mod = next((m for n, m in list(sys.modules.items()) if n.rsplit(".", 1)[-1] == "test_readout_families"), None)
    lines = mod.tally_lines() if mod is not None and hasattr(mod, "tally_lines") else []
    if lines:
        terminalreporter.section("families")
        for line in lines:
            terminalreporter.write_line(line)
