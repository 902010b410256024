"""The storage connection examples of docs/azure.md ("The datastore root"), held to the pinned Azure provider.

Each ``AIRFLOW_CONN_AZURE_BLOB_DATASTORE='...'`` on that page is read from the page itself (so the page cannot
drift from what is tested), given a made-up account, and put behind the example DAGs' own
``example_partitions.storage`` with the page's ``AZUREML_DATASTORE_ROOT``. The filesystem Airflow then builds
(apache-airflow-providers-microsoft-azure's ``abfs`` handler, adlfs's ``AzureBlobFileSystem``) must talk to
``https://<account>.blob.core.windows.net/``. Only the clients are built: no network call (azure-identity
credentials and the storage client connect on first use). ``make test`` installs the ``[azure-storage]``
extra, so it runs there; the Airflow 3.1/3.2 venvs (``make test-versions``) do not install it and skip it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("adlfs", reason="the [azure-storage] extra (adlfs) is not installed")
pytest.importorskip(
    "airflow.providers.microsoft.azure.fs.adls",
    reason="the [azure-storage] extra (apache-airflow-providers-microsoft-azure) is not installed",
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "azure.md"
ACCOUNT, CONTAINER = "docsaccount", "docscontainer"
PLACEHOLDERS = {
    "<account>": ACCOUNT,
    "<container>": CONTAINER,
    "<client id>": "00000000-0000-0000-0000-00000000c11e",
    "<client secret>": "not-a-real-secret",
    "<tenant id>": "00000000-0000-0000-0000-0000000007e4",
}


def exports(text: str) -> list[tuple[str, str]]:
    """``export NAME='value'`` (the value may span lines) and ``export NAME=value``, in page order."""
    found = re.findall(r"export (\w+)=(?:'([^']*)'|(\S+))", text)
    return [(name, quoted or bare) for name, quoted, bare in found]


def fill(value: str) -> str:
    for placeholder, real in PLACEHOLDERS.items():
        value = value.replace(placeholder, real)
    assert "<" not in value, f"a placeholder this test does not know: {value!r}"
    return value


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


DATASTORE = section(DOC.read_text(encoding="utf-8"), "The datastore root")
EXPORTS = exports(DATASTORE)
CONNECTIONS = [fill(value) for name, value in EXPORTS if name == "AIRFLOW_CONN_AZURE_BLOB_DATASTORE"]


def test_the_page_has_the_connection_examples() -> None:
    names = [name for name, _ in EXPORTS]
    assert {"AZUREML_DATASTORE_ROOT", "AZUREML_STORAGE_CONN_ID"} <= set(names)
    assert len(CONNECTIONS) >= 2  # DefaultAzureCredential and the service principal


@pytest.fixture
def ep() -> ModuleType:
    import example_partitions  # tests/conftest.py puts the DAG folder on sys.path, as Airflow does

    return example_partitions


def label(connection: str) -> str:
    return "service-principal" if "tenant_id" in connection else "default-credential"


@pytest.mark.parametrize("connection", CONNECTIONS, ids=label)
def test_the_documented_connection_reaches_the_account(
    connection: str, ep: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.io import store

    env = {name: fill(value) for name, value in EXPORTS if name != "AIRFLOW_CONN_AZURE_BLOB_DATASTORE"}
    conn_id = env["AZUREML_STORAGE_CONN_ID"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection)
    for name in ("ACCOUNT_NAME", "ACCOUNT_KEY", "CONNECTION_STRING", "SAS_TOKEN", "CLIENT_ID", "TENANT_ID"):
        monkeypatch.delenv(f"AZURE_STORAGE_{name}", raising=False)  # adlfs would fall back on these
    monkeypatch.setattr(store, "_STORE_CACHE", {})  # a filesystem cached by an earlier test is not this one

    path = ep.storage("scoring/input/part-0.csv")
    fs = path.fs  # the provider's get_fs(conn_id): the connection is read here
    assert type(fs).__name__ == "AzureBlobFileSystem"
    assert fs.account_name == ACCOUNT
    assert fs.service_client.url == f"https://{ACCOUNT}.blob.core.windows.net/"
    assert path.path.split("/", 1)[0] == CONTAINER
    if "tenant_id" in json.loads(connection).get("extra", {}):
        assert type(fs.credential).__name__ == "ClientSecretCredential"
    else:
        assert type(fs.credential).__name__ == "DefaultAzureCredential"
