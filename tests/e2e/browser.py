"""Headless Chromium (Debian's, ``scripts/ensure_chromium.sh``) driven by Playwright, for the savings view's test.

Playwright's own browser download is never used: the launch names ``/usr/bin/chromium``. The flags keep
Chromium off the network it would otherwise try to reach at start (this machine's is closed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
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
