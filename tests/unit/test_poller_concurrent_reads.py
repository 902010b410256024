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


def test_a_read_without_a_token_fails_the_tick_and_the_reads_not_yet_started_are_skipped() -> None:
    server = SlowRunHistory(token_failure="part-00")
    server.all_asked.set()  # run history answers at once
    poller = poller_with(client_of(server))
    names = {f"part-{i:02d}" for i in range(3 * poller_module.CONCURRENT_READS)}

    with pytest.raises(TokenUnavailable, match="could not get a token"):
        asyncio.run(poller._poll(names, list_mode=False))
    job_gets = [what for what in server.sent if what.startswith("GET job ")]
    assert "GET job part-00" in job_gets
    assert len(job_gets) <= poller_module.CONCURRENT_READS, job_gets  # the first group only, not one try per job


class CountingCredential:
    def __init__(self, fail: bool = False, token: str = "t") -> None:
        self.calls = 0
        self.fail = fail
        self.token = token

    async def get_token(self, *scopes: str, **kwargs: Any) -> SimpleNamespace:
        self.calls += 1
        await asyncio.sleep(0.02)
        if self.fail:
            raise RuntimeError("no identity here")
        return SimpleNamespace(token=self.token, expires_on=time.time() + 3600)

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
    assert sent == ["GET workspace"]
    # every read gets the look-up's own error: a 403 is not turned into a transient error for those who waited
    assert all(type(o) is rest.AzureMLError and "403" in str(o) for o in outcomes), outcomes


def test_reads_refused_with_the_same_token_share_one_renewal() -> None:
    """ARM answers 401 to several reads in flight: one renewal (a rebuilt credential) serves them all."""
    built: list[CountingCredential] = []

    async def factory() -> CountingCredential:
        built.append(CountingCredential(token=f"t{len(built) + 1}"))
        return built[-1]

    client = AsyncRestClient(SETTINGS, credential=CountingCredential(token="t0"), credential_factory=factory)  # type: ignore[arg-type]

    async def refused_together() -> list[str]:
        first = await client._auth()
        return list(await asyncio.gather(*(client._auth(renew=True, rejected=first) for _ in range(8))))

    assert asyncio.run(refused_together()) == ["t1"] * 8
    assert len(built) == 1


class Answer:
    def __init__(self, status_code: int, body: str = "") -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.body = body

    def text(self) -> str:
        return self.body


def test_requests_refused_together_renew_once_through_request() -> None:
    """The same through ``request``: the refused token goes with each renewal, so the reads that waited take
    the token the first renewal got."""
    built: list[CountingCredential] = []
    sent: list[str] = []

    async def factory() -> CountingCredential:
        built.append(CountingCredential(token=f"t{len(built) + 1}"))
        return built[-1]

    async def send_request(request: Any) -> Answer:
        sent.append(request.headers["Authorization"])
        await asyncio.sleep(0.01)  # all eight in flight before the first answer
        return Answer(401) if request.headers["Authorization"] == "Bearer t0" else Answer(200, '{"ok": 1}')

    client = AsyncRestClient(SETTINGS, credential=CountingCredential(token="t0"), credential_factory=factory)  # type: ignore[arg-type]
    client._client = SimpleNamespace(send_request=send_request)  # type: ignore[assignment]

    async def many() -> list[Any]:
        return list(await asyncio.gather(*(client.request("GET", "https://arm.example/x") for _ in range(8))))

    assert asyncio.run(many()) == [{"ok": 1}] * 8
    assert len(built) == 1, "one renewal for the eight refused reads"
    assert sent.count("Bearer t0") == 8 and sent.count("Bearer t1") == 8


def test_a_claims_challenge_is_answered_with_its_claims() -> None:
    """Another read's new token is not taken for a claims challenge: that token may lack the claims asked for."""
    credential = CountingCredential(token="t0")
    client = AsyncRestClient(SETTINGS, credential=credential)  # type: ignore[arg-type]

    async def challenged() -> str:
        first = await client._auth()
        client._token = SimpleNamespace(token="t-other", expires_on=time.time() + 3600)  # another read renewed
        return await client._auth(renew=True, claims='{"access_token":{}}', rejected=first)

    asyncio.run(challenged())
    assert credential.calls == 2  # asked again, with the claims


def test_an_error_that_cannot_be_copied_reaches_the_waiting_reads_by_its_text() -> None:
    class Odd(Exception):
        def __init__(self, code: int, text: str) -> None:
            super().__init__(f"{code}: {text}")

    again = rest._again(Odd(7, "odd"), rest.TransientRestError)
    assert isinstance(again, rest.TransientRestError) and "7: odd" in str(again)


def test_a_renewal_after_a_failed_refresh_asks_again_rather_than_crash() -> None:
    """A read refused with a token that another read's failed refresh has since dropped: no token to compare."""
    credential = CountingCredential(token="t1")
    client = AsyncRestClient(SETTINGS, credential=credential)  # type: ignore[arg-type]
    client._token, client._rebuild = None, True  # another read's refresh failed (``_token_failed``)
    assert asyncio.run(client._auth(renew=True, rejected="t0")) == "t1"
