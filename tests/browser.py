"""Headless Chromium for the browser tests: Debian's package (`/usr/bin/chromium`, which `.ci/run` installs), driven
by Playwright's sync API. Without it the tests skip, saying why, except in CI, where a missing browser fails.
`PARALLEL_R1_SCREENSHOTS=1` lets a test write its screenshot into docs/ (off by default, so a run leaves the tracked
files alone)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[1] / "docs"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextmanager
def chromium_page(width: int = 1400, height: int = 900):
    """A fresh page of headless Chromium, closed afterwards; without the browser or Playwright, a skip (CI: a fail)."""
    if not CHROMIUM.exists():
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    if IN_CI:
        from playwright import sync_api  # the dev extra brings it: missing, it fails
    else:
        sync_api = pytest.importorskip("playwright.sync_api", reason="no Playwright (pip install -e .[dev])")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def screenshot(page, name: str) -> Path | None:
    """Save the page to docs/<name> when PARALLEL_R1_SCREENSHOTS=1; the path written, or None."""
    if os.environ.get("PARALLEL_R1_SCREENSHOTS") != "1":
        return None
    path = DOCS / name
    page.screenshot(path=str(path))
    return path
