"""Keeping secrets out of logs, XCom, trigger rows and exception text."""

from __future__ import annotations

import re
import threading
from typing import Any

_KNOWN: set[str] = set()
_LOCK = threading.Lock()
# Names under which secrets travel in JSON, Python reprs, query strings and connection strings.
_SECRET_KEY = (
    r"(?:client[_-]?secret|password|passwd|access[_-]?token|refresh[_-]?token|id[_-]?token|"
    r"api[_-]?key|sas[_-]?token|shared[_-]?access[_-]?key|secret)"
)
_PATTERNS = [
    # "password": "pass word" / 'secret': 'a b' -- the whole quoted value, spaces and escapes included
    re.compile(rf"(?i)({_SECRET_KEY}[\"']?\s*[:=]\s*)(\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*')"),
    # password=pass word&x=1 / refresh_token: a b  -- unquoted, up to the next separator or line end
    re.compile(rf"(?i)({_SECRET_KEY}\s*[:=]\s*)(?![\"'\s])[^&;,}}\]\r\n\"']+"),
    # a bare "token" key (kubeconfig users, JSON): only as a key, so "could not get a token: ..." stays
    re.compile(r"(?i)([\"']token[\"']\s*:\s*)(\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*')"),
    re.compile(r"(?im)(^\s*-?\s*token\s*:\s*)(?![\"'\s])\S+"),
    re.compile(r"(?im)(^\s*-?\s*token\s*:\s*)(\"(?:\\.|[^\"\\])*\"|'(?:[^']|'')*')"),  # YAML, quoted
    re.compile(r"(?im)(^\s*-?\s*client-key-data\s*:\s*)[\"']?[A-Za-z0-9+/=]+[\"']?"),  # kubeconfig key
    # a JSON/dict key naming a key: "accountKey", "primaryKey", "key" (not the word "key" in prose)
    re.compile(
        r"(?i)([\"'](?:(?:account|primary|secondary|storage|shared|access|master|signing)[_-]?key|key)[\"']\s*:\s*)"
        r"(\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*')"
    ),
    re.compile(r"(?i)([\"']client-key-data[\"']\s*:\s*)(\"[^\"]*\"|'[^']*')"),  # kubeconfig as JSON
    # a private key in PEM form (certificates are public and stay)
    re.compile(r"-----BEGIN ([A-Z ]*PRIVATE KEY)-----[\s\S]*?(?:-----END \1-----|$)"),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[^\s\"',;]+"),  # Authorization header values
    re.compile(r"(?i)(\bsig=)[^&\s\"'<>]+"),  # SAS signature
    re.compile(r"(?i)(\bAccountKey=)(\"[^\"]*\"|'[^']*'|[^;\s\"']+)"),  # storage connection string
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@\"']+:)[^@\s/\"']+(?=@)"),  # user:password@ in URLs
    re.compile(r"(?i)(\bSharedAccessSignature=)[^;\s\"']+"),
    re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),  # JWT-shaped tokens
]
REDACTED = "***"
# Shorter registered values are not replaced: a one-letter "secret" would turn every such letter of a log line
# or an error into "***" and hide what went wrong. Airflow's masker skips them too (its default for
# ``core.min_length_masked_secret``); Azure's client secrets and keys are tens of characters.
MIN_SECRET_LENGTH = 5


def mask(secret: str) -> None:
    """Register a secret: Airflow's log masker hides it, and ``scrub`` removes it from text."""
    if not secret or len(secret) < MIN_SECRET_LENGTH:
        return
    with _LOCK:
        _KNOWN.add(secret)
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # outside a task context the masker may be unavailable; scrub still works
        pass


def _replace(match: re.Match[str]) -> str:
    if not match.groups():
        return REDACTED
    value = match.group(2) if match.re.groups >= 2 else ""
    quote = value[:1] if value[:1] in ("'", '"') else ""
    return match.group(1) + quote + REDACTED + quote


def scrub(text: str, limit: int | None = None) -> str:
    """Remove registered secrets, tokens, SAS signatures, account keys and ``secret=...`` pairs.

    ``limit`` truncates *after* scrubbing: cutting first could leave the start of a secret that
    straddles the cut, which then no longer matches anything.
    """
    text = str(text)
    with _LOCK:
        known = sorted(_KNOWN, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(_replace, text)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


# SAS parameters that say nothing secret: version, services, resource types, permissions, times, protocol,
# resource, IP range. The signature and anything unknown (a user delegation key's fields) are dropped.
_SAS_PUBLIC = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sr", "sip", "sdd", "api-version"})


def safe_uri(uri: str) -> str:
    """``uri`` with a SAS query reduced to its non-secret parameters, for logs, errors and XCom.

    A URI without ``sig`` is returned unchanged. The result is not a working SAS URL any more.
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    text = str(uri)
    if "sig=" not in text.lower():
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return scrub(text)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k.lower() in _SAS_PUBLIC]
    return scrub(urlunsplit(parts._replace(query=urlencode(kept, safe=":"))))  # and user:password@, if any


def yaml_error_summary(exc: Any) -> str:
    """Where and why a YAML document is malformed, without PyYAML's quote of the offending line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    problem = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", str(problem))  # e.g. "found undefined alias '<text>'"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"
