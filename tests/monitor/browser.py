"""Debian's chromium, headless, driven by Playwright (never `playwright install`)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("AGENT2PC_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_browser() -> None:
    """Skip without chromium or Playwright, unless CI says they must be there."""
    missing = None
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing = f"{CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package"
    if missing:
        if os.environ.get("AGENT2PC_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the browser tests need {missing}")
        pytest.skip(f"needs {missing}")


def launch(p):  # type: ignore[no-untyped-def]
    return p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
