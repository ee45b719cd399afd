"""Layer 5: the ``vocablens`` command line (typer + rich).

Each topic registers its commands in its own module (``cli/core.py``, ``cli/ops.py`` ...), imported
below. Every command takes ``--model`` (default ``smollm2``) and ``--json``. A
:class:`~vocablens.errors.VocabLensError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

from vocablens.cli.common import app, run_app

# Command modules: importing one registers its commands on ``app``.
from vocablens.cli import core as _core  # noqa: F401,E402
from vocablens.cli import report as _report  # noqa: F401,E402
from vocablens.cli import anatomy as _anatomy  # noqa: F401,E402
from vocablens.cli import geometry as _geometry  # noqa: F401,E402
from vocablens.cli import vocab_space as _vocab_space  # noqa: F401,E402
from vocablens.cli import surgery as _surgery  # noqa: F401,E402
from vocablens.cli import argmax as _argmax  # noqa: F401,E402
from vocablens.cli import ops as _ops  # noqa: F401,E402
from vocablens.cli import tuned as _tuned  # noqa: F401,E402
from vocablens.cli import generate as _generate  # noqa: F401,E402
from vocablens.cli import serve as _serve  # noqa: F401,E402
from vocablens.cli import align as _align  # noqa: F401,E402
from vocablens.cli import anomaly as _anomaly  # noqa: F401,E402
from vocablens.cli import steer as _steer  # noqa: F401,E402
from vocablens.cli import undertrained as _undertrained  # noqa: F401,E402
from vocablens.cli import jacobian as _jacobian  # noqa: F401,E402


def _reflow_help(*apps) -> None:
    """Join the wrapped lines of every paragraph of each command's docstring (typer keeps the line
    breaks of all paragraphs but the first, so ``-h`` showed sentences cut mid-line)."""
    import inspect

    for a in apps:
        for c in a.registered_commands:
            doc = inspect.cleandoc(c.help or (c.callback.__doc__ if c.callback else "") or "")
            c.help = "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n")) or None


_reflow_help(app, _core.lens_app)
# `vocablens --help` names what `lens PROMPT` does first: the logit lens (the tuned lens is its sub-commands)
_core.lens_app.info.help = ("The logit lens: `vocablens lens PROMPT` reads the residual stream through the LM head "
                            "at every layer; `lens train`, `lens eval` and `lens anomaly` train, evaluate and use a "
                            "tuned lens.")




def quiet_import_noise() -> None:
    """Raise the loggers of :data:`vocablens.handle.quiet.IMPORT_NOISE` to ERROR for the whole process
    (the CLI keeps stderr for its own lines): a process-wide setting, made here (the CLI's whole process)
    and in the tests' conftest; the library quiets them for the duration of a load only."""
    import logging

    from vocablens.handle.quiet import IMPORT_NOISE

    for name in IMPORT_NOISE:
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    quiet_import_noise()
    sys.exit(run_app(argv, whole_process=True))


__all__ = ["app", "main", "quiet_import_noise"]
