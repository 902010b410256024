"""The Studio link of a job: from the connection's cloud; the emulator's page only for the emulator."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.hooks.azure_ml import AzureMLHook

BASE = {"subscription_id": "sub", "resource_group": "rg", "workspace_name": "ws", "tenant_id": "tid"}
WSID = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"


def hook_for(extra: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> AzureMLHook:
    hook = AzureMLHook()
    connection = SimpleNamespace(conn_id="c", extra_dejson=extra, login=None, password=None)
    monkeypatch.setattr(hook, "get_connection", lambda conn_id: connection)
    return hook


@pytest.mark.parametrize(
    ("cloud", "studio"),
    [
        # learn.microsoft.com, "Configure inbound and outbound network traffic", Azure Machine Learning hosts
        ("AzureCloud", "https://ml.azure.com"),
        ("AzureChinaCloud", "https://studio.ml.azure.cn"),
        ("AzureUSGovernment", "https://ml.azure.us"),
    ],
)
def test_each_cloud_links_to_its_studio(cloud: str, studio: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = hook_for({**BASE, "cloud": cloud}, monkeypatch).studio_job_url("job-1")
    assert url == f"{studio}/runs/job-1?wsid={WSID}&tid=tid"


def test_no_cloud_means_azure_public(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hook_for(BASE, monkeypatch).studio_job_url("j").startswith("https://ml.azure.com/runs/j?")


CUSTOM = {
    **BASE,
    "cloud": "custom",
    "resource_manager_url": "https://arm.private.example",
    "authority_url": "https://login.private.example",
}


def test_a_custom_cloud_is_not_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A custom cloud with no Studio URL gets no link: never a made-up /_emulator page on its ARM host."""
    url = hook_for(CUSTOM, monkeypatch).studio_job_url("job-1")
    assert "_emulator" not in url
    assert url == ""


def test_a_custom_cloud_with_a_studio_url_links_there(monkeypatch: pytest.MonkeyPatch) -> None:
    url = hook_for({**CUSTOM, "studio_url": "https://studio.private.example/"}, monkeypatch).studio_job_url("j")
    assert url == f"https://studio.private.example/runs/j?wsid={WSID}&tid=tid"


def test_the_emulator_says_it_is_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator's own connection carries its marker; only then is the link the emulator's job page."""
    from airflow_azureml.emulator.server import Emulator

    fake = Emulator.__new__(Emulator)  # connection_info reads only attributes; no server is started
    for name, value in {
        "subscription_id": "sub",
        "resource_group": "rg",
        "workspace_name": "ws",
        "tenant_id": "tid",
        "base_url": "https://127.0.0.1:9",
        "ca_cert": None,
        "ml_audience": "https://ml.azure.com",
        "client_id": "id",
        "client_secret": "pw",
        "control_token": "ctl",
        "workspace": SimpleNamespace(blobs=SimpleNamespace(tls_url="https://127.0.0.1:10")),
    }.items():
        setattr(fake, name, value)
    conn_extra = json.loads(fake.connection_info()["airflow_conn_json"])["extra"]
    url = hook_for(conn_extra, monkeypatch).studio_job_url("job-1")
    assert url == "https://127.0.0.1:9/_emulator/studio/jobs/job-1"


@pytest.mark.parametrize(
    ("chain", "current", "previous"),
    [
        (None, "", ""),  # nothing submitted yet
        (["u1"], "u1", ""),  # one job: no previous job
        (["u1", "u2"], "u2", "u1"),
        (["u1", "u2", "u3"], "u3", "u2"),
    ],
)
def test_the_links_show_the_current_job_and_the_one_before_it(
    chain: list[str] | None, current: str, previous: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_azureml.links import studio

    stored = {studio.XCOM_KEY: chain[-1] if chain else None, studio.CHAIN_XCOM_KEY: chain}
    monkeypatch.setattr(studio.XCom, "get_value", lambda key, ti_key: stored[key])
    assert studio.AzureMLStudioJobLink().get_link(None, ti_key=None) == current
    assert studio.AzureMLStudioPreviousJobLink().get_link(None, ti_key=None) == previous
