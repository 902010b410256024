"""What any Kubernetes API server answers: ``Status`` objects for errors, its URL prefix, cluster names.

The error helpers (``not_found``, ``invalid``, ``conflict``) are worded as the API server words them for
the one resource served here, ``instancetypes.amlarc.azureml.com``.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.azure_rules import GROUP, KIND, PLURAL

K8S_PREFIX = "/k8s/"
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class KubeError(Exception):
    """An API error, answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details


def status_response(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> web.Response:
    """A Kubernetes ``Status`` (what the API server answers for every error)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


def is_kubernetes_path(path: str) -> bool:
    return path.startswith(K8S_PREFIX)


def check_cluster_name(cluster: str) -> str:
    """Cluster names become URL segments and file names: keep them to compute-name characters."""
    if not isinstance(cluster, str) or not _CLUSTER_RE.match(cluster):
        raise ValueError(f"invalid cluster name {cluster!r}: use letters, digits, '-', '_' and '.'")
    return cluster


def qualified_name(name: str) -> str:
    return f'{PLURAL}.{GROUP} "{name}"'


def status_details(name: str | None, causes: list[dict[str, str]] | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"group": GROUP, "kind": PLURAL}
    if name:
        details["name"] = name
    if causes:
        details["causes"] = causes
    return details


def not_found(name: str) -> KubeError:
    return KubeError(404, "NotFound", f"{qualified_name(name)} not found", status_details(name))


def invalid(name: str, message: str, field_path: str = "") -> KubeError:
    cause = {"reason": "FieldValueInvalid", "message": message}
    if field_path:
        cause["field"] = field_path
    return KubeError(422, "Invalid", f'{KIND}.{GROUP} "{name}" is invalid: {message}', status_details(name, [cause]))


def conflict(name: str) -> KubeError:
    return KubeError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {qualified_name(name)}: the object has been modified; "
        "please apply your changes to the latest version and try again",
        status_details(name),
    )
