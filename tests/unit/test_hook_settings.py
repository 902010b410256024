"""Connection parsing, cloud selection and credential choice of AzureMLHook (no network)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.hooks.azure_ml import AzureMLHook, credential_kwargs, parse_connection
from airflow_azureml.redaction import scrub

BASE = {"subscription_id": "sub", "resource_group": "rg", "workspace_name": "ws"}


def conn(extra: dict[str, Any], login: str | None = None, password: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(conn_id="c", extra_dejson=extra, login=login, password=password)


def test_public_cloud_defaults() -> None:
    s = parse_connection(conn(BASE))
    assert s.resource_manager_url == "https://management.azure.com"
    assert s.authority_url == "https://login.microsoftonline.com"
    assert s.connection_verify is True
    assert s.workspace_path.endswith("/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws")


@pytest.mark.parametrize(
    ("cloud", "arm"),
    [
        ("AzureChinaCloud", "https://management.chinacloudapi.cn"),
        ("AzureUSGovernment", "https://management.usgovcloudapi.net"),
    ],
)
def test_sovereign_clouds(cloud: str, arm: str) -> None:
    s = parse_connection(conn({**BASE, "cloud": cloud}))
    assert s.resource_manager_url == arm and s.sdk_cloud_name == cloud


def test_custom_cloud_with_ca_bundle(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    extra = {
        **BASE,
        "cloud": "custom",
        "resource_manager_url": "https://arm.example/",
        "authority_url": "https://login.example",
        "ca_bundle": str(ca),
    }
    s = parse_connection(conn(extra))
    assert s.resource_manager_url == "https://arm.example" and s.connection_verify == str(ca)
    assert s.sdk_cloud_name.startswith("AirflowCustom-")
    assert credential_kwargs(s)["disable_instance_discovery"] is True


def test_prefixed_extras_are_read() -> None:
    s = parse_connection(conn({f"extra__azure_ml__{k}": v for k, v in BASE.items()}))
    assert s.workspace_name == "ws"


@pytest.mark.parametrize(
    ("extra", "login", "password", "message"),
    [
        ({}, None, None, "missing required field"),
        ({**BASE, "cloud": "Mars"}, None, None, "unknown cloud"),
        ({**BASE, "cloud": "custom"}, None, None, "needs resource_manager_url"),
        (
            {**BASE, "cloud": "custom", "resource_manager_url": "http://x", "authority_url": "https://y"},
            None,
            None,
            "https://",
        ),
        ({**BASE, "ca_bundle": "/nonexistent/ca.pem"}, None, None, "is not a file"),
        (BASE, "client", "s3cr3t-value", "needs tenant_id"),
    ],
)
def test_invalid_connections(extra: dict, login: str | None, password: str | None, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message) as excinfo:
        parse_connection(conn(extra, login, password))
    assert "s3cr3t-value" not in str(excinfo.value)


def test_secret_selects_client_secret_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.identity import ClientSecretCredential

    c = conn({**BASE, "tenant_id": "t"}, login="app", password="the-secret-value")
    monkeypatch.setattr(AzureMLHook, "get_connection", classmethod(lambda cls, conn_id: c))
    credential = AzureMLHook().get_credential()
    assert isinstance(credential, ClientSecretCredential)
    assert scrub("token request failed for the-secret-value") == "token request failed for ***"


def test_managed_identity_client_id_alone_selects_default_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.identity import DefaultAzureCredential

    c = conn({**BASE, "managed_identity_client_id": "mi-client"})
    monkeypatch.setattr(AzureMLHook, "get_connection", classmethod(lambda cls, conn_id: c))
    hook = AzureMLHook()
    kwargs = hook._default_chain_kwargs(credential_kwargs(hook.settings))
    assert kwargs["managed_identity_client_id"] == "mi-client"
    assert isinstance(hook.get_credential(), DefaultAzureCredential)


def test_scrub_removes_tokens_and_secret_pairs() -> None:
    text = 'Authorization: Bearer eyJhbGciOi.eyJzdWIiOi.sig client_secret=abc123 {"password": "p4ss"}'
    cleaned = scrub(text)
    for leaked in ("eyJhbGciOi", "abc123", "p4ss"):
        assert leaked not in cleaned


def test_emulator_connection_json_is_a_valid_airflow_connection() -> None:
    from airflow.sdk import Connection

    info = {"conn_type": "azure_ml", "login": "id", "password": "pw", "extra": {**BASE, "tenant_id": "t"}}
    c = Connection.from_json(json.dumps(info), conn_id="x")
    assert parse_connection(c).client_secret == "pw"
