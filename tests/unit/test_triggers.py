"""Trigger serialisation: a round trip, and no secret ever in the trigger row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_azureml.polling import PollingPolicy
from airflow_azureml.triggers.base import AzureMLBaseTrigger
from airflow_azureml.triggers.job import AzureMLJobTrigger

ALL_TRIGGERS = [
    AzureMLJobTrigger(job_name="job-1", azure_ml_conn_id="my_conn", polling={"interval": 5, "max_queue_time": 60}),
]


@pytest.mark.parametrize("trigger", ALL_TRIGGERS, ids=lambda t: type(t).__name__)
def test_round_trip(trigger: AzureMLBaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    clone = cls(**json.loads(json.dumps(kwargs)))
    assert clone.serialize() == (classpath, kwargs)
    assert clone.policy == trigger.policy


@pytest.mark.parametrize("trigger", ALL_TRIGGERS, ids=lambda t: type(t).__name__)
def test_only_declared_safe_fields_are_serialised(trigger: AzureMLBaseTrigger, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "super-secret-value-123"
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_CONN",
        json.dumps({"conn_type": "azure_ml", "login": "app", "password": secret, "extra": {"tenant_id": "t"}}),
    )
    _, kwargs = trigger.serialize()
    assert set(kwargs) == {"azure_ml_conn_id", "polling", *type(trigger).serialized_fields}
    text = json.dumps(kwargs)
    assert secret not in text and "Bearer" not in text and "password" not in text


def test_found_ending_is_serialised_only_when_set() -> None:
    """A try that found its job being cancelled says so to its resumed self; a trigger without it serialises
    as before, so a triggerer of an earlier version still builds it during a rolling upgrade."""
    plain = AzureMLJobTrigger(job_name="job-1", azure_ml_conn_id="c")
    assert "found_ending" not in plain.serialize()[1]
    found = AzureMLJobTrigger(job_name="job-1", azure_ml_conn_id="c", found_ending="unknown")
    _, kwargs = found.serialize()
    assert kwargs["found_ending"] == "unknown"
    assert AzureMLJobTrigger(**json.loads(json.dumps(kwargs))).found_ending == "unknown"
    assert AzureMLJobTrigger(job_name="j", azure_ml_conn_id="c", found_ending="bogus").found_ending is None


def test_a_trigger_that_declares_a_secret_field_is_refused() -> None:
    class Leaky(AzureMLBaseTrigger):
        serialized_fields = ("client_secret",)
        client_secret = "x"

        async def run(self):  # pragma: no cover - never run
            yield None

    with pytest.raises(TypeError, match="must not serialise"):
        Leaky(azure_ml_conn_id="c", polling=PollingPolicy()).serialize()


# ------------------------------------------------ the poller's logic, with a fake REST client at the edge
class FakeClient:
    """The AsyncRestClient surface the poller uses, over an in-memory workspace (newest job first)."""

    def __init__(self, jobs: list[dict], page_size: int = 100) -> None:
        from types import SimpleNamespace

        self.jobs = jobs
        self.page_size = page_size
        self.list_pages = 0
        self.gets: list[str] = []
        self.broken: dict[str, Exception] = {}
        self.token_failures = 0
        self.paths = SimpleNamespace(compute=lambda name: ("fake", name))

    def _token(self) -> None:
        from airflow_azureml.hooks.rest import TokenUnavailable

        if self.token_failures:
            self.token_failures -= 1
            raise TokenUnavailable("could not get a token: ClientAuthenticationError: 503 from the token endpoint")

    async def list_job_pages(self, params: dict):
        self._token()
        for start in range(0, len(self.jobs), self.page_size):
            self.list_pages += 1
            yield self.jobs[start : start + self.page_size]

    async def get_job(self, name: str) -> dict:
        from airflow_azureml.hooks.rest import ResourceNotFound

        self._token()
        self.gets.append(name)
        if name in self.broken:
            raise self.broken[name]
        for job in self.jobs:
            if job["name"] == name:
                return job
        raise ResourceNotFound(name)

    def details_wanted(self, arm: dict) -> bool:
        from airflow_azureml.hooks.rest import needs_details

        return needs_details(arm)

    async def complete_snapshot(self, arm: dict):
        from airflow_azureml.outcomes import JobSnapshot

        return JobSnapshot.from_rest(arm)

    async def get_compute(self, name: str) -> dict:
        return {
            "properties": {"properties": {"vmPriority": "LowPriority", "nodeStateCounts": {"preemptedNodeCount": 0}}}
        }

    async def close(self) -> None:
        pass


def arm_job(name: str, status: str = "Completed") -> dict:
    return {"name": name, "properties": {"status": status, "computeId": "/x/computes/c"}}


def run_waits(client: FakeClient, names: list[str], **kwargs) -> list[dict]:
    import asyncio

    from airflow_azureml.triggers.poller import WorkspacePoller

    policy = PollingPolicy(interval=0.01, max_interval=0.02, jitter=0)

    async def main() -> list[dict]:
        poller = WorkspacePoller("fake-conn")
        poller._client = client  # type: ignore[assignment]
        return await asyncio.wait_for(asyncio.gather(*(poller.wait(n, policy, **kwargs) for n in names)), timeout=60)

    return asyncio.run(main())


def test_pages_per_tick_are_capped_and_old_jobs_are_read_by_get() -> None:
    import math

    history = [arm_job(f"done-{i}") for i in range(2000)]  # newer than every waited job
    old = [arm_job(f"old-{i}", "Completed") for i in range(5)]
    client = FakeClient([*history, *old], page_size=100)
    events = run_waits(client, [j["name"] for j in old])
    assert {e["status"] for e in events} == {"terminal"}
    assert client.list_pages <= math.ceil(5 / 100) + 1  # not the 21 pages of the whole history
    assert sorted(client.gets) == sorted(j["name"] for j in old)


def test_a_malformed_job_fails_only_its_own_wait() -> None:
    from airflow_azureml.hooks.rest import MalformedResponse

    jobs = [arm_job(f"j{i}") for i in range(3)]
    client = FakeClient([], page_size=100)
    client.jobs = jobs
    client.broken["j1"] = MalformedResponse("GET job j1: the answer is not a job document")
    events = {e["job_name"]: e for e in run_waits(client, ["j0", "j1", "j2"])}
    assert events["j1"]["status"] == "error" and "not a job document" in events["j1"]["message"]
    assert events["j0"]["status"] == events["j2"]["status"] == "terminal"


def test_a_token_failure_is_transient_for_the_waits() -> None:
    client = FakeClient([arm_job("a"), arm_job("b")])
    client.token_failures = 3
    events = run_waits(client, ["a", "b"])
    assert [e["status"] for e in events] == ["terminal", "terminal"]


def test_a_wait_for_creation_survives_not_found() -> None:
    import asyncio

    from airflow_azureml.triggers.poller import WorkspacePoller

    client = FakeClient([])
    policy = PollingPolicy(interval=0.01, max_interval=0.02, jitter=0)

    async def main() -> dict:
        poller = WorkspacePoller("fake-conn-2")
        poller._client = client  # type: ignore[assignment]
        wait = asyncio.create_task(poller.wait("later", policy, wait_for_creation=True))
        while len(client.gets) < 3:
            await asyncio.sleep(0.005)
        client.jobs.append(arm_job("later"))
        return await asyncio.wait_for(wait, 60)

    event = asyncio.run(main())
    assert event["status"] == "terminal"


def test_claims_challenge_is_decoded() -> None:
    import base64

    from airflow_azureml.hooks.rest import claims_challenge

    claims = '{"access_token":{"nbf":{"essential":true,"value":"1726077595"}}}'
    encoded = base64.b64encode(claims.encode()).decode().rstrip("=")
    header = f'Bearer authorization_uri="https://login", error="insufficient_claims", claims="{encoded}"'
    assert claims_challenge(header) == claims
    assert claims_challenge('Bearer authorization_uri="https://login", error="invalid_token"') is None
    assert claims_challenge(None) is None


def test_malformed_bodies_are_errors_not_unknown_jobs() -> None:
    from airflow_azureml.hooks.rest import MalformedResponse, _result, job_document

    class Response:
        status_code = 200
        headers: dict = {}

        def __init__(self, text: str) -> None:
            self._text = text

        def text(self) -> str:
            return self._text

    with pytest.raises(MalformedResponse):
        _result(Response("<html>gateway</html>"), "GET job j")
    for doc in ({}, {"name": "j"}, {"name": "j", "properties": {}}, ["x"], {"name": "j", "properties": {"status": 3}}):
        with pytest.raises(MalformedResponse):
            job_document(doc, "GET job j")
    assert job_document(arm_job("j"), "GET job j")["name"] == "j"


def test_the_trigger_row_carries_wait_for_creation() -> None:
    _, kwargs = AzureMLJobTrigger(job_name="j", azure_ml_conn_id="c", wait_for_creation=True).serialize()
    assert kwargs["wait_for_creation"] is True
    assert AzureMLJobTrigger(**kwargs).wait_for_creation is True


# --- a bad body on one job, and empty LIST pages (found by review) ------------------------------
class _EdgeClient:
    """The REST client at the poller's edge: one job answers a body of an unexpected shape."""

    class paths:
        @staticmethod
        def compute(name: str) -> str:
            return "/computes/" + name

    def __init__(self, *, empty_pages: int = 0, history: int = 0) -> None:
        import time as _time

        self.started = _time.monotonic()
        self.empty_pages = empty_pages
        self.history = history
        self.pages_read = 0
        self._history_failed_at = None

    def details_wanted(self, arm: dict) -> bool:
        from airflow_azureml.hooks.rest import AsyncRestClient

        return AsyncRestClient.details_wanted(self, arm)  # type: ignore[arg-type]

    async def list_job_pages(self, query: dict):  # type: ignore[no-untyped-def]
        for _ in range(self.empty_pages):
            self.pages_read += 1
            yield []
        for start in range(0, self.history, 100):
            self.pages_read += 1
            yield [{"name": f"old-{i}", "properties": {"status": "Completed"}} for i in range(start, start + 100)]

    async def get_job(self, name: str) -> dict:
        import time as _time

        if name == "bad":
            return {"name": "bad", "properties": {"status": "Failed", "tags": ["not", "a", "map"]}}
        done = _time.monotonic() - self.started > 0.3
        return {"name": name, "properties": {"status": "Completed" if done else "Running"}}

    async def complete_snapshot(self, arm: dict):  # type: ignore[no-untyped-def]
        from airflow_azureml.hooks.rest import AsyncRestClient

        return await AsyncRestClient.complete_snapshot(self, arm)  # type: ignore[arg-type]

    async def get_run_details(self, name: str) -> list:
        return []  # a JSON list where a document was expected

    async def get_compute(self, name: str) -> dict:
        return {}

    async def close(self) -> None:
        pass


def _run_waits(client: _EdgeClient, names: list[str]) -> tuple[list[dict], Any]:
    import asyncio

    from airflow_azureml.polling import PollingPolicy
    from airflow_azureml.triggers.poller import WorkspacePoller

    async def main() -> tuple[list[dict], Any]:
        poller = WorkspacePoller.for_connection("edge")

        async def get_client() -> _EdgeClient:
            return client

        poller._get_client = get_client  # type: ignore[method-assign]
        policy = PollingPolicy(interval=0.05, max_interval=0.1, jitter=0, max_transient_errors=5)
        return list(await asyncio.gather(*(poller.wait(n, policy) for n in names))), poller.stats

    return asyncio.run(main())


def test_an_unexpected_body_on_one_job_fails_only_that_wait() -> None:
    names = ["bad", "a", "b", "c", "d"]
    results = dict(zip(names, _run_waits(_EdgeClient(), names)[0], strict=True))
    assert results["bad"]["status"] == "error"
    assert "unexpected response shape" in results["bad"]["message"]
    assert {n: results[n]["status"] for n in "abcd"} == dict.fromkeys("abcd", "terminal")


def test_empty_list_pages_cannot_stretch_the_page_cap() -> None:
    client = _EdgeClient(empty_pages=30, history=3000)
    names = [f"w{i}" for i in range(20)]
    results, stats = _run_waits(client, names)
    assert all(r["status"] == "terminal" for r in results)
    assert stats.list_ticks >= 1
    assert stats.max_pages_per_tick <= 2  # ceil(20 / 100) + 1, whatever the pages hold


def test_a_connection_the_triggerer_cannot_find_fails_the_waits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a transient error: retried with back-off (0.5 s to 64 s, 30 times) it hung the task."""
    import asyncio

    try:
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:  # Airflow 3.1 has it in airflow.exceptions only
        from airflow.exceptions import AirflowNotFoundException

    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.triggers.poller import WorkspacePoller

    lookups: list[str] = []

    async def missing(self: AzureMLHook, conn_id: str) -> None:
        lookups.append(conn_id)
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    monkeypatch.setattr(AzureMLHook, "aget_connection", missing)
    policy = PollingPolicy(interval=0.01, max_interval=0.02, jitter=0)

    async def main() -> list[dict]:
        poller = WorkspacePoller("azure_ml_in_the_db")
        return await asyncio.wait_for(asyncio.gather(*(poller.wait(n, policy) for n in ("a", "b"))), timeout=30)

    events = asyncio.run(main())
    assert [e["status"] for e in events] == ["config_error", "config_error"]
    assert lookups == ["azure_ml_in_the_db"]  # one look, no retries
    message = events[0]["message"]
    assert "'azure_ml_in_the_db' is not defined" in message and "AIRFLOW_CONN_AZURE_ML_IN_THE_DB" in message


def test_a_config_error_event_fails_the_task_without_retries() -> None:
    from airflow_azureml.exceptions import AzureMLConfigError
    from airflow_azureml.sensors.job import AzureMLJobSensor

    sensor = AzureMLJobSensor(task_id="wait", job_name="a")
    with pytest.raises(AzureMLConfigError, match="is not defined"):
        sensor.execute_complete({}, {"status": "config_error", "job_name": "a", "message": "x is not defined"})
