"""Connection parsing, cloud selection and credential choice of AzureMLHook (no network)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.hooks.azure_ml import AzureMLHook
from airflow_azureml.hooks.connection import credential_kwargs, parse_connection
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

    info = {"conn_type": "azure_ml", "login": "id", "password": "pw-long-enough", "extra": {**BASE, "tenant_id": "t"}}
    c = Connection.from_json(json.dumps(info), conn_id="x")
    assert parse_connection(c).client_secret == "pw-long-enough"


def test_the_hook_modules_import_in_one_direction() -> None:
    """connection.py is beneath hooks.azure_ml and hooks.rest; rest never imports the hook module."""
    import ast
    from pathlib import Path

    import airflow_azureml.hooks.azure_ml as hook_module
    import airflow_azureml.hooks.connection as connection

    def imported(module: object) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())  # type: ignore[attr-defined]
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}

    import airflow_azureml.hooks.rest as rest

    assert "airflow_azureml.hooks.azure_ml" not in imported(rest)
    assert not {"airflow_azureml.hooks.azure_ml", "airflow_azureml.hooks.rest"} & imported(connection)
    assert hook_module.parse_connection is connection.parse_connection  # still importable from the hook
    assert hook_module.AzureMLConnectionSettings is connection.AzureMLConnectionSettings


class FakeCredential:
    """The azure-identity surface at the edge: a cache that keeps serving its token until it expires."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[str | None] = []

    def get_token(self, *scopes: str, claims: str | None = None) -> Any:
        from azure.core.credentials import AccessToken

        if self.fail:
            raise RuntimeError("AADSTS7000215: Invalid client secret provided.")
        self.calls.append(claims)
        import time

        # the cache: without claims, the same token until it expires
        suffix = f"-{len(self.calls)}" if claims else ""
        return AccessToken(f"{self.name}{suffix}", int(time.time()) + 3600)

    def close(self) -> None:
        pass


def test_a_renewal_never_gets_the_refused_token_back() -> None:
    from airflow_azureml.hooks.rest import RestClient, TokenUnavailable

    built: list[FakeCredential] = []

    def factory() -> FakeCredential:
        built.append(FakeCredential(f"rebuilt{len(built)}"))
        return built[-1]

    client = RestClient(parse_connection(conn(BASE)), FakeCredential("first"), factory)  # type: ignore[arg-type]
    first = client._auth()
    assert client._auth() == first  # cached
    challenged = client._auth(renew=True, claims='{"access_token":{"nbf":{"essential":true}}}')
    assert challenged != first and not built  # the claims challenge is answered by the same credential
    renewed = client._auth(renew=True)
    assert renewed not in (first, challenged) and len(built) == 1  # no claims: a credential rebuilt from the connection
    built.append(FakeCredential("broken", fail=True))
    client._credential = built[-1]
    client._token = None
    with pytest.raises(TokenUnavailable) as excinfo:  # transient, and the secret's error text is scrubbed of tokens
        client._auth()
    assert "Invalid client secret" in str(excinfo.value)
    assert client._auth() == "rebuilt2"  # after a token failure, the next token comes from a new credential


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_credential_quiets_the_sdks_request_logging_unless_the_user_set_it(
    monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    """Token fetches made before any MLClient (the REST reads, the triggerer) logged each request's headers
    at INFO: about 40 % of a task log. A level the user set is theirs."""
    import logging

    from airflow_azureml.hooks.connection import SDK_LOGGERS, build_async_credential, build_credential

    http, identity = (logging.getLogger(name) for name in SDK_LOGGERS)
    monkeypatch.setattr(http, "level", logging.NOTSET)
    monkeypatch.setattr(identity, "level", logging.DEBUG)  # the user asked for it
    # parse_connection registers the secret with Airflow's masker: a short one would mask every "s" after
    settings = parse_connection(conn({**BASE, "tenant_id": "t"}, login="app", password="quiet-logging-secret-1"))
    (build_async_credential if asynchronous else build_credential)(settings)
    assert http.level == logging.WARNING
    assert identity.level == logging.DEBUG


def test_a_failed_connection_test_does_not_name_the_temporary_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow tests a form's connection under a random conn_id; the message must not send the user there."""
    temporary = "tmp-8f3a1c"
    incomplete = SimpleNamespace(conn_id=temporary, extra_dejson={"subscription_id": "sub"}, login=None, password=None)
    monkeypatch.setattr(AzureMLHook, "get_connection", classmethod(lambda cls, conn_id: incomplete))
    ok, message = AzureMLHook(azure_ml_conn_id=temporary).test_connection()
    assert not ok and temporary not in message
    assert message.startswith("AzureMLConfigError: The connection is missing required field(s)"), message


def test_a_client_secret_too_short_to_be_masked_is_refused_without_showing_it() -> None:
    with pytest.raises(AzureMLConfigError, match="shorter than 5 characters") as excinfo:
        parse_connection(conn({**BASE, "tenant_id": "t"}, login="app", password="Ab1d"))
    assert "Ab1d" not in str(excinfo.value)
