"""Run the tour (docs/tour.md) as a test: ``python -m pytest docs -q``.

The tour is one doctest: its examples share one namespace, in order, on the real default model.
The same check runs from the default suite as ``tests/integration/test_tour.py``.
"""

import doctest
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.FAIL_FAST
MIN_EXAMPLES = 20


class TourItem(pytest.Item):
    """Every ``>>>`` example of one markdown file, run in order; fails with doctest's report."""

    def runtest(self):
        text = self.path.read_text(encoding="utf-8")
        test = doctest.DocTestParser().get_doctest(text, {"__name__": "tour"}, self.path.name, str(self.path), 0)
        report: list[str] = []
        failed, attempted = doctest.DocTestRunner(optionflags=FLAGS).run(test, out=report.append)
        if failed:
            pytest.fail("".join(report), pytrace=False)
        assert attempted >= MIN_EXAMPLES, f"{self.path.name} has {attempted} examples; the tour needs {MIN_EXAMPLES}"

    def reportinfo(self):
        return self.path, None, f"[tour] {self.path.name}"


class TourFile(pytest.File):
    def collect(self):
        item = TourItem.from_parent(self, name=self.path.name)
        item.add_marker(pytest.mark.slow)
        yield item


def pytest_collect_file(parent, file_path):
    if file_path.suffix == ".md" and file_path.name == "tour.md":
        return TourFile.from_parent(parent, path=file_path)
