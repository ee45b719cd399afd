"""docs/tour.md, executed: every ``>>>`` example must print what the tour says it prints.

The tour runs on the real default model (``smollm2``), so it is marked slow. ``python -m pytest docs -q``
runs the same file through docs/conftest.py.
"""

import doctest
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[2] / "docs" / "tour.md"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.slow
def test_tour_runs_as_written():
    failed, attempted = doctest.testfile(str(TOUR), module_relative=False, optionflags=FLAGS | doctest.FAIL_FAST,
                                         encoding="utf-8", report=True, verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples in {TOUR.name} print something else (report above)"
    assert attempted >= 20, f"{TOUR.name} has {attempted} examples; the tour needs at least 20"
