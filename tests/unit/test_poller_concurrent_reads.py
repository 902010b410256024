"""A poller tick reads its jobs concurrently (mapped partitions end on the same tick), and the reads share one
token refresh and one look-up of run history's host, including when that refresh or look-up fails."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.hooks import rest
from airflow_azureml.hooks.connection import parse_connection
from airflow_azureml.hooks.rest import AsyncRestClient, TokenUnavailable
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.triggers import poller as poller_module
from airflow_azureml.triggers.poller import WorkspacePoller

BASE = {"subscription_id": "sub", "resource_group": "rg", "workspace_name": "ws"}
SETTINGS = parse_connection(SimpleNamespace(conn_id="c", extra_dejson=BASE, login=None, password=None))
ENDED = 6  # jobs seen ended on one tick


class SlowRunHistory:
    """ARM answers at once; run history answers a details GET only once ``ENDED`` of them are in flight, so a
    tick that reads them one after another never gets its first answer."""

    def __init__(self, token_failure: str | None = None) -> None:
        self.sent: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.all_asked = asyncio.Event()
        self.token_failure = token_failure

    async def answer(self, what: str) -> Any:
        self.sent.append(what)
        if what == "GET workspace":
            await asyncio.sleep(0.01)
            return {"properties": {"discoveryUrl": "https://discovery.example/"}}
        if what == "GET discovery":
            return {"api": "https://history.example"}
        if what.startswith("GET job "):
            name = what.removeprefix("GET job ")
            if name == self.token_failure:
                raise TokenUnavailable("could not get a token")
            return {"name": name, "properties": {"status": "Failed", "computeId": "spot"}}
        if what.startswith("GET run details "):
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if self.in_flight >= ENDED:
                self.all_asked.set()
            await asyncio.wait_for(self.all_asked.wait(), timeout=5)
            self.in_flight -= 1
            return {"error": {"error": {"message": "boom"}}}
        raise AssertionError(f"unexpected request {what}")


def client_of(server: SlowRunHistory) -> AsyncRestClient:
    client = AsyncRestClient(SETTINGS, credential=None)  # type: ignore[arg-type]

    async def request(method: str, url: str, *, params: Any = None, what: str = "") -> Any:
        return await server.answer(what)

    client.request = request  # type: ignore[method-assign]
    return client


def poller_with(client: AsyncRestClient) -> WorkspacePoller:
    poller = WorkspacePoller("c")
    poller._client = client
    return poller


def test_jobs_ended_on_one_tick_have_their_details_read_concurrently() -> None:
    server = SlowRunHistory()
    poller = poller_with(client_of(server))
    names = {f"part-{i}" for i in range(ENDED)}

    results = asyncio.run(poller._poll(names, list_mode=False))

    assert set(results) == names
    assert all(isinstance(r, JobSnapshot) and r.status == "Failed" for r in results.values()), results
    assert server.most_in_flight == ENDED <= poller_module.CONCURRENT_READS
    assert server.sent.count("GET workspace") == 1, server.sent  # one look-up of run history's host for all
    assert poller.stats.job_gets == ENDED and poller.stats.detail_gets == ENDED


def test_a_read_without_a_token_fails_the_tick_after_the_others_finish() -> None:
    server = SlowRunHistory(token_failure="part-0")
    server.all_asked.set()  # run history answers at once
    poller = poller_with(client_of(server))

    with pytest.raises(TokenUnavailable):
        asyncio.run(poller._poll({"part-0", "part-1"}, list_mode=False))
    assert "GET run details part-1" in server.sent and server.in_flight == 0  # no read left running


class CountingCredential:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    async def get_token(self, *scopes: str, **kwargs: Any) -> SimpleNamespace:
        self.calls += 1
        await asyncio.sleep(0.02)
        if self.fail:
            raise RuntimeError("no identity here")
        return SimpleNamespace(token="t", expires_on=time.time() + 3600)

    async def close(self) -> None:
        return None


def test_concurrent_reads_share_one_token_refresh() -> None:
    credential = CountingCredential()
    client = AsyncRestClient(SETTINGS, credential=credential)  # type: ignore[arg-type]

    async def many() -> list[str]:
        return list(await asyncio.gather(*(client._auth() for _ in range(8))))

    assert asyncio.run(many()) == ["t"] * 8
    assert credential.calls == 1


def test_a_failed_refresh_fails_the_reads_waiting_on_it_without_asking_again() -> None:
    credential = CountingCredential(fail=True)
    client = AsyncRestClient(SETTINGS, credential=credential)  # type: ignore[arg-type]

    async def many() -> list[Any]:
        return list(await asyncio.gather(*(client._auth() for _ in range(8)), return_exceptions=True))

    outcomes = asyncio.run(many())
    assert all(isinstance(o, TokenUnavailable) for o in outcomes), outcomes
    assert credential.calls == 1
    assert "no identity here" in str(outcomes[0])


def test_a_failed_look_up_of_run_history_is_not_repeated_by_the_reads_waiting_on_it() -> None:
    sent: list[str] = []
    client = AsyncRestClient(SETTINGS, credential=None)  # type: ignore[arg-type]

    async def request(method: str, url: str, *, params: Any = None, what: str = "") -> Any:
        sent.append(what)
        await asyncio.sleep(0.02)
        raise rest.AzureMLError("GET workspace: HTTP 403")

    client.request = request  # type: ignore[method-assign]

    async def many() -> list[Any]:
        return list(await asyncio.gather(*(client.history_base() for _ in range(8)), return_exceptions=True))

    outcomes = asyncio.run(many())
    assert all(isinstance(o, rest.AzureMLError) for o in outcomes), outcomes
    assert sent == ["GET workspace"]
