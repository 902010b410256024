"""The cluster as a workspace's Kubernetes compute: its instance types in the compute's ARM JSON, and
the kubeconfig (server ``<base_url>/k8s/<cluster>``, the emulator's CA, a bearer token) that reaches it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from airflow_azureml.emulator.azure_rules import DEFAULT_NAME
from airflow_azureml.emulator.certs import write_private
from airflow_azureml.emulator.kubernetes.store import KubeCluster

#: Lifetime of the bearer token written into kubeconfigs (ten years: kubeconfigs are long-lived).
KUBECONFIG_TOKEN_LIFETIME = 10 * 365 * 24 * 3600


def merge_compute_instance_types(
    arm_types: Mapping[str, Any] | None, cluster: KubeCluster | None, default: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The compute's ``instanceTypes``: what ARM was given, overridden by the cluster's objects (names match
    case-insensitively), and the built-in ``defaultinstancetype`` unless one of those defines it."""
    types: dict[str, dict[str, Any]] = dict(arm_types or {})
    for name, entry in (cluster.compute_instance_types() if cluster is not None else {}).items():
        for existing in [k for k in types if k.lower() == name.lower()]:
            del types[existing]
        types[name] = entry
    if not any(k.lower() == DEFAULT_NAME for k in types):
        types[DEFAULT_NAME] = default
    return types


def kubeconfig_document(cluster: str, server: str, ca_cert: str, token: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user (bearer token) and one context, all named after the cluster."""
    user = f"{cluster}-admin"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority": ca_cert}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }


def write_kubeconfig(path: Path, document: dict[str, Any]) -> Path:
    """Write atomically and owner-only from the start: the file holds a bearer token."""
    return write_private(path, yaml.safe_dump(document, sort_keys=False))
