"""A load through the library prints nothing of the packages transformers imports with a model, and
leaves the process's logging as it found it (``vocablens.load``'s docstring: logging is silenced for
the duration of the load only).

Failed before: in a fresh interpreter with torchao installed (the ``test`` and ``quantized`` extras),
``vocablens.load(...)`` printed four lines on stderr (torchao's kernels built for another torch, two
pytree deprecations); the CLI quieted them for its whole process, the library not at all.

Oracle: a fresh interpreter (the tests' own process has these loggers quieted by conftest), its stderr
and the loggers' levels after the load, read back.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tiny_dirs import save_tiny, tiny_tokenizer


def test_a_load_prints_no_import_noise_and_puts_the_loggers_back(tmp_path):
    d = save_tiny(tmp_path / "m", tiny_tokenizer())
    code = ("import logging, vocablens\n"
            "logging.getLogger('torchao').setLevel(logging.INFO)  # the caller's own setting\n"
            f"lm = vocablens.load({str(d)!r})\n"
            "print(logging.getLogger('torchao').level, logging.getLogger('torch.utils._pytree').level)\n")
    env = {**os.environ, "VOCABLENS_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["20", "0"]  # INFO as the caller set it, NOTSET as it was
    assert "Failed to load" not in r.stderr and "register_constant" not in r.stderr, r.stderr
    assert r.stderr.strip() == "", r.stderr
