"""Which store holds the spot history, and the URLs it is kept at (no network: the choice and the names)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml import spot_history_store as stores
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.hooks.azure_ml import AzureMLHook

BASE = {"subscription_id": "s", "resource_group": "rg", "workspace_name": "ws"}


def hook_for(extra: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> AzureMLHook:
    hook = AzureMLHook()
    connection = SimpleNamespace(conn_id="c", extra_dejson={**BASE, **extra}, login=None, password=None)
    monkeypatch.setattr(hook, "get_connection", lambda conn_id: connection)
    monkeypatch.setattr(hook, "get_credential", lambda: object())
    return hook


@pytest.mark.parametrize(
    ("account", "suffix", "url"),
    [
        (
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/mlws1234",
            "core.windows.net",
            "https://mlws1234.blob.core.windows.net/azureml-airflow-spot-history",
        ),
        (
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/CnAcct",
            "core.chinacloudapi.cn",
            "https://cnacct.blob.core.chinacloudapi.cn/azureml-airflow-spot-history",
        ),
        ("", "core.windows.net", None),
        ("/subscriptions/s/providers/Microsoft.Storage/storageAccounts/x", "core.windows.net", None),  # < 3 chars
    ],
)
def test_default_container_is_in_the_workspace_storage_account(account: str, suffix: str, url: str | None) -> None:
    assert stores.storage_container_url(account, suffix) == url


def test_one_blob_per_connection_and_target() -> None:
    url = stores.blob_url("https://a.blob.core.windows.net/c/", "azure_ml_default", "endpoint/deployment")
    assert url == "https://a.blob.core.windows.net/c/azureml_spot_history__azure_ml_default__endpoint_deployment.json"


def test_the_connection_names_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = hook_for({"spot_history_url": "https://acct.blob.core.windows.net/hist/"}, monkeypatch)
    store = hook.spot_history_store("ep/dep")
    assert isinstance(store, stores.FallbackStore)
    assert store.where == "https://acct.blob.core.windows.net/hist/azureml_spot_history__azure_ml_default__ep_dep.json"
    assert isinstance(store.fallback, stores.VariableHistoryStore)


def test_variable_is_chosen_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    store = hook_for({"spot_history_url": "variable"}, monkeypatch).spot_history_store("ep/dep")
    assert isinstance(store, stores.VariableHistoryStore)


def test_a_custom_cloud_without_a_container_keeps_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"cloud": "custom", "resource_manager_url": "https://arm.example", "authority_url": "https://login.example"}
    store = hook_for(extra, monkeypatch).spot_history_store("ep/dep")
    assert isinstance(store, stores.VariableHistoryStore)


@pytest.mark.parametrize(
    "url", ["http://acct.blob.core.windows.net/c", "https://acct.blob.core.windows.net/c?sv=2025&sig=secret", "c"]
)
def test_a_container_url_that_cannot_work_is_refused(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AzureMLConfigError, match="spot_history_url") as err:
        hook_for({"spot_history_url": url}, monkeypatch).settings  # noqa: B018 - parsing is the test
    assert "secret" not in str(err.value)


def test_a_refusing_store_hands_over_to_the_fallback() -> None:
    class Refusing:
        where = "blob"

        def load(self) -> Any:
            raise stores.StoreUnavailable("no role")

        def update(self, change: Any) -> bool:
            raise stores.StoreUnavailable("no role")

    class Kept:
        where = "Variable v"

        def __init__(self) -> None:
            self.changes: list[Any] = []

        def load(self) -> Any:
            return stores.SpotHistory(), {}

        def update(self, change: Any) -> bool:
            self.changes.append(change(stores.SpotHistory(), {}))
            return True

    kept = Kept()
    store = stores.FallbackStore(Refusing(), kept)
    assert store.update(lambda h, k: (h.record_start("j", 1.0), k))
    assert store.where == "Variable v" and kept.changes[0][0].running == {"j": 1.0}
