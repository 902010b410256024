"""Headless Chromium (Debian's, ``scripts/ensure_chromium.sh``) driven by Playwright, for the savings view's test.

Playwright's own browser download is never used: the launch names ``/usr/bin/chromium``. The flags keep
Chromium off the network it would otherwise try to reach at start (this machine's is closed). Its home is a
folder of the test's (``home``): Chromium writes its crash-report database to ``~/.config/chromium`` and GLib
its dconf cache to ``~/.cache`` whatever the profile folder, and a test leaves nothing in the user's home.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-breakpad",
]


@contextlib.contextmanager
def chromium(home: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS, env=env)
        try:
            yield browser
        finally:
            browser.close()


def figures(page: Any, scope: str = "") -> dict[str, str]:
    """``data-figure`` name -> the text a person sees, inside the CSS selector ``scope`` (default: the page)."""
    found = page.eval_on_selector_all(
        f"{scope} [data-figure]".strip(), "els => els.map(e => [e.dataset.figure, e.textContent.trim()])"
    )
    return dict(found)
