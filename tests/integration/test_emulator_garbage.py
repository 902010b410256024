"""Malformed input gets Azure's answer, a 4xx with an error body, never the emulator's 500.

A client retries a 500 as transient; Azure refuses a malformed request at once with an ARM-shaped
``{"error": {"code", "message"}}`` (a Kubernetes ``Status`` on the Kubernetes API). Every route the
emulator serves is sent garbage: bodies that are not JSON or have the wrong types, and query values
that do not parse.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator

BODIES: list[tuple[str, bytes]] = [
    ("not JSON", b"not json{"),
    ("a list", b"[]"),
    ("wrong types", b'{"properties": 5, "tags": [], "name": 7, "sku": "x", "kind": 1}'),
    ("nested wrong types", b'{"properties": {"properties": 3, "scaleSettings": {"maxNodeCount": "many"}}}'),
]
QUERY = "?$skip=abc&maxresults=-x&limit=abc&continue=%40%40&labelSelector=%3D%3D&properties=%3D%2C"
PLACEHOLDER = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def route_instances(emulator: Emulator) -> list[tuple[str, str]]:
    """(method, path) for every route of the emulator's HTTPS app, placeholders filled in."""
    values = {
        "sub": emulator.subscription_id,
        "rg": emulator.resource_group,
        "ws": emulator.workspace_name,
        "cluster": "k8s-compute",
    }
    found: set[tuple[str, str]] = set()
    for route in emulator.route_table():
        path = PLACEHOLDER.sub(lambda m: values.get(m.group(1), "garbage-name"), route["path"])
        methods = ["GET", "PUT", "POST", "PATCH", "DELETE"] if route["method"] == "*" else [route["method"]]
        found |= {(m, path) for m in methods if m != "HEAD"}
    return sorted(found)


@pytest.fixture
def garbage_emulator(emulator: Emulator) -> Emulator:
    # one token for every plane and no api-version check: the garbage must reach each route's own handler
    emulator.set_behaviour(check_audiences=False, check_api_versions=False)
    return emulator


def test_no_route_answers_garbage_with_a_500(garbage_emulator: Emulator) -> None:
    emulator = garbage_emulator
    token = emulator.call(lambda: emulator.identity.issue(emulator.client_id, f"{emulator.base_url}/.default"))
    headers = {"Authorization": f"Bearer {token['access_token']}", "Content-Type": "application/json"}
    # the control API takes its own token only (emulator.json control_token)
    control = {**headers, "Authorization": f"Bearer {emulator.control_token}"}
    routes = route_instances(emulator)
    assert len(routes) > 60, routes  # every route, not a sample
    failures: list[str] = []
    sent = 0
    for method, path in routes:
        for label, body in BODIES if method in ("PUT", "POST", "PATCH") else [("no body", b"")]:
            response = requests.request(
                method,
                emulator.base_url + path + QUERY,
                data=body or None,
                headers=control if path.startswith("/_emulator/") else headers,
                verify=emulator.ca_cert,
                timeout=30,
            )
            sent += 1
            if response.status_code >= 500:
                failures.append(f"{method} {path} [{label}]: {response.status_code} {response.text[:120]!r}")
            elif response.status_code >= 400 and not error_shaped(path, response):
                failures.append(f"{method} {path} [{label}]: {response.status_code} not error-shaped")
    print(f"garbage: {sent} requests to {len(routes)} routes; {len(failures)} wrong answers")
    assert not failures, "\n".join(failures)


def error_shaped(path: str, response: requests.Response) -> bool:
    try:
        body: Any = response.json()
    except ValueError:
        return False
    if path.startswith("/k8s/"):
        return body.get("kind") == "Status" and body.get("code") == response.status_code
    if "oauth2" in path or "well-known" in path or "discovery/instance" in path:
        return "error" in body  # Entra ID's own shape: {"error": "...", "error_description": ...}
    if path.startswith("/api/retail/"):  # the Retail Prices API is not ARM: its own error text
        return bool(body)
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str)
