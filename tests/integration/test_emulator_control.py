"""The control API (``/_emulator/...``) takes the emulator's control token only (issue 19 §2).

The control token is a random secret made per emulator and written to ``emulator.json``
(``control_token``), sent as ``Authorization: Bearer <control_token>``. Workspace tokens (any audience
the identity issues), the kubeconfig's long-lived Kubernetes token and the client secret are refused with
ARM's 401; the control token opens nothing else. The Studio job page stays open (a browser sends no token).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import yaml

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.blobs import STORAGE_AUDIENCE
from tests.integration.test_emulator_protocol import arm_token, ml_token, token

CONTROL_ROUTES = [
    ("GET", "/_emulator/behaviour"),
    ("GET", "/_emulator/jobs"),
    ("GET", "/_emulator/requests"),
    ("GET", "/_emulator/bill"),
    ("GET", "/_emulator/prices"),
    ("GET", "/_emulator/kubernetes/k8s-compute/instancetypes"),
    ("POST", "/_emulator/kubernetes/k8s-compute/kubeconfig"),
    ("POST", "/_emulator/tokens/expire"),
]


def call(emulator: Emulator, method: str, path: str, bearer: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
    return requests.request(
        method, emulator.base_url + path, headers=headers, json={} if method == "POST" else None,
        verify=emulator.ca_cert, timeout=10,
    )  # fmt: skip


def control_token(emulator: Emulator) -> str:
    """What a client in another process reads: ``emulator.json``'s ``control_token``."""
    return json.loads((emulator.data_dir / "emulator.json").read_text())["control_token"]


def kubeconfig_token(emulator: Emulator) -> str:
    document = yaml.safe_load(emulator.kubeconfig("k8s-compute").read_text())
    return document["users"][0]["user"]["token"]


def assert_refused(response: requests.Response) -> None:
    assert response.status_code == 401, (response.request.url, response.status_code, response.text[:200])
    error = response.json()["error"]
    assert error["code"] == "AuthenticationFailed" and error["message"]


@pytest.mark.parametrize(("method", "path"), CONTROL_ROUTES)
def test_no_token_is_refused(emulator: Emulator, method: str, path: str) -> None:
    assert_refused(call(emulator, method, path, None))


@pytest.mark.parametrize("kind", ["arm", "ml", "storage", "kubernetes", "kubeconfig", "client_secret", "garbage"])
def test_workspace_and_kubernetes_tokens_are_refused(emulator: Emulator, kind: str) -> None:
    from airflow_azureml.emulator.identity import KUBERNETES_AUDIENCE

    bearer = {
        "arm": lambda: arm_token(emulator),
        "ml": lambda: ml_token(emulator),
        "storage": lambda: token(emulator, f"{STORAGE_AUDIENCE}/.default"),
        "kubernetes": lambda: token(emulator, f"{KUBERNETES_AUDIENCE}/.default"),
        "kubeconfig": lambda: kubeconfig_token(emulator),  # the 10-year token in DIR/kubeconfig-*.yaml
        "client_secret": lambda: emulator.client_secret,
        "garbage": lambda: "not-a-token",
    }[kind]()
    assert emulator.identity.valid(bearer) or kind in ("client_secret", "garbage")
    for method, path in CONTROL_ROUTES:
        assert_refused(call(emulator, method, path, bearer))
    assert emulator.behaviour()["check_api_versions"] is True  # nothing was changed on the way
    # and the same token still works where it belongs (it was refused for the route, not spent)
    if kind == "kubeconfig":
        assert call(emulator, "GET", "/k8s/k8s-compute/version", bearer).status_code == 200


@pytest.mark.parametrize(("method", "path"), CONTROL_ROUTES)
def test_the_control_token_is_accepted(emulator: Emulator, method: str, path: str) -> None:
    response = call(emulator, method, path, control_token(emulator))
    assert response.status_code == 200, (path, response.text[:200])


def test_the_control_token_changes_behaviour(emulator: Emulator) -> None:
    answer = call(emulator, "POST", "/_emulator/behaviour", None)
    assert_refused(answer)
    response = requests.post(
        f"{emulator.base_url}/_emulator/behaviour",
        json={"check_api_versions": False},
        headers={"Authorization": f"Bearer {control_token(emulator)}"},
        verify=emulator.ca_cert,
        timeout=10,
    )
    assert response.status_code == 200 and response.json()["check_api_versions"] is False


def test_the_control_token_opens_nothing_but_the_control_api(emulator: Emulator) -> None:
    ws = (
        f"/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{emulator.workspace_name}/jobs?api-version=2024-10-01"
    )
    bearer = control_token(emulator)
    for path in (ws, "/k8s/k8s-compute/version", "/history/v1.0/x/runs/y/details"):
        assert call(emulator, "GET", path, bearer).status_code == 401, path


def test_the_control_token_is_per_emulator_and_not_in_the_airflow_connection(emulator: Emulator, tmp_path: Any) -> None:
    secret = control_token(emulator)
    assert secret == emulator.control_token and len(secret) >= 32
    info = emulator.connection_info()
    assert secret not in info["airflow_conn_json"] and secret not in info["airflow_conn_uri"]
    with Emulator(tmp_path / "other") as other:
        assert other.control_token != secret
        assert_refused(call(other, "GET", "/_emulator/jobs", secret))


def test_the_control_token_stays_out_of_the_request_log(emulator: Emulator) -> None:
    secret = control_token(emulator)
    assert call(emulator, "GET", "/_emulator/jobs", secret).status_code == 200
    assert secret not in repr(emulator.requests())


def test_the_studio_page_needs_no_token(emulator: Emulator) -> None:
    (name,) = emulator.call(lambda: emulator.workspace.create_synthetic_jobs("studio", [0.01]))
    assert call(emulator, "GET", f"/_emulator/studio/jobs/{name}", None).status_code == 200
