"""Keeping secrets out of logs, XCom, trigger rows and exception text."""

from __future__ import annotations

import re
import threading

_KNOWN: set[str] = set()
_LOCK = threading.Lock()
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),  # JWT-shaped tokens
    re.compile(r"(?i)((?:client_secret|password|access_token|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,}]+"),
]
REDACTED = "***"


def mask(secret: str) -> None:
    """Register a secret: Airflow's log masker hides it, and ``scrub`` removes it from text."""
    if not secret:
        return
    with _LOCK:
        _KNOWN.add(secret)
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # outside a task context the masker may be unavailable; scrub still works
        pass


def scrub(text: str) -> str:
    """Remove registered secrets, bearer tokens and ``secret=...`` pairs from a message."""
    with _LOCK:
        known = sorted(_KNOWN, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text
