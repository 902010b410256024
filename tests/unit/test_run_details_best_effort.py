"""Run history's details of a completed job only refine its bill: reading them never fails, stalls or
multiplies the reads of its wait. A failed or cancelled job's details may hold its verdict's evidence, so
those are still read (and their failures still raised)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.hooks import rest
from airflow_azureml.hooks.connection import parse_connection
from airflow_azureml.hooks.rest import AsyncRestClient, RestClient

BASE = {"subscription_id": "sub", "resource_group": "rg", "workspace_name": "ws"}
SETTINGS = parse_connection(SimpleNamespace(conn_id="c", extra_dejson=BASE, login=None, password=None))


def job(name: str, status: str) -> dict[str, Any]:
    return {"name": name, "properties": {"status": status}}


class NoWorkspaceRead:
    """The requests a client sends, with the workspace GET refused (an identity without workspace read)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def answer(self, url: str, what: str) -> Any:
        self.sent.append(what)
        if what == "GET workspace":
            raise rest.AzureMLError("GET workspace: HTTP 403")
        if what.startswith("GET job "):
            name = what.removeprefix("GET job ")
            return job(name, "Failed" if name.startswith("failed") else "Completed")
        raise AssertionError(f"unexpected request {what}")


def sync_client(server: NoWorkspaceRead) -> RestClient:
    client = RestClient(SETTINGS, credential=None)
    client.request = lambda method, url, *, params=None, what="": server.answer(url, what)  # type: ignore[method-assign]
    return client


def async_client(server: NoWorkspaceRead) -> AsyncRestClient:
    client = AsyncRestClient(SETTINGS, credential=None)  # type: ignore[arg-type]

    async def request(method: str, url: str, *, params: Any = None, what: str = "") -> Any:
        return server.answer(url, what)

    client.request = request  # type: ignore[method-assign]
    return client


def test_completed_jobs_skip_their_details_while_run_history_cannot_be_found() -> None:
    server = NoWorkspaceRead()
    client = sync_client(server)
    for name in ("done-1", "done-2", "done-3"):
        snapshot = client.snapshot(name)
        assert snapshot.status == "Completed" and snapshot.started_at is None
    assert server.sent.count("GET workspace") == 1, server.sent  # not one look-up per completed job
    with pytest.raises(rest.AzureMLError, match="403"):  # a failed job's details may be its verdict's evidence
        client.snapshot("failed-1")
    assert server.sent.count("GET workspace") == 2


def test_the_async_client_skips_them_too() -> None:
    server = NoWorkspaceRead()
    client = async_client(server)

    async def read_all() -> list[str]:
        return [(await client.snapshot(name)).status for name in ("done-1", "done-2", "done-3")]

    assert asyncio.run(read_all()) == ["Completed"] * 3
    assert server.sent.count("GET workspace") == 1, server.sent
    assert client.details_wanted(job("failed-2", "Failed")) and not client.details_wanted(job("done-4", "Completed"))


def test_the_look_up_is_tried_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    server = NoWorkspaceRead()
    client = sync_client(server)
    client.snapshot("done-1")
    now = rest.time.monotonic()
    monkeypatch.setattr(rest.time, "monotonic", lambda: now + rest.HISTORY_RETRY + 1)
    client.snapshot("done-2")
    assert server.sent.count("GET workspace") == 2


def test_both_transports_give_up_on_a_silent_answer() -> None:
    """azure-core waits 300 s for an answer by default; a silent run-history host would hold a wait that long."""
    sync = RestClient(SETTINGS, credential=None)
    asynchronous = AsyncRestClient(SETTINGS, credential=None)  # type: ignore[arg-type]
    for client in (sync, asynchronous):
        config = client._client._pipeline._transport.connection_config  # type: ignore[attr-defined]
        assert config.read_timeout == rest.READ_TIMEOUT <= 60
