"""Headless Chromium for the tests that read a rendered page (the report's figures, the explorer).

README's test command installs Debian's ``chromium`` and the test extra installs ``playwright``, so a
missing one is a broken set-up: :func:`require_browser` fails the test with the line that installs it,
never skips it (a skipped browser check would pass CI without looking at a page)."""

from __future__ import annotations

import shutil

import pytest

#: Debian's Chromium, the browser every page test drives (None when it is not installed)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def require_browser():
    """``playwright.sync_api``, after checking that Chromium and playwright are installed; fails the
    calling test with the install line otherwise."""
    if not CHROMIUM:
        pytest.fail("Chromium is not installed: apt-get install -y --no-install-recommends chromium "
                    "(README's test command does)")
    try:
        import playwright.sync_api as sync_api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]' (README's test command does)")
    return sync_api
